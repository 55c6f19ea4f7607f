"""A worker killed mid-provisioning: the operation is resumed and nothing is created twice.

This module runs its own workers (no module-wide worker), so the first one is sure to take the task.
"""

import pytest

from clusters import operations, processes, services
from clusters.backends import get_backend
from clusters.choices import ClusterStatus, OperationStatus

from .conftest import Worker, example_spec, purge_queue, wait_until
from .factories import finished, idle_nodes, slurmd_pids

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_rerun_after_a_killed_worker_creates_nothing_twice(redis_broker, slurm, alice, alpha, tmp_path):
    purge_queue(redis_broker)
    # Slow slurmd starts down so the worker can be killed between two of them.
    first = Worker(tmp_path / "first.log", LOCAL_NODE_START_DELAY=1.5)
    try:
        operation = services.create_cluster(project=alpha, name="crash", spec=example_spec(cpu=3), user=alice)
        cluster = operation.cluster
        wait_until(
            lambda: len(slurmd_pids(cluster, "cpu-0")) == 1,
            timeout=60,
            message="the first slurmd",
        )
        first.kill()
    finally:
        first.stop()
    operation.refresh_from_db()
    assert operation.status == OperationStatus.RUNNING
    assert slurmd_pids(cluster, "cpu-2") == []

    second = Worker(tmp_path / "second.log")
    try:
        assert operations.resume_stale(stale_after=0) == [operation.pk]
        operation = finished(operation.uuid)
    finally:
        second.stop()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert operation.attempts == 2
    cluster.refresh_from_db()
    assert cluster.status == ClusterStatus.READY
    assert idle_nodes(cluster) == ["cpu-0", "cpu-1", "cpu-2"]
    paths = get_backend("local").paths(cluster)
    for node in ("cpu-0", "cpu-1", "cpu-2"):
        assert len(slurmd_pids(cluster, node)) == 1, node
    assert len(processes.find_pids("slurmctld", str(paths.conf))) == 1
    assert len(processes.find_pids("munged", str(paths.munge_socket))) == 1
    assert cluster.events.filter(message__startswith="Resuming create (attempt 2)").exists()
