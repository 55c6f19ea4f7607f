"""The console reaches Slurm through slurmrestd with JWTs it signs itself (clusters/slurm/rest.py), on a
real local cluster and on a gce one booted by the fake Compute API (the same tests): the sync starts no
Slurm program, a token with another key or past its expiry is refused, a batch script's directives
reach Slurm, and cancels, drains and holds go through slurmrestd and the cluster agent. Persona: sam,
who runs the cluster "rest"."""

import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from clusters import processes, services, tls
from clusters.backends import get_backend
from clusters.models import SlurmSync
from clusters.slurm.rest import SlurmEndpoint, SlurmRest, mint_token
from clusters.work import BackendError
from console.errors import Unavailable

from .conftest import BACKENDS, api_client_for, module_cluster, wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request, django_db_setup, django_db_blocker, slurm):
    with module_cluster(
        django_db_blocker, username="sam", project_slug="slab", cluster_name="rest", request=request
    ) as found:
        yield found


def backend_of(cluster):
    return get_backend(cluster.backend)


def write(cluster, path, text):
    """A file in the cluster's shared home, written as the console writes one: through the agent."""
    services.write_file(cluster, path, text)
    return f"{backend_of(cluster).shared_dir(cluster)}/{path}"


def read(cluster, path):
    return services.read_file(cluster, path).decode() if services.file_exists(cluster, path) else ""


def test_the_sync_reads_slurm_over_http_and_starts_no_slurm_program(cluster, monkeypatch):
    started = []
    real_run, real_popen = subprocess.run, subprocess.Popen

    def run(command, *args, **kwargs):
        started.append(command)
        return real_run(command, *args, **kwargs)

    def popen(command, *args, **kwargs):
        started.append(command)
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(subprocess, "Popen", popen)
    assert services.sync_cluster(cluster) == ""
    assert started == []
    assert sorted(cluster.compute_nodes().values_list("slurm_state", flat=True)) == ["idle", "idle"]
    assert SlurmSync.objects.get(pk=cluster.pk).error == ""


def test_a_token_signed_with_another_key_or_past_its_expiry_is_refused(cluster):
    endpoint = backend_of(cluster).slurm_endpoint(cluster)
    assert str(endpoint.jwt_key) not in repr(endpoint)  # the key never reaches a log line
    assert {n.name for n in SlurmRest(endpoint).nodes()} == {"cpu-0", "cpu-1"}
    stranger = SlurmRest(SlurmEndpoint(endpoint.url, b"not-the-cluster-key-0123456789ab", endpoint.ca))
    # slurmrestd 22.05 passes the token on and slurmctld refuses it: "Unspecified error", no nodes.
    status, body = stranger.request("GET", "/slurm/v0.0.38/nodes")
    assert status >= 400 and json.loads(body)["nodes"] == []
    with pytest.raises(BackendError, match="slurmrestd nodes failed"):
        stranger.nodes()

    expired = mint_token(endpoint.jwt_key, "root", lifespan=60, now=time.time() - 3600)
    request = urllib.request.Request(
        endpoint.url + "/slurm/v0.0.38/nodes", headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": expired}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10, context=tls.client_context(endpoint.ca))
    assert refused.value.code >= 400 and json.loads(refused.value.read())["nodes"] == []


def test_a_cancel_goes_through_slurmrestd(cluster):
    backend = backend_of(cluster)
    home = backend.shared_dir(cluster)
    write(cluster, "sleeper.sh", f"#!/bin/bash\n#SBATCH -N 1\n#SBATCH --output={home}/sleeper-%j.out\nsleep 300\n")
    job_id = backend.submit_batch(cluster, "sleeper.sh")

    def running():
        job = backend.job_status(cluster, job_id)
        return job is not None and job.state == "RUNNING"

    wait_until(running, message=f"job {job_id} to run")
    services.cancel_job(cluster, job_id)
    job = wait_until(lambda: backend.job_status(cluster, job_id), message="the job's state")
    assert job.state in ("CANCELLED", "COMPLETING")
    assert services.sync_cluster(cluster) == ""
    assert cluster.slurm_jobs.get(job_id=job_id).state in ("CANCELLED", "COMPLETING")


def test_a_batch_script_goes_in_the_request_and_its_directives_reach_slurm(cluster):
    backend = backend_of(cluster)
    home = backend.shared_dir(cluster)
    write(
        cluster,
        "batch/pinned.sbatch",
        "#!/bin/bash\n#SBATCH --job-name=pinned -N 1 --nodelist=cpu-1\n#SBATCH --time=7 --no-requeue\n"
        f"#SBATCH --output={home}/batch/pinned-%j.out\necho ran on $SLURMD_NODENAME in $PWD\n",
    )
    job_id = backend.submit_batch(cluster, "batch/pinned.sbatch")
    _status, raw = backend.slurm(cluster).request("GET", f"/slurm/v0.0.38/job/{job_id}")
    job = json.loads(raw)["jobs"][0]
    assert (job["name"], job["time_limit"], job["requeue"]) == ("pinned", 7, False)
    assert job["current_working_directory"] == f"{home}/batch"  # the script's folder, as sbatch would
    output = wait_until(lambda: read(cluster, f"batch/pinned-{job_id}.out"), message="the job's output")
    assert output == f"ran on cpu-1 in {home}/batch\n"


def test_a_directive_the_console_cannot_pass_on_submits_nothing(cluster):
    backend = backend_of(cluster)
    write(cluster, "mail.sbatch", "#!/bin/bash\n#SBATCH -N 1\n#SBATCH --mail-type=END\ntrue\n")
    before = {job.job_id for job in backend.jobs(cluster)}
    with pytest.raises(BackendError, match="line 3: #SBATCH --mail-type is not an option"):
        backend.submit_batch(cluster, "mail.sbatch")
    assert {job.job_id for job in backend.jobs(cluster)} == before


def test_drain_resume_holds_submits_and_cancels_start_no_program_in_the_console(cluster, monkeypatch):
    """Everything the console asks of Slurm goes over HTTP: slurmrestd or the cluster agent."""
    backend = backend_of(cluster)
    write(cluster, "nap.sbatch", "#!/bin/bash\n#SBATCH -N 1 --output=/dev/null\nsleep 30\n")
    started = []
    monkeypatch.setattr(subprocess, "run", lambda command, *a, **k: started.append(command))
    monkeypatch.setattr(subprocess, "Popen", lambda command, *a, **k: started.append(command))

    backend.drain(cluster, "cpu-1", "rest test")
    assert {n.name: n.display_state for n in backend.node_statuses(cluster)}["cpu-1"].endswith("drain")
    backend.resume(cluster, "cpu-1")
    backend.resume(cluster, "cpu-1")  # a node that is not drained: nothing to do
    assert "drain" not in {n.name: n.display_state for n in backend.node_statuses(cluster)}["cpu-1"]
    backend.hold(cluster, "tcc-rest-hold", ["cpu-0"])
    backend.hold(cluster, "tcc-rest-hold", ["cpu-1"])  # widens the hold
    assert backend.slurm(cluster).reservations()["tcc-rest-hold"] == "cpu-[0-1]"
    backend.release(cluster, "tcc-rest-hold")
    backend.release(cluster, "tcc-rest-hold")  # gone already: fine
    assert "tcc-rest-hold" not in backend.slurm(cluster).reservations()
    job_id = backend.submit_batch(cluster, "nap.sbatch")
    backend.cancel_job(cluster, job_id)
    assert started == []


class Squatter:
    """mallory's listener on a port the console uses: TLS with a certificate of her own making when the
    client starts a handshake, plain HTTP otherwise; it keeps every byte it is sent, then answers 200."""

    def __init__(self, port, folder):
        bundle = folder / "mallory.pem"
        bundle.write_bytes(tls.controller_bundle("mallory"))
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(bundle)
        self.listener = socket.create_server(("127.0.0.1", port))
        self.received = b""
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                connection.settimeout(5)
                if connection.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS ClientHello
                    connection = self.context.wrap_socket(connection, server_side=True)
                while b"\r\n\r\n" not in self.received and (chunk := connection.recv(65536)):
                    self.received += chunk
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            except (OSError, ssl.SSLError):
                pass
            finally:
                connection.close()

    def close(self):
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone leaves the port bound)
        self.listener.close()


def test_a_process_that_takes_the_agents_ports_while_it_is_down_is_sent_no_key(cluster, tmp_path):
    # The attack (local backend: members' jobs run on the console's host): mallory binds the agent's port
    # and the slurmrestd port while the agent restarts, and waits for the console's next call. In plain
    # HTTP she got the agent key (root on every node) and a JWT for root; now the console's handshake
    # finds a certificate its cluster's CA did not sign and sends nothing.
    if cluster.backend != "local":
        pytest.skip("local only: on gce the ports are on the controller VM (tests/test_gce_boot.py pins the CA)")
    from clusters.backends.local import daemons
    from clusters.backends.local.paths import paths_for
    from clusters.backends.local.ports import port_answers

    backend, paths, ports = backend_of(cluster), paths_for(cluster), cluster.backend_state["ports"]
    processes.stop(sorted(daemons.agent_processes(paths)))
    wait_until(lambda: not port_answers(ports["agent"]), timeout=15, message="the agent to let its port go")
    squatters = [Squatter(ports["agent"], tmp_path), Squatter(ports["slurmrestd"], tmp_path)]
    try:
        with pytest.raises(Unavailable, match="certificate the cluster's CA did not sign"):
            services.file_exists(cluster, "runs")
        with pytest.raises(BackendError, match="certificate the cluster's CA did not sign"):
            SlurmRest(backend.slurm_endpoint(cluster)).nodes()
        for squatter in squatters:
            assert squatter.received == b""  # not a header, not a byte of a request
    finally:
        for squatter in squatters:
            squatter.close()
        daemons.start_agent(cluster, paths)
    assert services.file_exists(cluster, "runs") in (True, False)
    assert {n.name for n in SlurmRest(backend.slurm_endpoint(cluster)).nodes()} == {"cpu-0", "cpu-1"}


def test_a_rotation_gives_the_controller_a_new_ca_while_it_serves_and_keeps_no_old_key(cluster, client, request):
    """Sam fears the controller's key leaked and rotates it (`manage.py rotate_tls`): the agent and slurmrestd's
    relay switch to a certificate of a new CA while the cluster runs, the console pins the new CA alone (the
    old one, which the leaked key would answer to, is refused at the handshake), the old key is kept nowhere
    (gce: every older version of the secret destroyed), and the cluster page says when the new one ends. The
    daily task leaves a certificate alone until it is within RENEW_DAYS of its end, then rotates it. The API
    says when it ends too."""
    import dataclasses
    import datetime
    import io

    from django.core.management import call_command
    from django.utils import timezone

    from clusters.agent.client import AgentClient
    from clusters.choices import OperationStatus
    from clusters.models import Cluster, Operation
    from clusters.operations import engine
    from clusters.services import certificates

    backend = backend_of(cluster)
    old = backend.tls_bundle(cluster)
    call_command("rotate_tls", f"slab/{cluster.name}", stdout=io.StringIO())
    operation = Operation.objects.filter(cluster=cluster, kind="ROTATE_TLS").latest("created")
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    cluster = Cluster.objects.get(pk=cluster.pk)
    new = backend.tls_bundle(cluster)
    assert len(tls.certificates_of(new)) == 2 and tls.ca_of(new) != tls.ca_of(old)  # the new CA alone
    assert old.split(b"-----END PRIVATE KEY-----")[0] not in new
    for endpoint, call in ((backend.agent_endpoint(cluster), lambda e: AgentClient(e, timeout=5).stat(".")),
                           (backend.slurm_endpoint(cluster), lambda e: SlurmRest(e).nodes())):  # fmt: skip
        with pytest.raises(BackendError, match="certificate the cluster's CA did not sign"):
            call(dataclasses.replace(endpoint, ca=tls.ca_of(old)))
        call(endpoint)  # pinned to the new CA
    assert {n.name for n in SlurmRest(backend.slurm_endpoint(cluster)).nodes()} == {"cpu-0", "cpu-1"}
    if cluster.backend == "gce":
        from clusters.backends.gce.names import names

        fake = request.getfixturevalue("booted_cloud")
        kept = fake.secret_versions[f"projects/tcc-test/secrets/{names('slab', cluster.name).secret('tls')}"]
        assert [v is None for v in kept] == [True] * (len(kept) - 1) + [False]  # older versions destroyed
    ends = certificates.expires(cluster)
    assert ends == tls.not_after(new) and ends - timezone.now() > datetime.timedelta(days=tls.VALID_DAYS - 1)
    client.force_login(cluster.project.members.get())
    page = client.get(f"/clusters/slab/{cluster.name}/").content.decode()
    assert 'id="certificate"' in page and f'valid until <time datetime="{ends.isoformat()}">' in page

    api = api_client_for(cluster.project.members.get())
    assert api.get(f"/api/v1/projects/slab/clusters/{cluster.name}/").json()["certificate_expires"] == ends.isoformat()

    assert certificates.rotate_due() == []  # half a year left
    later = ends - datetime.timedelta(days=tls.RENEW_DAYS - 1)
    [started] = certificates.rotate_due(now=later)
    engine.run(started)
    assert Operation.objects.get(pk=started).status == OperationStatus.SUCCEEDED
    assert tls.ca_of(backend.tls_bundle(Cluster.objects.get(pk=cluster.pk))) != tls.ca_of(new)
