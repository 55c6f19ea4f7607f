"""Self-repair: detect a failing node, pick the action its failure's ladder says next, and run it as a
REPAIR operation (drain, act, resume, verify), with every step on the cluster timeline.

The ladder is data (policy.json, read by policy.py). Attempts are counted on the node before the
operation is enqueued, so a worker killed mid-repair reruns the same operation (the same action)
instead of escalating, and steps already done are kept in the operation's checkpoint ("done") so they
are not done twice.
"""

import contextlib

from django.conf import settings
from django.db import transaction

from console.errors import Conflict, ConsoleError

from .. import services
from ..choices import ClusterStatus, EventLevel, NodeRole, NodeState, OperationKind
from ..events import record_event
from ..models import Node
from ..operations import start
from ..slurm.states import is_down, is_drained
from ..topology import add_nodes, settle_nodes
from ..work import Step
from . import FAIL, holds, scans
from .policy import GAVE_UP, REASON_PREFIX, next_action, policy, worst


def detect(cluster):
    """{node name: (failure, detail)} for compute nodes Slurm has given up on or a repair left drained."""
    if services.sync_cluster(cluster, hooks=False):
        return {}  # Slurm itself is not answering: that is not a node's fault
    found = {}
    for node in cluster.nodes.filter(node_pool__role=NodeRole.COMPUTE, state=NodeState.READY):
        reason = node.slurm_reason
        if is_down(node.slurm_state):
            found[node.name] = ("unresponsive", f"Slurm marked it {node.slurm_state} ({reason or 'no reason'})")
        elif is_drained(node.slurm_state) and reason.startswith(REASON_PREFIX):
            failure = reason[len(REASON_PREFIX) :].split(":")[0]
            if failure in policy():
                found[node.name] = (failure, f"still drained after '{reason}'")
    return found


def watch(cluster):
    """Start a repair for the worst failing node, if the cluster is free; returns the operation or None."""
    if cluster.status not in ClusterStatus.watched():
        return None
    failing = detect(cluster)
    if not failing:
        # A verifying cluster whose last repair failed outright (no verification ran) goes on here.
        return after_health(cluster) if cluster.status == ClusterStatus.VERIFYING else None
    name = max(failing, key=lambda n: policy()[failing[n][0]]["priority"])
    failure, detail = failing[name]
    return start_repair(cluster, name, failure, detail)


def outstanding(cluster):
    """{node: [checks]}: each current compute node's checks whose latest result is a failure with a
    ladder, except on nodes the console already gave up on (they stay drained; the cluster is DEGRADED)."""
    nodes = {n.name: n for n in cluster.compute_nodes()}
    found = {}
    for name, results in scans.latest_per_check(cluster).items():
        node = nodes.get(name)
        if node is None or node.slurm_reason.endswith(GAVE_UP):
            continue
        failed = sorted(c for c, r in results.items() if r.status == FAIL and c in policy())
        if failed:
            found[name] = failed
    return found


def after_health(cluster, operation=None):
    """After a scan or a repair's verification: repair the worst failure still outstanding, one
    operation at a time (returns it); once none is left, a VERIFYING cluster (its first scan failed)
    is READY."""
    failing = outstanding(cluster)
    if failing:
        if not settings.AUTO_REPAIR:
            return None
        name = max(failing, key=lambda n: policy()[worst(failing[n])]["priority"])
        failure = worst(failing[name])
        result = scans.latest_per_check(cluster)[name][failure]
        why = result.reason  # the check's own words, e.g. the GPU
        detail = f"failed {', '.join(failing[name])}" + (f" ({why})" if why else "")
        return start_repair(cluster, name, failure, detail, verify=True, start_at=result.repair)
    if cluster.set_status(ClusterStatus.READY, expected=[ClusterStatus.VERIFYING]):
        record_event(cluster, "Cluster ready: every node passes its health checks again", operation=operation)
    return None


def verified(ctx):
    """(passed, sentence) for a repair's verification scan of the repaired failure."""
    failure, node = ctx.params["failure"], ctx.params["node"]
    results = list(ctx.operation.health_results.filter(check_name=failure))
    failed = sorted(r.node for r in results if r.status == FAIL)
    skipped = ctx.checkpoint.get("skipped_nodes", {})
    if node in skipped:
        return False, f"{node} could not be scanned again ({skipped[node]})"
    if failed:
        return False, f"{failure} still fails on {', '.join(failed)}"
    return True, f"{failure} passes on all {len(results)} scanned nodes"


def start_repair(cluster, node_name, failure, detail, user=None, verify=False, start_at=""):
    """Start the next rung of `failure`'s ladder on the node, or give up when none is left; None when
    another operation is running (the next watch tries again).

    With `verify` (a failure a check found), the repair ends with a scan of that check: the repair
    is judged by the check that failed, not by the action having run. `start_at` (the check's word,
    HealthResult.repair) skips the rungs before it: a GPU that meets NVIDIA's RMA criteria is replaced
    without a reboot first, which would cost the node's jobs a drain and the cluster a scan for nothing."""
    if cluster.active_operation() is not None:
        return None
    try:
        with transaction.atomic():
            node = Node.objects.select_for_update().get(cluster=cluster, name=node_name)
            action = next_action(node, failure, start_at)
            ladder = policy()[failure]["ladder"]
            skipped = ladder[node.repairs.get(failure, 0) : ladder.index(action)] if action else []
            if skipped:
                detail += f"; no {' or '.join(skipped)} can fix that: starting at {action}"
            record_event(
                cluster, f"Detected {failure} on {node_name}: {detail}", level=EventLevel.WARNING, node=node_name
            )
            if action is None:
                give_up(cluster, node, failure)
                return None
            node.repairs = {**node.repairs, failure: ladder.index(action) + 1}
            node.save(update_fields=["repairs"])
            return start(
                cluster,
                OperationKind.REPAIR,
                user=user,
                message=f"Repairing {node_name} ({failure}): {action}",
                params={
                    "node": node_name,
                    "failure": failure,
                    "action": action,
                    # A node drained for good cannot be scanned: verify only what comes back into service.
                    **({"checks": [failure]} if verify and action != "drain" else {}),
                },
            )
    except Conflict:
        return None  # another operation started meanwhile; nothing of this attempt is kept


def give_up(cluster, node, failure):
    with contextlib.suppress(ConsoleError):
        services.drain(cluster, node.name, f"{REASON_PREFIX}{failure}: {GAVE_UP}")
    expected = [ClusterStatus.READY, ClusterStatus.VERIFYING]
    cluster.set_status(ClusterStatus.DEGRADED, expected=expected, message=f"{node.name} keeps failing")
    record_event(
        cluster,
        f"Gave up on {node.name}: {failure} persists after {', '.join(policy()[failure]['ladder'])}; "
        "it stays drained and the cluster is degraded",
        level=EventLevel.ERROR,
        node=node.name,
    )


def once(name, fn):
    """A step whose action runs once across reruns: its name goes in the checkpoint's "done" when done."""

    def run(ctx):
        if name in ctx.checkpoint.get("done", []):
            return
        fn(ctx)
        ctx.checkpoint.set("done", [*ctx.checkpoint.get("done", []), name])

    return Step(name, run)


def repair_steps(ctx):
    node, failure, action = ctx.params["node"], ctx.params["failure"], ctx.params["action"]
    verify = bool(ctx.params.get("checks"))
    steps = [
        once(f"Drain {node}", lambda ctx: ctx.backend.drain(ctx.cluster, node, f"{REASON_PREFIX}{failure}: {action}"))
    ]
    if action == "replace":
        # The replacement is held from users' jobs until the verification scan passes it.
        steps.append(once(f"Replace {node}", lambda ctx: replace(ctx, node, hold=verify)))
    elif action != "drain":
        act = f"{action.replace('_', ' ').capitalize()} {node}"
        steps.append(once(act, lambda ctx: getattr(ctx.backend, action)(ctx.cluster, node)))
        if verify:
            steps.append(holds.hold_step(node))
        steps.append(Step(f"Resume {node}", lambda ctx: ctx.backend.resume(ctx.cluster, node)))
    if verify:
        steps += scans.scan_steps(prefix="Verify: ")
    return steps


def replace(ctx, name, hold=False):
    """A new node takes the failing one's place in its pool (the cluster keeps its size); with `hold`,
    the new node is held for this operation's verification scan."""
    cluster = ctx.cluster
    old = Node.objects.select_related("node_pool").get(cluster=cluster, name=name)
    pool = old.node_pool
    if old.state != NodeState.DELETING:
        index = max(pool.nodes.values_list("index", flat=True)) + 1
        add_nodes(pool, [index], repairs=old.repairs, state=NodeState.PROVISIONING)
        Node.objects.filter(pk=old.pk).update(state=NodeState.DELETING)
    name = holds.begin(ctx, list(cluster.starting_nodes().values_list("name", flat=True))) if hold else None
    for step in ctx.backend.apply_steps(cluster, hold=name):
        step.run(ctx)
    settle_nodes(cluster)


def release_hold(ctx):
    """The repair's last step is done: end the hold (draining the node if its verification failed)."""
    holds.end(ctx, f"{ctx.params['action']} did not fix it", failure=ctx.params["failure"])


def announce(ctx):
    """A finished repair on the timeline (judged by its verification, when it had one), then the next."""
    node, failure, action = ctx.params["node"], ctx.params["failure"], ctx.params["action"]
    if not ctx.operation.health_results.exists():
        record_event(ctx.cluster, f"Repaired {node} ({failure}) by {action}", operation=ctx.operation, node=node)
        return
    ok, detail = verified(ctx)
    record_event(
        ctx.cluster,
        f"Repaired {node} ({failure}) by {action}: {detail}" if ok else f"{action} did not fix {failure}: {detail}",
        level=EventLevel.INFO if ok else EventLevel.WARNING,
        operation=ctx.operation,
        node=node,
    )
    after_health(ctx.cluster, ctx.operation)


def failed(ctx, message):
    """A failed repair: its held node stays drained; a replacement that never came up is FAILED."""
    holds.end_after_failure(ctx)
    ctx.cluster.wanted_nodes().filter(state=NodeState.PROVISIONING).update(state=NodeState.FAILED)
