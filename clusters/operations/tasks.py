"""Thin Celery tasks over the engine; they take ids, never model instances.

The task names are the ones these tasks had when they lived in clusters.tasks, so messages already
queued by an older console still find them.
"""

from celery import shared_task
from django.conf import settings

from ..work import CapacityError, TransientBackendError
from . import engine


@shared_task(bind=True, name="clusters.tasks.run_operation_task", soft_time_limit=3600, time_limit=3700)
def run_operation_task(self, operation_id, stale_after=None):
    try:
        engine.run(operation_id, stale_after=stale_after)
    except CapacityError as exc:  # the engine keeps its clock (waiting_since) and says when it gives up
        raise self.retry(exc=exc, countdown=settings.OPERATION_CAPACITY_RETRY_SECONDS, max_retries=None) from None
    except TransientBackendError as exc:
        attempts = engine.attempts(operation_id)  # counted per operation, across messages and workers
        if attempts > settings.OPERATION_MAX_RETRIES:
            engine.fail(operation_id, f"{exc} (gave up after {attempts} attempts)")
            return
        raise self.retry(exc=exc, countdown=min(60, 2**attempts), max_retries=None) from None


@shared_task(name="clusters.tasks.resume_stale_operations", soft_time_limit=60)
def resume_stale_operations(stale_after=None):
    """Enqueue again every operation whose worker died or whose message was lost; returns their ids."""
    ids = engine.stale(stale_after)
    for pk in ids:
        run_operation_task.delay(pk, stale_after=stale_after)
    return ids
