"""Thin Celery tasks over clusters.services; they take ids, never model instances."""

from celery import shared_task
from django.conf import settings

from . import services
from .backends import TransientBackendError


@shared_task(bind=True, soft_time_limit=3600, time_limit=3700)
def run_operation_task(self, operation_id, stale_after=None):
    try:
        services.run_operation(operation_id, stale_after=stale_after)
    except TransientBackendError as exc:
        if self.request.retries >= settings.OPERATION_MAX_RETRIES:
            services.fail_operation(operation_id, f"{exc} (gave up after {self.request.retries + 1} attempts)")
            return
        raise self.retry(exc=exc, countdown=min(60, 2 ** (self.request.retries + 1))) from None


@shared_task(soft_time_limit=60)
def resume_stale_operations():
    return services.resume_stale_operations()


@shared_task(soft_time_limit=120)
def watch_clusters():
    """Detect failed nodes on every usable cluster and start repairs (one operation per cluster at a time)."""
    from .choices import ClusterStatus
    from .health.repair import watch
    from .models import Cluster

    if not settings.AUTO_REPAIR:
        return
    for cluster in Cluster.objects.filter(status__in=ClusterStatus.watched()).select_related("project"):
        watch(cluster)


@shared_task(soft_time_limit=120)
def run_due_scans():
    """Start every periodic health scan whose time has come."""
    from .health.schedule import run_due_scans

    return run_due_scans()


@shared_task(soft_time_limit=600)
def prune_health_results():
    from .health.schedule import prune_results

    return prune_results()
