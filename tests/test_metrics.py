"""The console's /metrics for Prometheus (console/metrics.py): its own figures, read from the database
and the task queue, for the scrape token alone. alice runs project "alpha"; prometheus holds the token."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from clusters import services
from clusters.choices import OperationStatus
from clusters.models import Cluster, HealthResult, Operation, SlurmSync
from clusters.operations import engine

from .conftest import scripted_spec

pytestmark = pytest.mark.django_db


def scraped(client, token):
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.content.decode())
        for sample in family.samples
    }


def test_prometheus_scrapes_the_consoles_figures_with_its_token_only(client, alice, alpha, scripted, settings,
                                                                     tmp_path):  # fmt: skip
    assert client.get("/metrics").status_code == 404  # off until METRICS_TOKEN_FILE names a token
    token = tmp_path / "scrape-token"
    token.write_text("prometheus-scrape-secret\n")
    settings.METRICS_TOKEN_FILE = str(token)
    engine.run(services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice).pk)
    cluster = Cluster.objects.get(name="ok")
    now = timezone.now()
    Operation.objects.create(cluster=cluster, kind="SCAN", exclusive=False, created=now - timedelta(seconds=120))
    SlurmSync.objects.update_or_create(cluster=cluster, defaults={"synced": now - timedelta(seconds=30)})
    cluster.backend_state = {**cluster.backend_state, "tls": {"not_after": (now + timedelta(days=40)).isoformat()}}
    cluster.save(update_fields=["backend_state"])
    scan = Operation.objects.filter(kind="SCAN").first()
    for node, status in (("cpu-0", "pass"), ("cpu-1", "fail")):
        HealthResult.objects.create(operation=scan, cluster=cluster, node=node, check_name="gpu", status=status,
                                    latest=True)  # fmt: skip

    client.force_login(alice)
    assert client.get("/metrics").status_code == 401  # a session is not the scrape token
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer guess").status_code == 401
    figures = scraped(client, "prometheus-scrape-secret")

    def value(name, **labels):
        return figures[(name, tuple(sorted(labels.items())))]

    assert value("tcc_operations", kind="CREATE", status=OperationStatus.SUCCEEDED) == 1
    assert value("tcc_operations", kind="SCAN", status=OperationStatus.PENDING) == 1
    assert 119 <= value("tcc_operation_oldest_active_seconds", kind="SCAN") < 300
    assert value("tcc_clusters", status=cluster.status) == 1
    assert 29 <= value("tcc_cluster_sync_lag_seconds", project="alpha", cluster="ok") < 300
    assert value("tcc_cluster_sync_failing", project="alpha", cluster="ok") == 0
    expiry = value("tcc_cluster_certificate_expiry_seconds", project="alpha", cluster="ok")
    assert 40 * 86400 - 300 < expiry <= 40 * 86400  # seconds until the recorded end
    assert value("tcc_health_checks", project="alpha", cluster="ok", check="gpu", status="fail") == 1
    assert value("tcc_nodes", project="alpha", cluster="ok", state="READY") == 3  # the login node and 2 workers
    assert ("tcc_task_queue_length", (("queue", settings.CELERY_TASK_DEFAULT_QUEUE),)) in figures
