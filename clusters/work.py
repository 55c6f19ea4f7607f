"""What every unit of work shares, below the engine and the backends: the Step, the failures that say
whether a retry can help, and the heartbeat a waiting loop calls.

A step is `Step(name, run)`; the operations engine calls `run(ctx)` with a context that has
`heartbeat(detail)` (and the operation, its cluster, backend and checkpoint). Code deep inside a
step that has no context at hand (a backend's polling loop, `processes.wait_for`) calls the
module-level `heartbeat(detail)`, which reaches the context of the step running in this thread.
"""

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

from console.errors import FieldErrors, Unavailable


class BackendError(Exception):
    """A failure with a message fit for the operation's error and the cluster timeline."""

    retryable = False


class TransientBackendError(BackendError):
    """A retry can help: a port in use, no capacity in the zone, an API timeout, Slurm not answering."""

    retryable = True


class CapacityError(TransientBackendError):
    """No capacity in the zone or reservation right now (a stockout): waited out for hours, with the
    operation saying so, rather than retried a few times."""


class PermanentBackendError(BackendError):
    """A retry cannot help: a bad quota, a missing permission, a missing package."""

    retryable = False


def as_step_error(exc):
    """A service's refusal (a ConsoleError) as the operation's failure: retried when the cluster or the
    registry was only not answering (Unavailable), final otherwise."""
    error = TransientBackendError if isinstance(exc, Unavailable) else PermanentBackendError
    if isinstance(exc, FieldErrors):
        return error("; ".join(f"{field}: {' '.join(reasons)}" for field, reasons in exc.errors.items()))
    return error(exc.message)


@dataclass
class Step:
    """One named, idempotent unit of work; `run(ctx)` does it (ctx: see the module docstring)."""

    name: str
    run: object


_running = ContextVar("running_step", default=None)


def heartbeat(detail=""):
    """Prove to the engine that this worker is alive (and say what it waits for); outside a step, nothing.

    Every loop that waits (for a cloud operation, a daemon, a Slurm job) calls this, so a step that
    takes longer than OPERATION_STALE_AFTER is never taken for orphaned and claimed by another worker."""
    ctx = _running.get()
    if ctx is not None:
        ctx.heartbeat(detail)


@contextlib.contextmanager
def running(ctx):
    """Make `ctx` the one `heartbeat()` reaches while a step runs."""
    token = _running.set(ctx)
    try:
        yield ctx
    finally:
        _running.reset(token)
