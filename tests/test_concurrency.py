"""Several Celery workers on one database, as docs/scaling.md runs the console: four worker processes
take twenty creates at once, while alice asks each cluster for a resize as soon as she has sent its
create. Every request gives exactly one operation or a 409 (one active operation per cluster), every
operation runs once and succeeds, and no worker hits a deadlock or a lock timeout. The suite runs this
module on SQLite and again on PostgreSQL (scripts/test.sh, DATABASE_URL).

Persona: alice (project alpha) on the scripted backend, whose steps take no time, so the workers
race for the database and the queue rather than wait on a cloud.
"""

import pytest
from django.db import connection

from clusters.choices import ClusterStatus, OperationKind, OperationStatus
from clusters.models import Cluster, Operation

from .conftest import Worker, scripted_spec, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

API = "/api/v1/projects/alpha/clusters/"
TROUBLE = ("deadlock", "database is locked", "could not serialize", "Traceback", "IntegrityError")


@pytest.fixture
def four_workers(redis_broker, scripted, tmp_path):
    workers = [Worker(tmp_path / f"worker-{n}.log", CONSOLE_SCRIPTED_BACKEND=1) for n in range(4)]
    yield workers
    for worker in workers:
        worker.stop()


def test_four_workers_run_twenty_creates_and_resizes_each_exactly_once(four_workers, alice_api, tmp_path):
    names = [f"c{n:02}" for n in range(20)]
    answers = {}
    for name in names:
        created = alice_api.post(API, {"cluster_id": name, "spec": scripted_spec()}, format="json")
        assert created.status_code == 202, created.content
        # At once, while some worker may already be running the create: a second operation or a 409.
        resized = alice_api.patch(f"{API}{name}/", {"spec": scripted_spec(cpu=3)}, format="json")
        assert resized.status_code in (202, 409), resized.content
        answers[name] = resized.status_code
    for name, status in answers.items():  # a refused resize is asked again once the create is done
        if status == 409:
            wait_until(lambda name=name: Cluster.objects.get(name=name).status == ClusterStatus.READY, timeout=60,
                       message=f"{name}'s create")  # fmt: skip
            assert alice_api.patch(f"{API}{name}/", {"spec": scripted_spec(cpu=3)}, format="json").status_code == 202

    def all_done():
        return not Operation.objects.exclude(status__in=[OperationStatus.SUCCEEDED, OperationStatus.FAILED]).exists()

    wait_until(all_done, timeout=120, interval=0.5, message="every operation to finish")
    for name in names:
        cluster = Cluster.objects.get(name=name)
        operations = list(cluster.operations.order_by("created"))
        assert [op.kind for op in operations] == [OperationKind.CREATE, OperationKind.UPDATE], name
        assert all(op.status == OperationStatus.SUCCEEDED and op.attempts == 1 for op in operations), [
            (op.kind, op.status, op.attempts, op.error) for op in operations
        ]
        assert cluster.status == ClusterStatus.READY
        assert cluster.compute_nodes().count() == 3  # the resize, applied once
    logs = {n: (tmp_path / f"worker-{n}.log").read_text() for n in range(4)}
    for n, text in logs.items():
        assert not [word for word in TROUBLE if word in text], f"worker {n} ({connection.vendor}):\n{text[-3000:]}"
    # Each worker took some of the work: they ran side by side, not one after another.
    assert sum("succeeded" in text for text in logs.values()) >= 2
