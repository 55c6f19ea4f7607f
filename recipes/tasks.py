"""Every Celery task of recipes, thin: each takes ids and calls the service function it is named for.
Imported by the app's ready(), so a worker has them all; services enqueue them by name
(recipes.queue.later)."""

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from console import rounds

from .registry import CopyBusy, RegistryUnavailable, copy_checkpoint, keep_files, track_and_register
from .serving import due, reconcile_one


@shared_task(
    soft_time_limit=600, autoretry_for=(RegistryUnavailable,), retry_backoff=5, retry_kwargs={"max_retries": 8}
)
def track_run(run_id):
    """Log a run's new metrics to MLflow, register it once it completed (registry.track_and_register) and
    keep its newest checkpoint and TensorBoard files in the registry (registry.keep_files)."""
    track_and_register(run_id)
    keep_files(run_id)


@shared_task(
    name="recipes.tasks.copy_checkpoint", soft_time_limit=3000, time_limit=3300,
    autoretry_for=(RegistryUnavailable, SoftTimeLimitExceeded, CopyBusy), retry_backoff=30,
    retry_kwargs={"max_retries": 24},
)  # fmt: skip
def copy_checkpoint_task(run_id, step):
    """Copy a run's large checkpoint from its cluster into the registry (registry.copy_checkpoint). Under
    the broker's hour (CELERY_VISIBILITY_TIMEOUT): a copy stopped by the time limit goes on, file by file,
    in the next try; a second task for the same copy (a redelivery) waits its turn (CopyBusy), and takes
    the copy over once its owner has shown no progress for 30 minutes."""
    copy_checkpoint(run_id, step)


@shared_task(soft_time_limit=30)
def reconcile_endpoints():
    """One round per live endpoint, each a task of its own, unless one for it still waits (console/rounds.py)."""
    for endpoint_id in due():
        rounds.send(reconcile_endpoint, "reconcile", endpoint_id)


@shared_task(soft_time_limit=120)
def reconcile_endpoint(endpoint_id):
    """Drive one endpoint one step (serving.reconcile_one; its lease keeps two rounds apart)."""
    rounds.started("reconcile", endpoint_id)
    reconcile_one(endpoint_id)
