"""Holds: a node new to a cluster (create, resize, replacement) or just repaired takes no user job until
a scan has passed it.

The operation puts the node in a hold (a Slurm reservation on the local backend) before it can take a
job, its scan job asks for the hold, and when the operation ends the hold does too: a held node that
did not pass is drained first, with a reason the repair watcher reads, so it never runs a user's job.
The hold's name and nodes are in the operation's checkpoint ("hold", "held", "released").
"""

from ..choices import EventLevel, OperationKind
from ..events import record_event
from ..operations import kind
from ..work import BackendError, Step
from . import FAIL
from .policy import REASON_PREFIX, policy, worst

UNVERIFIED = "unverified"


def name_for(operation):
    return f"tcc-hold-{str(operation.uuid)[:8]}"


def begin(ctx, nodes):
    """Record that `nodes` are held for this operation's scan; returns the hold's name."""
    held = sorted(set(ctx.checkpoint.get("held", [])) | set(nodes))
    ctx.checkpoint.set("held", held)
    return ctx.checkpoint.set("hold", name_for(ctx.operation))


def hold_step(node):
    """The step that holds an existing node (a repaired one) before it is resumed."""

    def run(ctx):
        ctx.backend.hold(ctx.cluster, begin(ctx, [node]), [node])

    return Step(f"Hold {node} for its verification scan", run)


def failed(ctx):
    """{held node: the checks it failed, or [] when this operation has no result for it}."""
    held = ctx.checkpoint.get("held", [])
    results = {}
    for result in ctx.operation.health_results.filter(node__in=held):
        results.setdefault(result.node, []).append(result)
    found = {}
    for node in held:
        failing = sorted(r.check_name for r in results.get(node, []) if r.status == FAIL)
        if failing or node not in results:
            found[node] = failing
    return found


def end(ctx, why, failure=None):
    """Drain the held nodes that did not pass (reason `tcc <check>: <why>`; `failure`, or 'unverified',
    for a node without results), then end the hold. Done once; returns the drained nodes."""
    if "hold" not in ctx.checkpoint or ctx.checkpoint.get("released"):
        return {}
    bad = failed(ctx)
    for node, checks in bad.items():
        known = [c for c in checks if c in policy()]
        check = worst(known) if known else failure or UNVERIFIED
        ctx.backend.drain(ctx.cluster, node, f"{REASON_PREFIX}{check}: {why}")
    ctx.backend.release(ctx.cluster, ctx.checkpoint["hold"])
    ctx.checkpoint.set("released", True)
    return bad


def end_after_failure(ctx, message=""):
    """A failed operation's held nodes that no scan passed stay out of service (drained), the rest return.

    Not for a create: its cluster is FAILED as a whole (its Slurm may never have started)."""
    if ctx.operation.kind == OperationKind.CREATE or "hold" not in ctx.checkpoint:
        return
    label = kind(ctx.operation.kind).label.lower()
    try:
        drained = end(ctx, "its operation failed before a scan passed it", failure=ctx.params.get("failure"))
    except BackendError as exc:
        record_event(
            ctx.cluster,
            f"Could not end hold {ctx.checkpoint['hold']}: {exc}",
            level=EventLevel.ERROR,
            operation=ctx.operation,
        )
        return
    if drained:
        record_event(
            ctx.cluster,
            f"Drained {', '.join(drained)}: {label} failed before a scan passed them",
            level=EventLevel.WARNING,
            operation=ctx.operation,
        )
