"""The operations engine: claim an operation, run its kind's steps with a context, finish or fail it.

Whatever the kind, an operation is worked the same way:

* **Claim**: a compare-and-set takes a PENDING operation, or a RUNNING one whose heartbeat is older
  than OPERATION_STALE_AFTER (its worker died). A second delivery of the task finds nothing to claim.
* **Steps**: the kind's steps, then those of any extension, each `run(ctx)` in order, with progress
  on the Operation row. Steps are idempotent: a resumed operation runs them all again.
* **Heartbeat**: `ctx.heartbeat(detail)` (or `clusters.work.heartbeat()` deep inside a step) proves
  the worker alive; a worker whose claim was taken over gets LostClaim on its next write and stops.
* **Finish**: the kind's success hooks; **fail**: its failure hooks and the error on the timeline. A
  TransientBackendError (or the task's soft time limit) hands the operation back for a retry.
"""

import logging
import time
from datetime import timedelta
from functools import cached_property

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ..backends import get_backend
from ..choices import EventLevel, OperationStatus
from ..events import record_event
from ..models import Operation
from ..work import BackendError, CapacityError, TransientBackendError, running
from . import registry

log = logging.getLogger(__name__)


class LostClaim(Exception):
    """Another worker took this operation over (it judged this one dead); stop without touching it."""


class Context:
    """What a step and a kind's hooks get: the operation, its cluster and backend, its request
    (`params`) and checkpoint, and `heartbeat(detail)`."""

    def __init__(self, operation):
        self.operation = operation
        self.cluster = operation.cluster
        self.attempt = operation.attempts
        self.step = operation.step
        self._beat_at, self._detail = 0.0, None

    @cached_property
    def backend(self):
        return get_backend(self.cluster.backend)

    @property
    def params(self):
        return self.operation.params

    @property
    def checkpoint(self):
        return self.operation.checkpoint

    def heartbeat(self, detail=""):
        """Write a heartbeat (and the step with `detail` in brackets) when the detail changed or the
        last one is older than a fifth of OPERATION_STALE_AFTER; raise LostClaim when the operation is
        no longer ours."""
        now = time.monotonic()
        if detail == self._detail and now - self._beat_at < heartbeat_interval():
            return
        self._beat_at, self._detail = now, detail
        step = f"{self.step} ({detail})" if detail else self.step
        if not self.operation.beat(attempt=self.attempt, step=step):
            raise LostClaim(f"operation {self.operation.uuid} was taken over by another worker")

    def report(self, progress, step, message=""):
        self.step = step
        if not self.operation.report(attempt=self.attempt, progress=progress, step=step, message=message):
            raise LostClaim(f"operation {self.operation.uuid} was taken over by another worker")


def heartbeat_interval():
    return max(0.5, min(10.0, settings.OPERATION_STALE_AFTER / 5))


def run(operation_id, stale_after=None):
    """Claim and run an operation; a second delivery of a finished or running one does nothing.

    A RUNNING operation is taken over only when its worker has been silent for `stale_after` seconds.
    """
    operation = Operation.objects.select_related("cluster__project").filter(pk=operation_id).first()
    if operation is None or operation.is_done:
        return
    stale_after = settings.OPERATION_STALE_AFTER if stale_after is None else stale_after
    if not operation.claim(stale_before=timezone.now() - timedelta(seconds=stale_after)):
        log.info("operation %s is being worked elsewhere; skipping", operation_id)
        return
    if operation.attempts > settings.OPERATION_MAX_RETRIES + 1:
        # The budget is the operation's own (its attempts column), not a Celery message's retry
        # count: a resumed operation arrives in a fresh message, so a step that keeps killing its
        # worker would otherwise be retried for ever.
        fail(operation.pk, f"gave up after {operation.attempts - 1} attempts ({operation.step or 'before a step'})")
        return
    kind, extensions = registry.kind(operation.kind), registry.extensions(operation.kind)
    ctx = Context(operation)
    if operation.attempts > 1:
        record_event(ctx.cluster, f"Resuming {kind.label.lower()} (attempt {operation.attempts})", operation=operation)
    try:
        for hook in [kind.prepare, *(e.prepare for e in extensions)]:
            hook(ctx)
        steps = [
            *(step for e in extensions for step in e.first_steps(ctx)),
            *kind.steps(ctx),
            *(step for e in extensions for step in e.steps(ctx)),
        ]
        run_steps(ctx, steps)
        for hook in [*(e.on_success for e in extensions), kind.on_success]:
            hook(ctx)
        if not operation.finish(OperationStatus.SUCCEEDED, attempt=ctx.attempt):
            raise LostClaim(f"operation {operation.uuid} was taken over before it finished")
        for hook in [kind.after_success, *(e.after_success for e in extensions)]:
            hook(ctx)
    except LostClaim as exc:
        log.warning("%s; this worker stops", exc)
    except SoftTimeLimitExceeded:
        operation.release(f"Will resume: '{ctx.step}' ran past the task's time limit", attempt=ctx.attempt)
        raise TransientBackendError(f"'{ctx.step}' ran past the task's time limit; it will resume") from None
    except CapacityError as exc:
        if wait_for_capacity(operation, ctx, exc):
            raise
    except TransientBackendError as exc:
        operation.release(f"Will retry: {exc}", attempt=ctx.attempt)
        raise
    except BackendError as exc:
        fail(operation.pk, str(exc))
    except Exception as exc:
        log.exception("operation %s failed", operation_id)
        fail(operation.pk, f"Internal error: {exc.__class__.__name__}: {exc}")


def run_steps(ctx, steps):
    total = len(steps)
    with running(ctx):
        for i, step in enumerate(steps):
            ctx.report(progress=round(100 * i / total), step=step.name)
            started = time.monotonic()
            step.run(ctx)
            ctx.report(
                progress=round(100 * (i + 1) / total),
                step=step.name,
                message=f"{step.name}: done in {time.monotonic() - started:.1f} s",
            )


def wait_for_capacity(operation, ctx, exc):
    """A stockout: try again in OPERATION_CAPACITY_RETRY_SECONDS, saying so on the operation (and the
    timeline, the first time), until OPERATION_CAPACITY_WAIT_HOURS after the first one; then fail.
    Returns whether it waits (False: it failed)."""
    now = timezone.now()
    since = operation.waiting_since or now
    gives_up = since + timedelta(hours=settings.OPERATION_CAPACITY_WAIT_HOURS)
    if now >= gives_up:
        fail(operation.pk, f"{exc}; still none after {settings.OPERATION_CAPACITY_WAIT_HOURS:g} h of waiting")
        return False
    retry_at = min(now + timedelta(seconds=settings.OPERATION_CAPACITY_RETRY_SECONDS), gives_up)
    message = (
        f"Waiting for capacity (since {since:%H:%M} UTC, next try {retry_at:%H:%M}, "
        f"gives up {gives_up:%Y-%m-%d %H:%M} UTC): {exc}"
    )
    first = operation.waiting_since is None
    operation.wait_for_capacity(message, attempt=ctx.attempt, since=since, retry_at=retry_at)
    if first:
        record_event(ctx.cluster, message, level=EventLevel.WARNING, operation=operation)
    return True


def attempts(operation_id):
    return Operation.objects.filter(pk=operation_id).values_list("attempts", flat=True).first() or 0


def fail(operation_id, message):
    """Mark the operation failed, run its kind's failure hooks and put the error on the timeline."""
    operation = Operation.objects.select_related("cluster__project").get(pk=operation_id)
    if not operation.finish(OperationStatus.FAILED, error=message):
        return
    kind, ctx = registry.kind(operation.kind), Context(operation)
    for hook in [*(e.on_failure for e in registry.extensions(operation.kind)), kind.on_failure]:
        hook(ctx, message)
    record_event(
        ctx.cluster,
        f"{kind.label} failed at '{operation.step}': {message}",
        level=EventLevel.ERROR,
        operation=operation,
    )


def stale(stale_after=None):
    """Ids of operations whose worker died (silent too long) or whose message was lost (never claimed)."""
    stale_after = settings.OPERATION_STALE_AFTER if stale_after is None else stale_after
    cutoff = timezone.now() - timedelta(seconds=stale_after)
    waited_out = Q(not_before__isnull=True) | Q(not_before__lte=timezone.now())  # not one waiting for capacity
    found = Operation.objects.filter(status=OperationStatus.RUNNING, heartbeat__lt=cutoff) | Operation.objects.filter(
        waited_out, status=OperationStatus.PENDING, created__lt=cutoff
    )
    return list(found.values_list("pk", flat=True))
