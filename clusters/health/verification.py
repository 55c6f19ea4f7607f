"""Health's part of a create or a resize: the nodes it starts are held from users' jobs and scanned,
and the cluster is READY only if they pass (VERIFYING, with the failing nodes drained, if not).

This is an Extension of the lifecycle's CREATE and UPDATE kinds (registered in kinds.py): it holds
the new nodes before the backend's steps start them, adds the scan after those steps, and leaves its
verdict in the checkpoint for the lifecycle to settle the cluster by.
"""

from django.conf import settings

from ..choices import OperationKind
from . import holds, scans
from .repair import after_health
from .schedule import schedule_for

NOT_READY = "The failing nodes are drained; the cluster becomes ready once each is repaired and passes again."


def scanning(ctx):
    return settings.HEALTH_SCAN_BEFORE_READY and ctx.backend.runs_jobs


def prepare(ctx):
    """Before the backend's steps are listed: hold the nodes this operation starts (a create also gets
    its periodic scan schedule, from the installation's default)."""
    if ctx.operation.kind == OperationKind.CREATE:
        schedule_for(ctx.cluster)
    if not scanning(ctx):
        return
    new = list(ctx.cluster.starting_nodes().values_list("name", flat=True))
    if new:
        holds.begin(ctx, new)


def steps(ctx):
    return scans.scan_steps(prefix="First health scan: ") if scanning(ctx) and ctx.checkpoint.get("held") else []


def verdict(ctx):
    """End the hold (draining held nodes that did not pass) and judge the scan, for the lifecycle."""
    holds.end(ctx, "failed its first health scan")
    creating = ctx.operation.kind == OperationKind.CREATE
    if ctx.operation.health_results.exists():
        summary, failing = scans.summary(ctx.operation)
        if failing:
            found = {
                "failing": True,
                "message": summary.replace("Health scan done", "First health scan"),
                "not_ready": NOT_READY,
            }
        else:
            of = "" if creating else f" of {', '.join(ctx.checkpoint.get('held', []))}"
            found = {"failing": False, "note": f"; the first health scan{of} passed"}
    elif creating and settings.HEALTH_SCAN_BEFORE_READY and not ctx.backend.runs_jobs:
        backend = ctx.cluster.backend
        found = {
            "failing": False,
            "note": f" (no first health scan: the {backend} backend cannot run jobs from the console yet)",
        }
    else:
        found = {}
    ctx.checkpoint.set("verdict", found)


def follow_up(ctx):
    """A failing first scan: start repairing the worst failure (the operation has finished by now)."""
    if (ctx.checkpoint.get("verdict") or {}).get("failing"):
        after_health(ctx.cluster, ctx.operation)


def failed(ctx, message):
    holds.end_after_failure(ctx)
