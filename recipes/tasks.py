"""Every Celery task of recipes, thin: each takes ids and calls the service function it is named for.
Imported by the app's ready(), so a worker has them all; services enqueue them by name
(recipes.queue.later)."""

from celery import shared_task

from .registry import RegistryUnavailable, track_and_register
from .serving import reconcile_all, reconcile_one


@shared_task(
    soft_time_limit=600, autoretry_for=(RegistryUnavailable,), retry_backoff=5, retry_kwargs={"max_retries": 8}
)
def track_run(run_id):
    """Log a run's new metrics to MLflow and register it once it completed (registry.track_and_register)."""
    track_and_register(run_id)


@shared_task(soft_time_limit=120)
def reconcile_endpoints():
    """Drive every live (or deleting) endpoint one step (serving.reconcile_all)."""
    reconcile_all()


@shared_task(soft_time_limit=120)
def reconcile_endpoint(endpoint_id):
    """Drive one endpoint one step, right after a change (serving.reconcile_one)."""
    reconcile_one(endpoint_id)
