"""Holds: a node new to a cluster (create, resize, replacement) or just repaired takes no user job until
a scan has passed it.

The operation puts the node in a hold (a Slurm reservation on the local backend) before it can take a
job, its scan job asks for the hold, and when the operation ends the hold does too: a held node that
did not pass is drained first, with a reason the repair watcher reads, so it never runs a user's job.
"""

from ..backends import get_backend
from ..backends.base import Step
from ..models import Operation
from . import FAIL

UNVERIFIED = "unverified"


def name_for(operation):
    return f"tcc-hold-{str(operation.uuid)[:8]}"


def begin(operation, nodes):
    """Record that `nodes` are held for this operation's scan; returns the hold's name."""
    params = operation.params
    held = sorted(set(params.get("held", [])) | set(nodes))
    operation.params = {**params, "hold": name_for(operation), "held": held}
    Operation.objects.filter(pk=operation.pk).update(params=operation.params)
    return operation.params["hold"]


def hold_step(operation, node):
    """The step that holds an existing node (a repaired one) before it is resumed."""

    def run():
        get_backend(operation.cluster.backend).hold(operation.cluster, begin(operation, [node]), [node])

    return Step(f"Hold {node} for its verification scan", run)


def failed(operation):
    """{held node: the checks it failed, or [] when this operation has no result for it}."""
    results = {}
    for result in operation.health_results.filter(node__in=operation.params.get("held", [])):
        results.setdefault(result.node, []).append(result)
    found = {}
    for node in operation.params.get("held", []):
        failing = sorted(r.check_name for r in results.get(node, []) if r.status == FAIL)
        if failing or node not in results:
            found[node] = failing
    return found


def end(operation, why, failure=None):
    """Drain the held nodes that did not pass (reason `tcc <check>: <why>`; `failure`, or 'unverified',
    for a node without results), then end the hold. Done once; returns the drained nodes."""
    from .repair import REASON_PREFIX, policy, worst

    params = operation.params
    if "hold" not in params or params.get("released"):
        return {}
    cluster = operation.cluster
    backend = get_backend(cluster.backend)
    bad = failed(operation)
    for node, checks in bad.items():
        known = [c for c in checks if c in policy()]
        check = worst(known) if known else failure or UNVERIFIED
        backend.drain(cluster, node, f"{REASON_PREFIX}{check}: {why}")
    backend.release(cluster, params["hold"])
    operation.params = {**params, "released": True}
    Operation.objects.filter(pk=operation.pk).update(params=operation.params)
    return bad
