"""Health scans as Slurm jobs on a shared 2-node cluster, with injected faults: every test runs on a
local cluster and on a gce one booted by the fake Compute API, with the same assertions, except the
requeue after a node failure (two full training runs: local only, see its comment).

hana owns project "hlab" with cluster "train"; charlie is an outsider. Scans run in-process through
the service layer (the Celery path is the same task as provisioning, tested elsewhere).
"""

import pytest
from django.core.management import call_command

from clusters.backends import get_backend
from clusters.choices import OperationStatus
from clusters.health.faults import inject
from clusters.models import HealthResult, Operation
from clusters.operations import engine

from .conftest import BACKENDS, api_client_for, module_cluster, submit_through_slurmrestd, wait_until

pytestmark = pytest.mark.django_db
SCANS = "/api/v1/projects/hlab/clusters/train/scans/"
SLURM_REST = "/v1beta1/projects/hlab/locations/us-central1/modelDevelopmentClusters/train:callSlurmRestApi"


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request, django_db_setup, django_db_blocker, slurm):
    # The reference architectures' epilog: the console's fast GPU checks after every job.
    epilog = ["# GPU health test after every job\ntcc_gpu_check"]
    with module_cluster(
        django_db_blocker, username="hana", project_slug="hlab", request=request, epilog=epilog
    ) as found:
        yield found


@pytest.fixture
def hana_api(cluster):
    return api_client_for(cluster.project.members.get())


@pytest.fixture(autouse=True)
def no_faults(cluster):
    yield
    for node in cluster.compute_nodes():
        inject(cluster, node.name, "clear")
        get_backend(cluster.backend).resume(cluster, node.name)  # undo what a fault's health check drained


def scan(api, checks=None):
    response = api.post(SCANS, {"checks": checks} if checks else {}, format="json")
    assert response.status_code == 202, response.content
    operation = Operation.objects.get(uuid=response.json()["id"])
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return {(r.node, r.check_name): r for r in HealthResult.objects.filter(operation=operation)}


def test_a_healthy_cluster_passes_and_skips_gpu_checks_without_gpus(hana_api, cluster):
    results = scan(hana_api)
    assert {node for node, _ in results} == {"cpu-0", "cpu-1"}
    for node in ("cpu-0", "cpu-1"):
        assert results[(node, "disk")].status == "pass"
        assert results[(node, "correctness")].status == "pass"
        # Both "nodes" share this host's cores, so a little noise may make one a mild straggler.
        assert results[(node, "speed")].status in ("pass", "warn")
        assert results[(node, "speed")].values["gflops"] > 0
        # gloo all-reduce and a ping-pong between the two nodes, both measured.
        link = results[(node, "interconnect")]
        assert link.status == "pass", link.reason
        assert link.values["backend"] == "gloo" and link.values["nodes"] == 2
        assert link.values["busbw_gbps"] > 0
        assert set(link.values["pairs"]) == {"cpu-0", "cpu-1"} - {node}
        for gpu_check in ("gpu_inventory", "ecc", "dcgm", "xid"):
            assert results[(node, gpu_check)].status == "skipped"
            assert "no GPU" in results[(node, gpu_check)].reason
        assert results[(node, "nvlink")].status == "skipped"
    assert cluster.events.filter(message__startswith="Health scan done: ").exists()
    listed = hana_api.get(SCANS).json()[0]
    assert len(listed["results"]) == 18  # 9 checks x 2 nodes


def test_a_perturbed_node_fails_correctness_alone(hana_api):
    call_command("inject_fault", "hlab/train", "cpu-1", "perturb", stdout=open("/dev/null", "w"))  # noqa: SIM115
    results = scan(hana_api, ["correctness"])
    assert results[("cpu-0", "correctness")].status == "pass"
    assert results[("cpu-1", "correctness")].status == "fail"
    assert "differs from the reference" in results[("cpu-1", "correctness")].reason


def test_a_slow_node_is_a_straggler_against_the_fleet_median(hana_api, client, cluster):
    call_command("inject_fault", "hlab/train", "cpu-1", "slow", "--value", "5", stdout=open("/dev/null", "w"))  # noqa: SIM115
    results = scan(hana_api, ["speed"])
    assert results[("cpu-0", "speed")].status == "pass"
    slow = results[("cpu-1", "speed")]
    assert slow.status in ("warn", "fail")
    assert "straggler" in slow.reason
    assert slow.threshold["straggler_fraction"] == 0.9
    client.force_login(cluster.project.members.get())
    grid = client.get("/clusters/hlab/train/health/?failing=1").content.decode()
    assert 'data-node="cpu-1"' in grid and 'data-node="cpu-0"' not in grid
    assert 'hx-get="/clusters/hlab/train/health/?failing=1"' in grid  # the next poll keeps the filter


def test_a_disk_fault_fails_the_disk_check_and_slurms_health_check_drains_the_node(hana_api, cluster):

    from clusters.health import repair

    call_command("inject_fault", "hlab/train", "cpu-0", "disk_full", stdout=open("/dev/null", "w"))  # noqa: SIM115
    response = hana_api.post(SCANS, {"checks": ["disk"]}, format="json")
    operation = Operation.objects.get(uuid=response.json()["id"])
    engine.run(operation.pk)
    operation.refresh_from_db()
    # Two clocks race: the scan's disk check, and Slurm's HealthCheckProgram (every 10 s), which may
    # drain cpu-0 before the scan job starts there; then the scan fails at once, saying so.
    if operation.status == OperationStatus.SUCCEEDED:
        results = {(r.node, r.check_name): r for r in HealthResult.objects.filter(operation=operation)}
        assert results[("cpu-0", "disk")].status == "fail"
        assert results[("cpu-1", "disk")].status == "pass"
    else:
        assert "the scan could not start: cpu-0 is drained (tcc disk: spool 100% used)" in operation.error
    # HealthCheckProgram runs every 10 s on every node and drains cpu-0 itself; the console then repairs.
    wait_until(
        lambda: "disk" in repair.detect(cluster).get("cpu-0", ("",))[0],
        timeout=30,
        interval=1,
        message="Slurm's health check to drain cpu-0",
    )
    assert cluster.nodes.get(name="cpu-0").slurm_reason.startswith("tcc disk: spool 100% used")
    # The scan's failure already started the repair, or the watcher starts it for the drained node: the
    # first rung of the disk ladder.
    operation = Operation.objects.filter(kind="REPAIR").order_by("-created").first() or repair.watch(cluster)
    assert operation.params["node"] == "cpu-0"
    assert operation.params["action"] == "clean_scratch"
    assert repair.watch(cluster) is None  # one repair at a time


def test_it_refuses_unknown_checks_and_outsiders(hana_api, charlie_api, cluster):
    response = hana_api.post(SCANS, {"checks": ["disk", "vibes"]}, format="json")
    assert response.status_code == 400
    assert "unknown check 'vibes'" in response.json()["checks"][0]
    assert charlie_api.post(SCANS, {}, format="json").status_code == 404


def test_a_job_hit_by_a_node_failure_is_repaired_requeued_and_ends_with_the_same_loss(cluster):
    # Two training runs (about 90 s): on local only. What differs on gce is the repair's reboot of a
    # VM and its slurmd joining again, which the dcgm and wrong-results tests below run on gce; the
    # requeue and the resume from the checkpoint are Slurm's and the run's, the same on both.
    if cluster.backend != "local":
        pytest.skip("local only: the gce parts (a VM's reboot and rejoin) are in the dcgm and replace tests")
    import json

    from clusters import services
    from clusters.health import repair
    from recipes import runs

    owner = cluster.project.members.get()

    def launch():
        data = {"recipe": "llama3.1-8b-pretrain", "nodes": 2, "steps": 50}  # a checkpoint every 20
        run = runs.launch_run(cluster=cluster, data=data, user=owner)
        engine.run(run.launch_id)  # its LAUNCH operation, as a worker would run it
        run.refresh_from_db()
        assert run.slurm_job_id, run.error
        return run

    def wait(run, timeout=300):
        wait_until(lambda: runs.refresh_run(run).is_done, timeout=timeout, interval=1, message=f"run {run.uuid}")
        return run

    def read(run, name):
        path = runs.in_run(run, name)
        return services.read_file(cluster, path).decode() if services.file_exists(cluster, path) else ""

    def final_loss(run):
        return json.loads(read(run, "result.json"))["final_loss"]

    reference = wait(launch())
    assert reference.status == "COMPLETED", (reference.error, reference.log_tail)

    run = launch()
    wait_until(
        lambda: len(read(run, "metrics.jsonl").splitlines()) >= 22,  # step 20 saved
        timeout=120,
        interval=0.5,
        message="the run to reach step 22",
    )
    call_command("inject_fault", "hlab/train", "cpu-1", "kill_node", stdout=open("/dev/null", "w"))  # noqa: SIM115

    # Slurm marks the node down (SlurmdTimeout) and requeues the job; the console sees it and repairs.
    def repair_started():
        cluster.refresh_from_db()
        return repair.watch(cluster)

    operation = wait_until(repair_started, timeout=120, interval=1, message="the failed node to be detected")
    assert operation.params == {"node": "cpu-1", "failure": "unresponsive", "action": "reboot"}
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert [e["message"].split(":")[0] for e in operation.log] == ["Drain cpu-1", "Reboot cpu-1", "Resume cpu-1"]

    run = wait(run)
    assert run.status == "COMPLETED", run.error
    events = [json.loads(line) for line in read(run, "events.jsonl").splitlines()]
    resumed = [e for e in events if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] >= 20  # continued from its last checkpoint, not from scratch
    assert abs(final_loss(run) - final_loss(reference)) < 1e-6
    messages = list(cluster.events.values_list("message", flat=True))
    assert any(m.startswith("Detected unresponsive on cpu-1") for m in messages)
    assert "Repaired cpu-1 (unresponsive) by reboot" in messages
    assert cluster.nodes.get(name="cpu-1").repairs == {"unresponsive": 1}


def test_a_node_whose_dcgmi_reports_a_failed_gpu_is_drained_and_rebooted(hana_api, cluster, settings):
    # dcgmi exits 226 with a failing JSON report (the simulated tool); before, any non-zero exit read
    # as "dcgmi not found" and the node was never repaired.
    settings.AUTO_REPAIR = True
    first, node = [n.name for n in cluster.compute_nodes().order_by("name")]
    inject(cluster, node, "gpu_dcgm")
    results = scan(hana_api, ["dcgm"])
    assert results[(node, "dcgm")].status == "fail"
    assert results[(node, "dcgm")].reason == "memory on GPU 3 (GPU 3 had memory errors and row remappings are pending)"
    assert results[(first, "dcgm")].status == "skipped"  # no GPU tools on the healthy node
    operation = Operation.objects.filter(kind="REPAIR").latest("created")
    assert (operation.params["node"], operation.params["action"]) == (node, "reboot")  # a GPU reset first
    inject(cluster, node, "clear")  # what the reset does to a pending row remap
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert [e["message"].split(":")[0] for e in operation.log][:2] == [f"Drain {node}", f"Reboot {node}"]
    messages = list(cluster.events.values_list("message", flat=True))
    assert (
        f"Detected dcgm on {node}: failed dcgm (memory on GPU 3 (GPU 3 had memory errors and row remappings "
        "are pending))" in messages
    )
    assert f"Repaired {node} (dcgm) by reboot: dcgm passes on all 2 scanned nodes" in messages
    assert cluster.nodes.get(name=node).repairs == {"dcgm": 1}


def test_the_epilog_drains_a_node_whose_gpu_fails_after_a_job_and_leaves_a_healthy_one_idle(hana_api, cluster):
    # Configless compute nodes are not sent the epilog, and the reference architectures' epilog called
    # a script that existed nowhere: Slurm drains a node whose epilog fails, after every job.
    backend = get_backend(cluster.backend)
    first, node = [n.name for n in cluster.compute_nodes().order_by("name")]
    inject(cluster, node, "gpu_ecc")
    home = str(backend.shared_dir(cluster))
    submit_through_slurmrestd(
        hana_api, SLURM_REST, "#!/bin/bash\nsrun true\n", name="after", nodes=2, tasks=2, current_working_directory=home
    )

    def states():
        return {s.name: s for s in backend.node_statuses(cluster)}

    wait_until(lambda: "DRAIN" in states()[node].flags or states()[node].state == "drained", timeout=60)
    assert states()[node].reason == "tcc ecc: GPU 00000000:0B:00.0: 2 uncorrectable ECC errors since the last reset"
    # Its epilog ran too, and passed: the job completes and the node is idle, neither drained nor given a reason.
    wait_until(lambda: (states()[first].state, states()[first].flags) == ("idle", []), timeout=30)
    assert states()[first].reason == ""


def test_a_node_with_wrong_results_is_replaced_and_the_cluster_keeps_its_size(hana_api, cluster, settings):
    from clusters.backends import get_backend

    settings.AUTO_REPAIR = True
    call_command("inject_fault", "hlab/train", "cpu-1", "perturb", stdout=open("/dev/null", "w"))  # noqa: SIM115
    scan(hana_api, ["correctness"])  # the scan's failure starts a repair at once
    operation = Operation.objects.filter(kind="REPAIR").latest("created")
    assert operation.params["action"] == "replace"  # a correctness failure goes straight to replace
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    names = sorted(cluster.nodes.filter(node_pool__pool_id="cpu").values_list("name", flat=True))
    assert names == ["cpu-0", "cpu-2"]
    assert cluster.nodes.get(name="cpu-2").repairs == {"correctness": 1}  # the ladder follows the slot
    idle = sorted(
        s.name for s in get_backend(cluster.backend).node_statuses(cluster) if s.state == "idle" and not s.flags
    )
    assert idle == ["cpu-0", "cpu-2"]
