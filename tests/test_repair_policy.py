"""The failure policy and the repair ladder, on the scripted backend (no Slurm): escalation, giving
up, priorities, and a rerun after a killed worker that does no step twice."""

import pytest

from clusters import services
from clusters.choices import ClusterStatus, OperationStatus
from clusters.health import repair
from clusters.models import Cluster, Operation
from clusters.operations import engine

from .conftest import scripted_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(scripted, alpha, alice):
    operation = services.create_cluster(project=alpha, name="ok", spec=scripted_spec(), user=alice)
    engine.run(operation.pk)
    return Cluster.objects.get()


def repair_once(cluster):
    operation = repair.watch(cluster)
    if operation is not None:
        engine.run(operation.pk)
        operation.refresh_from_db()
        assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return operation


def test_the_worst_failure_wins():
    assert repair.worst(["speed", "correctness", "disk"]) == "correctness"
    assert repair.worst(["disk", "unresponsive"]) == "unresponsive"


def test_a_node_that_keeps_failing_climbs_the_ladder_then_degrades_the_cluster(cluster, scripted):
    scripted.down.add("cpu-1")
    assert repair_once(cluster).params["action"] == "reboot"
    assert repair_once(cluster).params["action"] == "reinstall"
    replaced = repair.watch(cluster)
    assert replaced.params["action"] == "replace"
    Operation.objects.filter(pk=replaced.pk).update(status=OperationStatus.FAILED)  # say the replacement failed too
    assert repair.watch(cluster) is None  # the ladder is exhausted: no fourth action
    cluster.refresh_from_db()
    assert cluster.status == ClusterStatus.DEGRADED
    assert cluster.events.filter(level="ERROR", message__startswith="Gave up on cpu-1").exists()
    assert ("reboot", "cpu-1") in scripted.calls and ("reinstall", "cpu-1") in scripted.calls


def test_one_repair_at_a_time(cluster, scripted):
    scripted.down.update({"cpu-0", "cpu-1"})
    first = repair.watch(cluster)
    assert first is not None
    assert repair.watch(cluster) is None  # the first is still pending


def test_a_rerun_after_a_killed_worker_does_no_step_twice(cluster, scripted):
    scripted.down.add("cpu-0")
    operation = repair.watch(cluster)
    operation.checkpoint.set("done", ["Drain cpu-0", "Reboot cpu-0"])  # the worker died after these
    engine.run(operation.pk)
    assert scripted.calls == [("resume", "cpu-0")]
    assert cluster.nodes.get(name="cpu-0").repairs == {"unresponsive": 1}
    operation.refresh_from_db()
    # What it was asked stays as asked; what its steps did is in the checkpoint.
    assert operation.params == {"node": "cpu-0", "failure": "unresponsive", "action": "reboot"}
    assert operation.checkpoint["done"] == ["Drain cpu-0", "Reboot cpu-0"]


@pytest.mark.parametrize(("word", "first"), [("replace", "replace"), ("", "reboot"), ("format", "reboot")])
def test_a_gpu_that_meets_the_rma_criteria_is_replaced_without_a_reboot_first(cluster, scripted, settings, word, first):
    """The ECC check says "replace" for a failed row remap or SRAM errors over the threshold (no reset
    fixes those); other failures, and words that are no action of the ladder, climb it from the start."""
    from clusters.choices import OperationKind
    from clusters.health import scans

    settings.AUTO_REPAIR = True
    scan = Operation.objects.create(cluster=cluster, kind=OperationKind.SCAN, status=OperationStatus.SUCCEEDED)
    reason = "GPU 00000000:0B:00.0: a row remap failed (NVIDIA's RMA criteria)"
    scans.record(scan, {"cpu-1": {"ecc": {"status": "fail", "reason": reason, "repair": word}}})
    operation = repair.after_health(cluster)
    assert operation.params["action"] == first
    # The rungs skipped count as taken: if the replacement fails too, the ladder is over.
    assert cluster.nodes.get(name="cpu-1").repairs == {"ecc": 2 if first == "replace" else 1}
    detected = cluster.events.get(message__startswith="Detected ecc on cpu-1").message
    assert ("no reboot can fix that: starting at replace" in detected) == (first == "replace")
