"""gce clusters whose VMs boot (tests/fake_vms.py): the real startup script brings up munge, slurmctld,
slurmrestd and the cluster agent on the controller and configless slurmds on the workers, and the
console reaches them as it would a real VPC. What is gce's own: the keys in Secret Manager, resizes
that boot and delete VMs, a Spot VM the cloud takes back, a startup script that fails, and delete.
(The scans, repairs, recipes and slurmrestd tests that both backends share run on these VMs too:
tests/test_health.py, test_recipes.py, test_slurm_rest.py.) Persona: gail runs "glab/train"."""

import base64
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from clusters import services, tls
from clusters.agent.client import AgentClient, AgentEndpoint, AgentRefused
from clusters.backends import get_backend
from clusters.backends.gce.names import names
from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster, Operation
from clusters.operations import engine
from clusters.slurm.rest import SlurmEndpoint, SlurmRest
from clusters.work import TransientBackendError

from .conftest import api_client_for, gce_spec, module_cluster, submit_through_slurmrestd, wait_until
from .factories import exchange, leaks
from .gce_fixtures import run

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def cluster(request, django_db_setup, django_db_blocker, slurm):
    with module_cluster(
        django_db_blocker, username="gail", project_slug="glab", request=request, backend="gce"
    ) as found:
        yield found


@pytest.fixture
def fake(booted_cloud):
    return booted_cloud


def backend():
    return get_backend("gce")


def keys_of(fake, cluster):
    prefix = names(cluster.project.slug, cluster.name).prefix
    return {
        kind: base64.b64decode(fake.secret_versions[f"projects/tcc-test/secrets/{prefix}-{kind}-key"][-1]["data"])
        for kind in ("munge", "jwt", "agent", "tls")
    }


def test_the_console_reaches_the_controller_only_with_the_keys_in_secret_manager(cluster, fake):
    assert cluster.status == ClusterStatus.READY
    assert "the first health scan passed" in cluster.events.first().message
    keys = keys_of(fake, cluster)
    endpoint = backend().slurm_endpoint(cluster)
    address = cluster.backend_state["controller_ip"]
    assert endpoint.url == f"https://{address}:6820" and endpoint.jwt_key == keys["jwt"]
    assert endpoint.ca == tls.ca_of(keys["tls"])  # the cluster's own CA, from its bundle in Secret Manager
    assert {n.name: (n.state, n.cpus) for n in SlurmRest(endpoint).nodes()} == {
        "cpu-0": ("idle", 2),
        "cpu-1": ("idle", 2),
    }
    stranger = SlurmRest(SlurmEndpoint(endpoint.url, b"not-the-cluster-key-0123456789ab", endpoint.ca))
    status, body = stranger.request("GET", "/slurm/v0.0.38/nodes")
    assert status >= 400 and json.loads(body)["nodes"] == []
    with pytest.raises(AgentRefused) as refused:
        AgentClient(AgentEndpoint(f"https://{address}:6821", "00" * 32, endpoint.ca)).stat(".")
    assert refused.value.status == 401
    assert backend().agent(cluster).stat(".")["exists"]
    # slurm.conf names nodes in hostlists (cpu-[0-1]): the controller expanded them to wait until each
    # resolves, instead of waiting two minutes for an expression that never does.
    serial = fake.vpc.serial(names(cluster.project.slug, cluster.name).controller)
    assert "tcc-startup: done" in serial and "does not resolve yet" not in serial


def test_no_key_reaches_a_page_an_answer_or_a_log_line(cluster, fake, client, caplog):
    caplog.set_level("DEBUG")
    owner = cluster.project.members.get()
    forms = (("hex", bytes.hex), ("base64", lambda k: base64.b64encode(k).decode()))
    secrets = {
        f"{kind} ({form})": encode(key) for kind, key in keys_of(fake, cluster).items() for form, encode in forms
    }
    api = api_client_for(owner)
    texts = [
        exchange(api, "get", f"/api/v1/projects/glab/clusters/train/{path}")[1] for path in ("", "nodes/", "jobs/")
    ]
    call = {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/nodes"}
    texts.append(exchange(api, "post", "/v1beta1/projects/glab/locations/us-central1/modelDevelopmentClusters/"
                                       "train:callSlurmRestApi", data=call, format="json")[1])  # fmt: skip
    client.force_login(owner)
    texts += [exchange(client, "get", f"/clusters/glab/train/{path}")[1] for path in ("", "nodes/", "jobs/", "health/")]
    texts.append(str(cluster.backend_state) + str(list(Operation.objects.values())) + caplog.text)
    texts += [json.dumps(instance) for instance in fake.instances().values()]  # metadata included
    assert leaks(texts, secrets) == set()


def test_a_job_gets_no_token_from_its_nodes_metadata_server(cluster, fake, tmp_path):
    """The attack: gail's job asks its node's metadata server for the node's service-account token (with
    it, Secret Manager hands out the cluster's munge and JWT keys: root on the cluster). Before, the job got
    the token (HTTP 200); every node now refuses the metadata server to all uids but root, from before
    slurmd starts, while root (the startup script, reading the keys) still gets it."""
    import subprocess
    import uuid

    token = f"http://{fake.metadata_host}/computeMetadata/v1/instance/service-accounts/default/token"
    out = f"/tmp/tcc-metadata-{uuid.uuid4().hex[:8]}"  # /tmp is this machine's in the fake's VMs
    script = (f"#!/bin/bash\ncode=$(curl -s -m 5 -o /dev/null -w '%{{http_code}}' -H Metadata-Flavor:Google {token})\n"
              f"echo \"$code $(id -un)\" > {out}.new && mv {out}.new {out}\n")  # fmt: skip
    owner = cluster.project.members.get()
    url = "/v1beta1/projects/glab/locations/us-central1/modelDevelopmentClusters/train:callSlurmRestApi"
    # Its own output file: /tmp is this machine's, and an older run's slurm-<id>.out, another uid's, made the
    # job fail to open its output.
    submit_through_slurmrestd(api_client_for(owner), url, script, name="steal-token", nodes=1, tasks=1,
                              current_working_directory="/tmp", standard_output=f"{out}.log")  # fmt: skip
    try:
        wait_until(lambda: os.path.exists(out), timeout=60, message="the job's answer")
        code, user = Path(out).read_text().split()
    finally:
        for path in (out, f"{out}.log"):
            if os.path.exists(path):
                os.unlink(path)
    assert user != "root" and code == "000"  # refused before any HTTP answer
    worker = fake.vpc.vms[names("glab", "train").instance("cpu-0")]
    as_root = subprocess.run(["ip", "netns", "exec", worker.netns, "curl", "-sf", "-m", "5", "-H",
                              "Metadata-Flavor: Google", token], capture_output=True, text=True)  # fmt: skip
    assert "access_token" in as_root.stdout


def test_a_members_account_is_the_same_on_every_node(cluster, fake):
    """The agent makes a member's account on the controller; each VM keeps its own account database (as
    real VMs do), and a job of that account on a compute node ran as an unknown user before. Every node
    now takes the console's accounts, with the controller's uids and gids, before each job (its Prolog)
    and every few seconds."""
    owner = cluster.project.members.get()
    url = "/v1beta1/projects/glab/locations/us-central1/modelDevelopmentClusters/train:callSlurmRestApi"
    out = f"/tmp/tcc-whoami-{owner.pk}-{cluster.pk}"
    submit_through_slurmrestd(api_client_for(owner), url, f"#!/bin/bash\nid -un > {out}.new && mv {out}.new {out}\n",
                              name="whoami", nodes=1, tasks=1, current_working_directory="/tmp",
                              standard_output=f"{out}.log")  # fmt: skip
    try:
        wait_until(lambda: os.path.exists(out), timeout=60, message="the job's answer")
        account = Path(out).read_text().strip()
    finally:
        for path in (out, f"{out}.log"):
            if os.path.exists(path):
                os.unlink(path)
    assert account.startswith("tcct-gail")

    def entries(vm, table):
        lines = (fake.vpc.root / "vms" / vm / "etc" / table).read_text().splitlines()
        return {line.split(":")[0]: line.split(":")[2:4] for line in lines if line.startswith("tcct-")}

    prefix = names("glab", "train").prefix
    controller = entries(f"{prefix}-ctl", "passwd")
    assert account in controller
    for node in ("cpu-0", "cpu-1", "login-0"):
        wait_until(lambda node=node: entries(f"{prefix}-{node}", "passwd") == controller, timeout=10,
                   message=f"{node}'s accounts")  # fmt: skip
        assert entries(f"{prefix}-{node}", "group") == entries(f"{prefix}-ctl", "group")


def test_a_member_who_leaves_leaves_the_projects_group_on_every_node(cluster, fake, django_user_model):
    """The LEAVE operation runs on the controller's agent; the compute and login nodes follow the published
    accounts: the account's primary group becomes the `left` group there too, and its membership goes."""
    from clusters.accounts import account_for

    project = cluster.project
    django_user_model.objects.create_user("greta", "greta@example.com", "greta-password")
    services.members.set_role(project, "greta", "operator")
    greta = account_for(django_user_model.objects.get(username="greta"), project)
    get_backend(cluster.backend).ensure_account(cluster, greta)
    prefix = names("glab", "train").prefix

    def account(vm):
        lines = (fake.vpc.root / "vms" / vm / "etc" / "passwd").read_text().splitlines()
        gid = next((line.split(":")[3] for line in lines if line.startswith(f"{greta.name}:")), None)
        groups = (fake.vpc.root / "vms" / vm / "etc" / "group").read_text().splitlines()
        named = {line.split(":")[0]: line.split(":")[2] for line in groups}
        return gid, named.get(greta.group), named.get("tcct-left")

    wait_until(lambda: account(f"{prefix}-cpu-0")[0] == account(f"{prefix}-cpu-0")[1] is not None, timeout=15,
               message="greta's account on cpu-0")  # fmt: skip
    services.members.remove(project, "greta")
    engine.run(Operation.objects.get(cluster=cluster, kind="LEAVE").pk)
    for node in ("ctl", "cpu-0", "cpu-1", "login-0"):
        wait_until(lambda node=node: account(f"{prefix}-{node}")[0] == account(f"{prefix}-{node}")[2] is not None,
                   timeout=15, message=f"greta's account to leave the project's group on {node}")  # fmt: skip


def test_the_console_reaches_the_controller_through_the_firewall_rule_it_made_and_no_other_way(cluster, fake):
    """The fake VPC drops the console's connections that no firewall rule of the cluster's network admits, as
    Google's implied deny-ingress rule does: the console's rule (its ranges, the controller's tag, the two
    ports) is what opens the doors, and without it nothing answers."""
    named = names("glab", "train")
    rule = f"{fake.endpoint}/compute/v1/projects/tcc-test/global/firewalls/{named.firewall_console}"

    def send(method, url, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    saved = send("GET", rule)
    assert saved["sourceRanges"] == [f"{fake.vpc.subnet}.0/24"] and saved["allowed"][0]["ports"] == ["6820", "6821"]
    serving = send(
        "GET", rule.replace(names("glab", "train").firewall_console, names("glab", "train").firewall_serving)
    )
    assert serving["targetTags"] == [f"{names('glab', 'train').prefix}-compute"]  # the router to replicas' ports
    assert serving["allowed"] == [{"IPProtocol": "tcp", "ports": ["18000-18999"]}]
    endpoint = backend().agent_endpoint(cluster)
    send("DELETE", rule)
    try:
        with pytest.raises(TransientBackendError, match="not answering"):
            AgentClient(endpoint, timeout=3).stat(".")
    finally:
        send("POST", rule.rsplit("/", 1)[0], {k: v for k, v in saved.items() if k not in ("selfLink", "kind", "id")})
    assert AgentClient(endpoint, timeout=10).stat(".")["exists"]
    assert {n.name for n in SlurmRest(backend().slurm_endpoint(cluster)).nodes()} == {"cpu-0", "cpu-1"}


def test_the_console_reaches_the_controller_only_while_its_network_is_peered_with_the_clusters(cluster, fake):
    """The console's workers are in a network of their own (GCE_CONSOLE_NETWORK): the fake gives them a route
    to a cluster's new VPC only through an ACTIVE peering, which needs a peering on each side. The create
    made both; a network administrator removing the console's side leaves the cluster's INACTIVE and the
    controller out of reach, firewall rule or not; adding it back restores both."""
    from clusters.backends.gce.names import owner_and_name

    project, console = owner_and_name(fake.console_network, "tcc-test")
    network = f"{fake.endpoint}/compute/v1/projects/{project}/global/networks/{console}"
    named = names("glab", "train")
    cluster_net = fake.resources[f"/compute/v1/projects/tcc-test/global/networks/{named.network}"]

    def send(verb, body):
        request = urllib.request.Request(f"{network}/{verb}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(request, timeout=10).read()

    assert [(p["name"], p["state"]) for p in cluster_net["peerings"]] == [(named.console_peering, "ACTIVE")]
    endpoint = backend().agent_endpoint(cluster)
    send("removePeering", {"name": named.console_peering})
    try:
        assert [p["state"] for p in cluster_net["peerings"]] == ["INACTIVE"]
        with pytest.raises(TransientBackendError, match="not answering"):
            AgentClient(endpoint, timeout=3).stat(".")
    finally:
        peer = f"projects/tcc-test/global/networks/{named.network}"
        send("addPeering", {"networkPeering": {"name": named.console_peering, "network": peer}})
    assert [p["state"] for p in cluster_net["peerings"]] == ["ACTIVE"]
    assert AgentClient(endpoint, timeout=10).stat(".")["exists"]


def test_the_controllers_doors_listen_on_its_internal_address_only(cluster, fake):
    """slurmrestd and the agent answer on the controller's internal address (where the firewall admits the
    console's range alone), not on loopback or any other interface a container could reach."""
    import subprocess

    controller = fake.vpc.vms[names("glab", "train").controller]
    address = cluster.backend_state["controller_ip"]

    def answers(host, port):  # over TLS (-k: this checks where it listens; the console pins the CA)
        curl = ["curl", "-sk", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}", f"https://{host}:{port}/"]
        found = subprocess.run(["ip", "netns", "exec", controller.netns, *curl], capture_output=True, text=True)
        return found.stdout != "000"

    for port in (6820, 6821):
        assert answers(address, port) and not answers("127.0.0.1", port), port


def test_a_resize_boots_vms_that_join_configless_and_a_shrink_deletes_them(cluster, fake):
    """The new VM's metadata server is unavailable for its first requests, as the real one can be while a VM
    starts (a CI run failed a create on 'reading the instance name from the metadata server'): the startup
    script retries them."""
    prefix = names("glab", "train").prefix
    fake.metadata_outages[f"{prefix}-cpu-2"] = 3
    grown = run(services.update_cluster(cluster=cluster, spec=gce_spec(cpu=3)))
    assert grown.status == ClusterStatus.READY, grown.status_message
    assert fake.metadata_outages[f"{prefix}-cpu-2"] == 0  # the three 503s were answered
    assert f"{prefix}-cpu-2" in fake.vpc.vms
    assert {n.name: n.state for n in backend().node_statuses(grown)} == {
        "cpu-0": "idle",
        "cpu-1": "idle",
        "cpu-2": "idle",
    }
    assert backend().slurm(grown).reservations() == {}  # its first-scan hold ended with the scan
    shrunk = run(services.update_cluster(cluster=grown, spec=gce_spec(cpu=2)))
    assert sorted(n.name for n in backend().node_statuses(shrunk)) == ["cpu-0", "cpu-1"]
    assert f"{prefix}-cpu-2" not in fake.vpc.vms
    assert not [key for key in fake.instances() if key.endswith(f"{prefix}-cpu-2")]


def test_a_spot_vm_the_cloud_takes_back_is_repaired_on_a_new_vm(fake, alpha, alice, settings, slurm):
    from clusters.health import repair

    settings.AUTO_REPAIR = True
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    spec = gce_spec(cpu=2)
    spec["display_name"] = "spot"
    spec["node_pools"][1]["provisioning_model"] = "SPOT"
    spot = run(services.create_cluster(project=alpha, name="spot", spec=spec, user=alice))
    assert spot.status == ClusterStatus.READY, spot.status_message
    instance = f"{names('alpha', 'spot').prefix}-cpu-1"
    booted = fake.vpc.vms[instance]
    fake.take_back(instance)  # preempted: Compute powers it off and deletes it
    fix = wait_until(lambda: repair.watch(Cluster.objects.get(pk=spot.pk)), message="the repair to start")
    assert (fix.params["node"], fix.params["failure"], fix.params["action"]) == ("cpu-1", "unresponsive", "reboot")
    assert spot.events.filter(message__contains="the Spot VM was taken back").exists()
    run(fix)
    assert fake.vpc.vms[instance] is not booted  # a new VM from the pool's template
    assert {n.name: n.state for n in backend().node_statuses(spot)}["cpu-1"] == "idle"
    run(services.delete_cluster(cluster=Cluster.objects.get(pk=spot.pk)))


def test_a_pool_startup_script_that_fails_fails_the_create_with_its_line(fake, alpha, alice, slurm):
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    spec = gce_spec(cpu=1)
    spec["display_name"] = "broken"
    spec["node_pools"][0]["startup_script"] = "echo preparing the login node\nexit 3\n"
    operation = services.create_cluster(project=alpha, name="broken", spec=spec, user=alice)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert "login-0: startup script FAILED: the node pool's own startup_script" in operation.error
    broken = Cluster.objects.get(pk=operation.cluster_id)
    assert broken.events.filter(message__contains="FAILED: the node pool's own startup_script").exists()
    run(services.delete_cluster(cluster=broken))


def test_a_compute_node_whose_startup_fails_fails_the_create_at_once_naming_it(fake, alpha, alice, slurm, settings):
    """The A3 Ultra case: a GPU image without the driver fails every compute VM's startup. Slurm never hears
    of those nodes; the create reads their serial consoles and fails with the VM and its line instead of
    waiting out GCE_STARTUP_TIMEOUT (30 min by default) to say 'nodes did not become idle'."""
    import time

    settings.GCE_STARTUP_TIMEOUT = 300
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    spec = gce_spec(cpu=1)
    spec["display_name"] = "nodriver"
    spec["node_pools"][1]["startup_script"] = "echo 'nvidia-smi: command not found' >&2\nexit 127\n"
    started = time.monotonic()
    operation = services.create_cluster(project=alpha, name="nodriver", spec=spec, user=alice)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    prefix = names("alpha", "nodriver").prefix
    assert f"cpu-0: {prefix}-cpu-0: startup script FAILED: the node pool's own startup_script" in operation.error
    assert time.monotonic() - started < 120
    run(services.delete_cluster(cluster=Cluster.objects.get(pk=operation.cluster_id)))


def test_a_console_outside_google_cloud_runs_a_cluster_through_the_controllers_external_address(
    fake, alpha, alice, slurm, settings
):
    """GCE_CONTROLLER_ACCESS=external with no console network: before, the create was refused (no route to
    a new VPC). The controller gets an external address (the fake's one-to-one NAT), the console keeps it
    and runs the whole create through it (slurmrestd and the agent, on the cluster's CA); the internal
    address stays out of its reach, as there is no peering. Secret Manager answers the first two munge key
    reads 503, as it may for a moment: the VMs read it again (their boot failed on it before)."""
    import dataclasses

    fake.inject("GET", r"-munge-key/versions/latest:access$", times=2, http_status=503, code="UNAVAILABLE")
    settings.GCE_CONTROLLER_ACCESS = "external"
    settings.GCE_CONSOLE_NETWORK = ""
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    spec = gce_spec(cpu=1)
    spec["display_name"] = "outside"
    cluster = run(services.create_cluster(project=alpha, name="outside", spec=spec, user=alice))
    try:
        assert cluster.status == ClusterStatus.READY
        assert not [i for i in fake.injections if i.times]  # both refusals were met, and read past
        prefix = names("alpha", "outside").prefix
        controller = fake.resources[f"/compute/v1/projects/tcc-test/zones/us-central1-a/instances/{prefix}-ctl"]
        nic = controller["networkInterfaces"][0]
        [config] = nic["accessConfigs"]
        assert cluster.backend_state["controller_ip"] == config["natIP"] != nic["networkIP"]
        assert not fake.resources[f"/compute/v1/projects/tcc-test/global/networks/{prefix}-net"].get("peerings")
        endpoint = backend().agent_endpoint(cluster)
        assert AgentClient(endpoint, timeout=10).stat(".")["exists"]
        inside = dataclasses.replace(endpoint, url=f"https://{nic['networkIP']}:{settings.GCE_AGENT_PORT}")
        with pytest.raises(TransientBackendError, match="not answering"):
            AgentClient(inside, timeout=3).stat(".")
    finally:
        run(services.delete_cluster(cluster=Cluster.objects.get(name="outside")))


def test_deleting_the_cluster_leaves_no_vm_resource_or_key(cluster, fake):
    """The module's last test: it deletes the module's cluster."""
    prefix = names("glab", "train").prefix
    client = SlurmRest(backend().slurm_endpoint(cluster))
    run(services.delete_cluster(cluster=cluster))
    assert not [name for name in fake.vpc.vms if name.startswith(prefix)]
    assert not [key for key, value in fake.resources.items() if prefix in json.dumps(value)]
    assert not [name for name in fake.secret_versions if prefix in name]
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(client.endpoint.url, timeout=2, context=tls.client_context(client.endpoint.ca))
