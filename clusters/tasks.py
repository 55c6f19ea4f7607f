"""Thin Celery tasks for the periodic work of clusters (health watch, scheduled scans, pruning); they
take ids, never model instances. The operation tasks live beside the engine (clusters.operations.tasks)."""

from celery import shared_task
from django.conf import settings

from . import retention
from .choices import ClusterStatus
from .health import repair, schedule
from .models import Cluster
from .operations.tasks import resume_stale_operations, run_operation_task

__all__ = ["prune_history", "resume_stale_operations", "run_due_scans", "run_operation_task", "watch_clusters"]


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
