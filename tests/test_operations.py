"""Operations: compare-and-set claims and transitions, retries and failures (no worker, no Slurm)."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from clusters import services
from clusters.backends import TransientBackendError
from clusters.choices import ClusterStatus, EventLevel, OperationStatus
from clusters.models import Cluster, Operation

from .conftest import example_spec

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("scripted_backend"),
]


@pytest.fixture
def scripted_backend(settings):
    settings.CLUSTER_BACKENDS = {**settings.CLUSTER_BACKENDS, "scripted": "tests.backends.ScriptedBackend"}


def create(alpha, alice, name):
    spec = example_spec()
    spec["console"]["backend"] = "scripted"
    return services.create_cluster(project=alpha, name=name, spec=spec, user=alice)


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
    services.run_operation(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED
    assert operation.progress == 100
    assert [entry["step"] for entry in operation.log] == ["First step", "Second step"]
    assert Cluster.objects.get().status == ClusterStatus.READY


def test_a_second_delivery_of_a_finished_operation_changes_nothing(alpha, alice):
    operation = create(alpha, alice, "ok")
    services.run_operation(operation.pk)
    services.run_operation(operation.pk)
    operation.refresh_from_db()
    assert operation.attempts == 1
    assert Cluster.objects.get().events.count() == 2


def test_a_delivery_for_a_vanished_operation_does_nothing(alpha, alice):
    services.run_operation(123456)


def test_a_transient_error_hands_the_operation_back_for_a_retry(alpha, alice):
    operation = create(alpha, alice, "flaky")
    with pytest.raises(TransientBackendError):
        services.run_operation(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PENDING
    assert "Will retry: zone capacity exhausted" in operation.log[-1]["message"]
    assert Cluster.objects.get().status == ClusterStatus.PROVISIONING


def test_the_task_gives_up_after_its_retries(alpha, alice):
    from clusters.tasks import run_operation_task

    operation = create(alpha, alice, "flaky")
    with override_settings(OPERATION_MAX_RETRIES=0):
        run_operation_task.apply(args=[operation.pk])
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert "gave up after 1 attempts" in operation.error
    assert Cluster.objects.get().status == ClusterStatus.FAILED


def test_a_permanent_error_fails_the_cluster_with_the_reason_on_its_timeline(alpha, alice):
    operation = create(alpha, alice, "broken")
    services.run_operation(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert operation.error == "quota CPUS exceeded: need 16, have 8"
    cluster = Cluster.objects.get()
    assert cluster.status == ClusterStatus.FAILED
    event = cluster.events.filter(level=EventLevel.ERROR).get()
    assert event.message == "Create failed at 'Second step': quota CPUS exceeded: need 16, have 8"


def test_a_failed_cluster_keeps_its_id_until_deleted(alpha, alice):
    services.run_operation(create(alpha, alice, "broken").pk)
    with pytest.raises(services.AlreadyExists):
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
    with mock.patch("clusters.tasks.run_operation_task.delay") as delay:
        assert services.resume_stale_operations(stale_after=300) == [operation.pk]
    delay.assert_called_once_with(operation.pk, stale_after=300)
