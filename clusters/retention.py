"""Bounded growth: what the console keeps, and the periodic prune that drops the rest.

Defaults (settings, days): events EVENTS_KEEP_DAYS=90, ended Slurm jobs JOBS_KEEP_DAYS=90, health
results HEALTH_RESULTS_KEEP_DAYS=30, finished operations (their step logs and checkpoints)
OPERATIONS_KEEP_DAYS=180, scan folders on a cluster's shared storage SCAN_FOLDERS_KEEP_DAYS=30.
Never pruned: the latest health result of each node and check (its `latest` flag), an operation that
still holds one, an active operation, a job that may still run.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from console.errors import ConsoleError

from .choices import ClusterStatus, OperationStatus
from .models import Cluster, ClusterEvent, HealthResult, Operation, SlurmJob
from .services import prune_files
from .slurm.states import JOB_ACTIVE


def cutoff(days, now):
    return now - timedelta(days=days)


def prune(now=None):
    """Delete what is past its retention; returns {what: how many}."""
    now = now or timezone.now()
    counts = {
        "events": ClusterEvent.objects.filter(created__lt=cutoff(settings.EVENTS_KEEP_DAYS, now)).delete()[0],
        "jobs": SlurmJob.objects.filter(seen__lt=cutoff(settings.JOBS_KEEP_DAYS, now))
        .exclude(state__in=JOB_ACTIVE)
        .delete()[0],
        "health_results": HealthResult.objects.filter(
            created__lt=cutoff(settings.HEALTH_RESULTS_KEEP_DAYS, now), latest=False
        ).delete()[0],
    }
    holds_latest = HealthResult.objects.filter(operation=OuterRef("pk"), latest=True)
    old = Operation.objects.filter(
        status__in=OperationStatus.done(), finished__lt=cutoff(settings.OPERATIONS_KEEP_DAYS, now)
    ).exclude(Exists(holds_latest))
    counts["operations"] = old.delete()[1].get("clusters.Operation", 0)  # not the rows that went with them
    counts["scan_folders"] = prune_scan_folders(now)
    return counts


def prune_scan_folders(now):
    """Scan folders (<shared home>/scans/<operation>) older than SCAN_FOLDERS_KEEP_DAYS, removed by
    each cluster's agent."""

    limit = cutoff(settings.SCAN_FOLDERS_KEEP_DAYS, now).timestamp()
    removed = 0
    for cluster in Cluster.objects.filter(status__in=ClusterStatus.watched()):
        try:
            removed += prune_files(cluster, "scans", limit)
        except ConsoleError:
            continue  # the cluster's agent is away: next time
    return removed
