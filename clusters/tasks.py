"""Thin Celery tasks for the periodic work of clusters (Slurm sync, health watch, scheduled scans,
pruning); they
take ids, never model instances. The operation tasks live beside the engine (clusters.operations.tasks)."""

from celery import shared_task
from django.conf import settings

from console import rounds

from . import retention, services
from .choices import ClusterStatus
from .health import repair, schedule
from .models import Cluster
from .operations.tasks import resume_stale_operations, run_operation_task

__all__ = [
    "prune_history",
    "resume_stale_operations",
    "rotate_certificates",
    "run_due_scans",
    "run_operation_task",
    "sync_cluster",
    "sync_clusters",
    "watch_clusters",
]


@shared_task(soft_time_limit=30)
def sync_clusters():
    """Send one sync per cluster whose Slurm may be up, unless one for it still waits (console/rounds.py)."""
    ids = Cluster.objects.filter(status__in=ClusterStatus.synced()).values_list("pk", flat=True)
    for cluster_id in ids:
        rounds.send(sync_cluster, "sync", cluster_id)


@shared_task(soft_time_limit=60)
def sync_cluster(cluster_id):
    """Pull one cluster's nodes and jobs from Slurm into the database (clusters.services.sync)."""
    rounds.started("sync", cluster_id)
    cluster = Cluster.objects.filter(pk=cluster_id).select_related("project").first()
    if cluster is not None:
        services.sync_cluster(cluster)


@shared_task(soft_time_limit=120)
def watch_clusters():
    """Detect failed nodes on every watched cluster and start repairs (one operation per cluster at a time)."""
    if not settings.AUTO_REPAIR:
        return
    for cluster in Cluster.objects.filter(status__in=ClusterStatus.watched()).select_related("project"):
        repair.watch(cluster)


@shared_task(soft_time_limit=120)
def run_due_scans():
    """Start every periodic health scan whose time has come."""
    return schedule.run_due_scans()


@shared_task(soft_time_limit=600)
def prune_history():
    """Drop events, jobs, results, operations and scan folders past their retention (clusters.retention)."""
    return retention.prune()


@shared_task(soft_time_limit=300)
def rotate_certificates():
    """Start a certificate rotation on each cluster whose controller certificate ends soon (daily)."""
    return services.certificates.rotate_due()
