"""Bounded growth: a year of history is pruned to its retention, never a node's latest result, and
periodic tasks queue apart from operations and expire. alice's cluster runs on the scripted backend."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from clusters import retention
from clusters.choices import OperationKind, OperationStatus
from clusters.models import ClusterEvent, HealthResult, Operation, SlurmJob
from clusters.operations import tasks as operation_tasks
from clusters.services import create_cluster

from .conftest import provisioned, scripted_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(alpha, alice, scripted):
    operation = create_cluster(project=alpha, name="demo", spec=scripted_spec(), user=alice)
    provisioned(name="demo")
    return operation.cluster


def aged(days, **fields):
    return {"created": timezone.now() - timedelta(days=days), **fields}


def test_it_prunes_a_year_of_history_to_its_retention_but_keeps_the_latest_results(cluster):
    now = timezone.now()
    old_scan = Operation.objects.create(
        cluster=cluster, kind=OperationKind.SCAN, status=OperationStatus.SUCCEEDED, finished=now - timedelta(days=300)
    )
    older_scan = Operation.objects.create(
        cluster=cluster, kind=OperationKind.SCAN, status=OperationStatus.SUCCEEDED, finished=now - timedelta(days=360)
    )
    for days in range(0, 365, 5):
        ClusterEvent.objects.create(cluster=cluster, message=f"day {days}", **aged(days))
    SlurmJob.objects.create(cluster=cluster, job_id=1, state="COMPLETED", seen=now - timedelta(days=200))
    SlurmJob.objects.create(cluster=cluster, job_id=2, state="RUNNING", seen=now - timedelta(days=200))
    SlurmJob.objects.create(cluster=cluster, job_id=3, state="FAILED", seen=now - timedelta(days=10))
    result = {"cluster": cluster, "node": "cpu-0", "check_name": "disk", "status": "pass"}
    HealthResult.objects.create(operation=older_scan, **result, **aged(360))
    HealthResult.objects.create(operation=old_scan, latest=True, **result, **aged(300))  # the node's newest disk
    HealthResult.objects.create(operation=older_scan, **{**result, "node": "cpu-1"}, latest=True, **aged(360))

    counts = retention.prune()

    assert counts["events"] == sum(1 for days in range(0, 365, 5) if days >= settings.EVENTS_KEEP_DAYS)
    assert sorted(SlurmJob.objects.values_list("job_id", flat=True)) == [2, 3]  # a running job stays
    latest = HealthResult.objects.filter(latest=True).values_list("node", "check_name")
    assert sorted(latest) == [("cpu-0", "disk"), ("cpu-1", "disk")]
    assert HealthResult.objects.count() == 2
    assert counts["health_results"] == 1
    # Both old scans still hold a node's latest result, so both stay; the create (recent) stays too.
    assert counts["operations"] == 0
    HealthResult.objects.filter(operation=old_scan).update(latest=False)
    HealthResult.objects.filter(operation=old_scan).update(created=now)  # not yet past its own retention
    assert retention.prune()["operations"] == 1
    assert not Operation.objects.filter(pk=old_scan.pk).exists()
    assert Operation.objects.filter(kind=OperationKind.CREATE).exists()


def test_periodic_tasks_have_their_own_queue_and_wait_a_few_runs_late_at_most():
    """Each expired at its next run, so a worker steadily one interval behind never ran them at all; now each
    waits up to PERIODIC_LATE_RUNS intervals (at most PERIODIC_ROUND_TIMEOUT, at least one): a late run
    still happens, and no more than that many pile up."""
    from console.celery import app

    router = app.amqp.router
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        every, expires = entry["schedule"], entry["options"]["expires"]
        assert entry["options"]["queue"] == settings.CELERY_PERIODIC_QUEUE
        assert every <= expires <= max(every, settings.PERIODIC_ROUND_TIMEOUT)
        assert expires >= min(settings.PERIODIC_LATE_RUNS * every, settings.PERIODIC_ROUND_TIMEOUT)
        assert router.route({}, entry["task"])["queue"].name == settings.CELERY_PERIODIC_QUEUE
    operation_queue = router.route({}, operation_tasks.run_operation_task.name)["queue"].name
    assert operation_queue == settings.CELERY_TASK_DEFAULT_QUEUE != settings.CELERY_PERIODIC_QUEUE
    assert "clusters.tasks.prune_history" in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
