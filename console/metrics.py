"""GET /metrics: the console's own figures in Prometheus' text format, for the scrape token in
METRICS_TOKEN_FILE (as the router's /metrics; without the file the path is a 404, a wrong token a
401). Read from the database and the task queue at each scrape, never from a cluster:

    tcc_operations{kind, status}                      operations in the database (pruned with history)
    tcc_operation_oldest_active_seconds{kind}         age of the oldest PENDING or RUNNING one
    tcc_operation_heartbeat_age_seconds{kind}         longest silence of a RUNNING one's worker
    tcc_clusters{status}                              clusters by status
    tcc_cluster_sync_lag_seconds{project, cluster}    since the last sync that reached Slurm
    tcc_cluster_sync_failing{project, cluster}        1 while Slurm does not answer the sync
    tcc_cluster_certificate_expiry_seconds{project, cluster}  until the controller's TLS certificate ends
    tcc_nodes{project, cluster, state}                nodes by the console's state
    tcc_health_checks{project, cluster, check, status} every node's newest result of each check
    tcc_runs{status}, tcc_endpoints{status}           recipe runs and inference endpoints
    tcc_task_queue_length{queue}                      Celery messages waiting in Redis

docs/operations.md gives the scrape config and what to alert on.
"""

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Count, Min
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from clusters import services
from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster, HealthResult, Node, Operation, SlurmSync
from recipes.models import Endpoint, EndpointStatus, Run

from .auth import scrape_allowed


def gauge(name, documentation, labels, rows):
    """A gauge family from [(label values..., value)]."""
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for *values, value in rows:
        family.add_metric([str(v) for v in values], value)
    return family


def seconds_since(then, now):
    return max(0.0, (now - then).total_seconds())


class Console:
    """The collector: one pass over the database (grouped counts, no row per object but clusters)."""

    def collect(self):
        now = timezone.now()
        yield gauge("tcc_operations", "Operations in the database by kind and status", ["kind", "status"],
                    Operation.objects.values_list("kind", "status").annotate(n=Count("id")).order_by())  # fmt: skip
        active = Operation.objects.filter(status__in=OperationStatus.active()).values("kind").order_by()
        oldest = active.annotate(first=Min("created"))
        yield gauge("tcc_operation_oldest_active_seconds", "Age of the oldest pending or running operation",
                    ["kind"], [(row["kind"], seconds_since(row["first"], now)) for row in oldest])  # fmt: skip
        running = Operation.objects.filter(status=OperationStatus.RUNNING, heartbeat__isnull=False)
        silent = running.values("kind").order_by().annotate(last=Min("heartbeat"))
        yield gauge("tcc_operation_heartbeat_age_seconds", "Longest silence of a running operation's worker",
                    ["kind"], [(row["kind"], seconds_since(row["last"], now)) for row in silent])  # fmt: skip
        yield gauge("tcc_clusters", "Clusters by status", ["status"],
                    Cluster.objects.exclude(status=ClusterStatus.DELETED).values_list("status")
                    .annotate(n=Count("id")).order_by())  # fmt: skip
        live = Cluster.objects.live().select_related("project")
        syncs = {s.cluster_id: s for s in SlurmSync.objects.filter(cluster__in=live)}
        lag, failing, certificates = [], [], []
        for cluster in live:
            ends = services.certificates.expires(cluster)
            if ends is not None:
                certificates.append((cluster.project.slug, cluster.name, (ends - now).total_seconds()))
            sync = syncs.get(cluster.pk)
            if sync is None or sync.synced is None:
                continue
            lag.append((cluster.project.slug, cluster.name, seconds_since(sync.synced, now)))
            failing.append((cluster.project.slug, cluster.name, 1 if sync.failing_since else 0))
        yield gauge("tcc_cluster_sync_lag_seconds", "Since the last sync that reached the cluster's Slurm",
                    ["project", "cluster"], lag)  # fmt: skip
        yield gauge("tcc_cluster_sync_failing", "1 while the cluster's Slurm does not answer the sync",
                    ["project", "cluster"], failing)  # fmt: skip
        yield gauge("tcc_cluster_certificate_expiry_seconds", "Until the controller's TLS certificate ends",
                    ["project", "cluster"], certificates)  # fmt: skip
        names = {c.pk: (c.project.slug, c.name) for c in live}
        nodes = Node.objects.filter(cluster__in=live).values_list("cluster_id", "state").annotate(n=Count("id"))
        yield gauge("tcc_nodes", "Nodes by the console's state", ["project", "cluster", "state"],
                    [(*names[c], state, n) for c, state, n in nodes.order_by()])  # fmt: skip
        checks = (HealthResult.objects.filter(cluster__in=live, latest=True)
                  .values_list("cluster_id", "check_name", "status").annotate(n=Count("id")).order_by())  # fmt: skip
        yield gauge("tcc_health_checks", "Nodes by their newest result of each health check",
                    ["project", "cluster", "check", "status"], [(*names[c], *rest) for c, *rest in checks])  # fmt: skip
        yield gauge("tcc_runs", "Recipe runs by status", ["status"],
                    Run.objects.values_list("status").annotate(n=Count("id")).order_by())  # fmt: skip
        yield gauge("tcc_endpoints", "Inference endpoints by status", ["status"],
                    Endpoint.objects.exclude(status=EndpointStatus.DELETED).values_list("status")
                    .annotate(n=Count("id")).order_by())  # fmt: skip
        yield gauge("tcc_task_queue_length", "Celery messages waiting in the broker", ["queue"], queue_lengths())

    def describe(self):
        return []


def queue_lengths():
    """[(queue, messages waiting)] of the console's Celery queues in Redis; none when it does not answer."""
    import redis

    queues = [getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery"), settings.CELERY_PERIODIC_QUEUE]
    try:
        connection = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2)
        return [(queue, connection.llen(queue)) for queue in queues]
    except redis.RedisError:
        return []


@login_not_required  # the scrape token stands in for a session
@require_GET
def metrics(request):
    allowed = scrape_allowed(request.headers.get("Authorization", ""))
    if allowed is None:
        return JsonResponse({"detail": "Not found."}, status=404)
    if not allowed:
        return JsonResponse({"detail": "/metrics needs the scrape token (METRICS_TOKEN_FILE)"}, status=401)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Console())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
