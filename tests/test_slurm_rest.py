"""The console reaches Slurm through slurmrestd with JWTs it signs itself (clusters/slurm/rest.py), on a
real local cluster: the sync starts no Slurm program, a token with another key or past its expiry is
refused, and a cancel goes through slurmrestd. Persona: sam, who runs the cluster "rest"."""

import json
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from clusters import services
from clusters.backends import get_backend
from clusters.models import SlurmSync
from clusters.slurm.rest import SlurmEndpoint, SlurmRest, mint_token
from clusters.work import BackendError

from .conftest import module_cluster, wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker, slurm):
    with module_cluster(django_db_blocker, username="sam", project_slug="slab", cluster_name="rest") as found:
        yield found


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
    endpoint = get_backend("local").slurm_endpoint(cluster)
    assert str(endpoint.jwt_key) not in repr(endpoint)  # the key never reaches a log line
    assert {n.name for n in SlurmRest(endpoint).nodes()} == {"cpu-0", "cpu-1"}
    stranger = SlurmRest(SlurmEndpoint(endpoint.url, b"not-the-cluster-key-0123456789ab"))
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
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code >= 400 and json.loads(refused.value.read())["nodes"] == []


def test_a_cancel_goes_through_slurmrestd(cluster):
    backend = get_backend("local")
    home = backend.shared_dir(cluster)
    script = home / "sleeper.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -N 1\n#SBATCH --output={home}/sleeper-%j.out\nsleep 300\n")
    job_id = backend.submit_batch(cluster, script)

    def running():
        job = backend.job_status(cluster, job_id)
        return job is not None and job.state == "RUNNING"

    wait_until(running, message=f"job {job_id} to run")
    services.cancel_job(cluster, job_id)
    job = wait_until(lambda: backend.job_status(cluster, job_id), message="the job's state")
    assert job.state in ("CANCELLED", "COMPLETING")
    assert services.sync_cluster(cluster) == ""
    assert cluster.slurm_jobs.get(job_id=job_id).state in ("CANCELLED", "COMPLETING")
