"""Operations: compare-and-set claims and transitions, retries and failures (no worker, no Slurm)."""

import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from clusters import operations, services
from clusters.backends import TransientBackendError
from clusters.choices import ClusterStatus, EventLevel, OperationStatus
from clusters.models import Cluster, Operation
from clusters.operations import engine
from console.errors import AlreadyExists, Conflict

from .conftest import scripted_spec, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scripted")]


def create(alpha, alice, name):
    return services.create_cluster(project=alpha, name=name, spec=scripted_spec(), user=alice)


def test_only_one_worker_claims_an_operation(alpha, alice):
    operation = create(alpha, alice, "ok")
    other = Operation.objects.get(pk=operation.pk)
    assert operation.claim(stale_before=timezone.now() - timedelta(minutes=5))
    assert not other.claim(stale_before=timezone.now() - timedelta(minutes=5))


def test_it_takes_over_an_operation_whose_worker_went_silent(alpha, alice):
    operation = create(alpha, alice, "ok")
    assert operation.claim(stale_before=timezone.now())
    Operation.objects.filter(pk=operation.pk).update(heartbeat=timezone.now() - timedelta(minutes=10))
    assert Operation.objects.get(pk=operation.pk).claim(stale_before=timezone.now() - timedelta(minutes=5))
    assert Operation.objects.get(pk=operation.pk).attempts == 2


def test_it_runs_every_step_and_marks_the_cluster_ready(alpha, alice):
    operation = create(alpha, alice, "ok")
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED
    assert operation.progress == 100
    assert [entry["step"] for entry in operation.log] == ["First step", "Second step"]
    assert Cluster.objects.get().status == ClusterStatus.READY


def test_a_second_delivery_of_a_finished_operation_changes_nothing(alpha, alice):
    operation = create(alpha, alice, "ok")
    engine.run(operation.pk)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.attempts == 1
    assert Cluster.objects.get().events.count() == 2


def test_a_delivery_for_a_vanished_operation_does_nothing(alpha, alice):
    operation = create(alpha, alice, "ok")
    events = Cluster.objects.get().events.count()
    engine.run(operation.pk + 1000)
    operation.refresh_from_db()
    assert (operation.status, operation.attempts, operation.progress) == (OperationStatus.PENDING, 0, 0)
    assert Cluster.objects.get().events.count() == events


PEEK = operations.Kind(
    name="PEEK",
    label="Peek",
    metadata_type="GenericOperationMetadata",
    starts_from=frozenset(ClusterStatus),
    steps=lambda ctx: [],
    exclusive=False,
)

HOLD = operations.Kind(**{**PEEK.__dict__, "name": "HOLD", "exclusive": True})


def test_it_runs_operations_that_do_not_hold_the_cluster_beside_one_that_does(alpha, alice):
    operations.register(PEEK)
    create_op = create(alpha, alice, "ok")
    cluster = Cluster.objects.get()
    peeks = [operations.start(cluster, "PEEK", message="peek") for _ in range(2)]
    assert {p.status for p in peeks} == {OperationStatus.PENDING}
    assert cluster.active_operation() == create_op and cluster.latest_operation() == create_op
    operations.register(HOLD)
    with pytest.raises(Conflict, match="has a create in progress"):
        operations.start(cluster, "HOLD", message="hold")
    engine.run(peeks[0].pk)
    assert Operation.objects.get(pk=peeks[0].pk).status == OperationStatus.SUCCEEDED
    assert Cluster.objects.get().status == ClusterStatus.PROVISIONING  # a peek moves no status


def test_a_kind_that_does_not_hold_the_cluster_cannot_move_its_status():
    with pytest.raises(ValueError, match="cannot move its status"):
        operations.Kind(
            name="X",
            label="X",
            metadata_type="",
            steps=lambda ctx: [],
            starts_from=frozenset(),
            busy_status="UPDATING",
            exclusive=False,
        )


def test_a_transient_error_hands_the_operation_back_for_a_retry(alpha, alice):
    operation = create(alpha, alice, "flaky")
    with pytest.raises(TransientBackendError):
        engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PENDING
    assert "Will retry: zone capacity exhausted" in operation.log[-1]["message"]
    assert Cluster.objects.get().status == ClusterStatus.PROVISIONING


def test_the_task_gives_up_after_its_retries(alpha, alice):
    from clusters.operations.tasks import run_operation_task

    operation = create(alpha, alice, "flaky")
    with override_settings(OPERATION_MAX_RETRIES=0):
        run_operation_task.apply(args=[operation.pk])
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert "gave up after 1 attempts" in operation.error
    assert Cluster.objects.get().status == ClusterStatus.FAILED


def test_a_permanent_error_fails_the_cluster_with_the_reason_on_its_timeline(alpha, alice):
    operation = create(alpha, alice, "broken")
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert operation.error == "quota CPUS exceeded: need 16, have 8"
    cluster = Cluster.objects.get()
    assert cluster.status == ClusterStatus.FAILED
    event = cluster.events.filter(level=EventLevel.ERROR).get()
    assert event.message == "Create failed at 'Second step': quota CPUS exceeded: need 16, have 8"


def test_a_failed_cluster_keeps_its_id_until_deleted(alpha, alice):
    engine.run(create(alpha, alice, "broken").pk)
    with pytest.raises(AlreadyExists):
        create(alpha, alice, "broken")


def test_status_moves_only_from_the_expected_states(alpha, alice):
    cluster = create(alpha, alice, "ok").cluster
    assert not cluster.set_status(ClusterStatus.UPDATING, expected=ClusterStatus.usable())
    assert Cluster.objects.get().status == ClusterStatus.PROVISIONING
    assert cluster.set_status(ClusterStatus.READY, expected=[ClusterStatus.PROVISIONING])
    assert Cluster.objects.get().status == ClusterStatus.READY


def test_it_finds_operations_whose_worker_died(alpha, alice):
    from unittest import mock

    operation = create(alpha, alice, "ok")
    operation.claim(stale_before=timezone.now())
    Operation.objects.filter(pk=operation.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
    with mock.patch("clusters.operations.tasks.run_operation_task.delay") as delay:
        assert operations.resume_stale(stale_after=300) == [operation.pk]
    delay.assert_called_once_with(operation.pk, stale_after=300)


# -- one active operation per cluster -----------------------------------------------------------


def ready(alpha, alice, name="ok"):
    operation = create(alpha, alice, name)
    engine.run(operation.pk)
    return Cluster.objects.get(pk=operation.cluster_id)


def test_the_database_allows_one_active_operation_per_cluster(alpha, alice):
    from django.db import IntegrityError, transaction

    cluster = ready(alpha, alice)
    Operation.objects.create(cluster=cluster, kind="SCAN")
    with pytest.raises(IntegrityError), transaction.atomic():
        Operation.objects.create(cluster=cluster, kind="REPAIR")
    Operation.objects.create(cluster=cluster, kind="SCAN", status=OperationStatus.SUCCEEDED)  # done ones: any number


def test_a_resize_or_delete_during_a_scan_answers_409_and_changes_nothing(alpha, alice, alice_api):
    from clusters.health.scans import start_scan

    cluster = ready(alpha, alice)
    scan = start_scan(cluster=cluster, checks=["disk"], user=alice)
    url = "/api/v1/projects/alpha/clusters/ok/"
    resize = alice_api.patch(url, {"spec": scripted_spec(cpu=3)}, format="json")
    assert resize.status_code == 409, resize.content
    assert "health scan in progress" in resize.json()["detail"]
    assert alice_api.delete(url).status_code == 409
    compat = alice_api.patch(
        "/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters/ok", scripted_spec(cpu=3), format="json"
    )
    assert compat.status_code == 400
    assert compat.json()["error"]["status"] == "FAILED_PRECONDITION"
    cluster.refresh_from_db()
    assert cluster.status == ClusterStatus.READY
    assert cluster.spec == scripted_spec()
    assert cluster.compute_nodes().count() == 2
    assert list(cluster.operations.filter(status__in=OperationStatus.active())) == [scan]


# -- heartbeats, lost claims, time limits -------------------------------------------------------


@pytest.mark.parametrize("beat", ["context", "wait_for"])
def test_a_step_that_heartbeats_longer_than_the_stale_limit_is_not_taken_over(alpha, alice, scripted, settings, beat):
    from clusters import processes

    settings.OPERATION_STALE_AFTER = 2
    operation = create(alpha, alice, "ok")
    second = {}

    def slow_cloud_call(ctx):
        if beat == "context":
            until = timezone.now() + timedelta(seconds=5)
            while timezone.now() < until:
                ctx.heartbeat("waiting for Filestore")
                time.sleep(0.1)
        else:  # a backend's polling loop, deep inside the step, with no context at hand
            processes.wait_for(lambda: False, timeout=5, interval=0.1, waiting_for="Filestore")
        # A second worker arrives: the beat task looks for orphans and a redelivered message claims.
        scripted.during = None
        second["stale"] = engine.stale()
        engine.run(operation.pk)
        second["attempts"] = Operation.objects.get(pk=operation.pk).attempts

    scripted.during = slow_cloud_call
    engine.run(operation.pk)
    assert second == {"stale": [], "attempts": 1}
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED and operation.attempts == 1


def test_a_silent_step_is_taken_over_and_its_worker_stops_at_its_next_write(alpha, alice, scripted, settings):
    settings.OPERATION_STALE_AFTER = 1
    operation = create(alpha, alice, "ok")

    def silent(ctx):
        # No heartbeat: to the others this worker looks dead once its last one is a stale period old.
        wait_until(lambda: operation.pk in engine.stale(), timeout=10, message="the operation to look orphaned")
        scripted.during = None
        engine.run(operation.pk)  # the second worker takes over and finishes

    scripted.during = silent
    engine.run(operation.pk)  # returns quietly once it finds the operation is no longer its own
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED and operation.attempts == 2
    assert operation.cluster.events.filter(message="Resuming create (attempt 2)").exists()
    assert Cluster.objects.get().status == ClusterStatus.READY


def test_a_soft_time_limit_hands_the_operation_back_to_resume(alpha, alice, scripted):
    from celery.exceptions import SoftTimeLimitExceeded

    operation = create(alpha, alice, "ok")

    def overrun(ctx):
        raise SoftTimeLimitExceeded()

    scripted.during = overrun
    with pytest.raises(TransientBackendError, match="time limit; it will resume"):
        engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PENDING
    assert operation.log[-1]["message"] == "Will resume: 'Second step' ran past the task's time limit"
    assert Cluster.objects.get().status == ClusterStatus.PROVISIONING


def test_checkpoint_keys_are_written_one_at_a_time_and_survive_a_reload(alpha, alice):
    operation = create(alpha, alice, "ok")
    operation.checkpoint.set("jobs", {"cpu": 7})
    other = Operation.objects.get(pk=operation.pk)
    other.checkpoint.set("nodes", {"cpu": ["cpu-0"]})
    operation.checkpoint.set("jobs", {"cpu": 8})
    fresh = Operation.objects.get(pk=operation.pk)
    assert dict(fresh.checkpoint) == {"jobs": {"cpu": 8}, "nodes": {"cpu": ["cpu-0"]}}
    assert fresh.params == {}


def test_the_retry_budget_is_the_operations_own_not_a_messages(alpha, alice, settings):
    """A step that kills its worker every time arrives in a fresh message each time it is resumed;
    the budget still runs out, because it counts the operation's attempts."""
    from datetime import timedelta

    from django.utils import timezone

    settings.OPERATION_MAX_RETRIES = 2
    operation = create(alpha, alice, "ok")
    for attempt in (1, 2, 3):  # three workers took it and died mid-step (silent, never finished)
        Operation.objects.filter(pk=operation.pk).update(
            status=OperationStatus.RUNNING, attempts=attempt, heartbeat=timezone.now() - timedelta(hours=1),
            step="Second step",
        )  # fmt: skip
    engine.run(operation.pk, stale_after=0)  # the fourth delivery, e.g. from resume_stale_operations
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert operation.error == "gave up after 3 attempts (Second step)"
    assert Cluster.objects.get().status == ClusterStatus.FAILED
