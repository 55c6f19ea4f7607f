"""Faults the console must survive: the task queue going away under a create.

This module runs its own Redis (a private redis-server on a free port, so stopping it disturbs no
other test) and its own worker on it; alice creates clusters on the scripted backend.
"""

import shlex
import socket
import subprocess
import time

import pytest
from django.conf import settings

from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster, Operation
from clusters.operations import tasks

from .conftest import Worker, scripted_spec, wait_until
from .factories import free_port

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/v1/projects/alpha/clusters/"
COMPAT = "/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters"


class PrivateRedis:
    def __init__(self, folder):
        self.port, self.folder, self.process = free_port(), folder, None
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.started = False

    def start(self):
        """Start on its port; the first start moves to another free port when that one was taken between
        free_port() and the bind (redis-server exits at once), a restart keeps it (the broker URL names it)."""
        for _ in range(5):
            command = f"redis-server --port {self.port} --bind 127.0.0.1 --save '' --appendonly no --dir {self.folder}"
            self.process = subprocess.Popen(shlex.split(command), stdout=subprocess.DEVNULL)
            wait_until(lambda: self.answers() or self.process.poll() is not None, timeout=20,
                       message="the private redis-server")  # fmt: skip
            if self.process.poll() is None:
                self.started = True
                return
            if self.started:
                break
            self.port = free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
        raise AssertionError(f"the private redis-server did not start on port {self.port}")

    def answers(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def broker(redis_broker, settings, tmp_path):
    """A private Redis this test may stop, the test process's Celery pointed at it, the check on."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    app = tasks.run_operation_task.app
    before = app.conf.broker_url
    settings.OPERATION_CHECK_BROKER = True
    settings.OPERATION_BROKER_TIMEOUT = 1
    app.conf.broker_url = redis.url
    forget_connections(app)
    yield redis
    redis.stop()
    app.conf.broker_url = before
    forget_connections(app)


def forget_connections(app):
    """Drop the Celery app's cached connection and producer pools, so the next send uses broker_url."""
    app._pool = None
    app.amqp._producer_pool = None


def test_it_answers_503_with_a_retry_hint_while_the_queue_is_down_and_loses_nothing(
    broker, scripted, alice_api, tmp_path
):
    broker.stop()
    started = time.monotonic()
    response = alice_api.post(API, {"cluster_id": "during", "spec": scripted_spec()}, format="json")
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    assert "task queue is not answering" in response.json()["detail"]
    assert time.monotonic() - started < 10
    response = alice_api.post(f"{COMPAT}?model_development_cluster_id=during", scripted_spec(), format="json")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["status"] == "UNAVAILABLE"
    assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]
    assert not Cluster.objects.exists()

    # The queue dies after the check but before the send: the create is accepted and kept, unsent.
    settings.OPERATION_CHECK_BROKER = False
    response = alice_api.post(API, {"cluster_id": "raced", "spec": scripted_spec()}, format="json")
    assert response.status_code == 202
    operation = Operation.objects.get(cluster__name="raced")
    assert operation.status == OperationStatus.PENDING

    # The queue comes back; the beat task sends what was never sent, and a worker finishes it.
    broker.start()
    worker = Worker(tmp_path / "worker.log", TEST_REDIS_URL=broker.url, CONSOLE_SCRIPTED_BACKEND=1)
    try:
        assert tasks.resume_stale_operations(stale_after=0) == [operation.pk]
        wait_until(lambda: Operation.objects.get(pk=operation.pk).is_done, timeout=60, message="the resent operation")
    finally:
        worker.stop()
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert operation.attempts == 1
    assert Cluster.objects.get(name="raced").status == ClusterStatus.READY
    assert list(Cluster.objects.values_list("name", flat=True)) == ["raced"]
