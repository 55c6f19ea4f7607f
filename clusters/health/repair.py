"""Self-repair: detect a failing node, pick the action its failure's ladder says next, and run it as a
REPAIR operation (drain, act, resume, verify), with every step on the cluster timeline.

The ladder is data (policy.json). Attempts are counted on the node before the operation is enqueued,
so a worker killed mid-repair reruns the same operation (the same action) instead of escalating, and
steps already done are recorded in the operation so they are not done twice.
"""

import contextlib
import json
from functools import cache
from pathlib import Path

from django.conf import settings
from django.db import transaction

from ..backends import get_backend
from ..backends.base import Step
from ..choices import ClusterStatus, EventLevel, NodeRole, NodeState, OperationKind, OperationStatus
from ..models import Node, Operation
from . import FAIL, holds, scans

REASON_PREFIX = "tcc "
GAVE_UP = "gave up"


@cache
def policy():
    return json.loads((Path(__file__).resolve().parent / "policy.json").read_text())["failures"]


def worst(failures):
    """The failure that wins when a node has several: the highest priority."""
    return max(failures, key=lambda f: policy()[f]["priority"])


def next_action(node, failure):
    ladder = policy()[failure]["ladder"]
    taken = node.repairs.get(failure, 0)
    return ladder[taken] if taken < len(ladder) else None


def detect(cluster):
    """{node name: (failure, detail)} for compute nodes Slurm has given up on or a repair left drained."""
    from ..services import refresh_nodes

    if refresh_nodes(cluster):
        return {}  # Slurm itself is not answering: that is not a node's fault
    found = {}
    for node in cluster.nodes.filter(node_pool__role=NodeRole.COMPUTE, state=NodeState.READY):
        # slurm_state is the base state plus flags, e.g. "down+not_responding" or "idle+drain".
        parts, reason = node.slurm_state.lower().split("+"), node.slurm_reason
        if parts[0] == "down":
            found[node.name] = ("unresponsive", f"Slurm marked it {node.slurm_state} ({reason or 'no reason'})")
        elif ("drain" in parts or parts[0] in ("drain", "drained", "draining")) and reason.startswith(REASON_PREFIX):
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
    from ..services import record_event

    failing = outstanding(cluster)
    if failing:
        if not settings.AUTO_REPAIR:
            return None
        name = max(failing, key=lambda n: policy()[worst(failing[n])]["priority"])
        return start_repair(cluster, name, worst(failing[name]), f"failed {', '.join(failing[name])}", verify=True)
    if cluster.set_status(ClusterStatus.READY, expected=[ClusterStatus.VERIFYING]):
        record_event(cluster, "Cluster ready: every node passes its health checks again", operation=operation)
    return None


def verified(operation):
    """(passed, sentence) for a repair's verification scan of the repaired failure."""
    failure, node = operation.params["failure"], operation.params["node"]
    results = list(operation.health_results.filter(check_name=failure))
    failed = sorted(r.node for r in results if r.status == FAIL)
    skipped = operation.params.get("skipped_nodes", {})
    if node in skipped:
        return False, f"{node} could not be scanned again ({skipped[node]})"
    if failed:
        return False, f"{failure} still fails on {', '.join(failed)}"
    return True, f"{failure} passes on all {len(results)} scanned nodes"


def start_repair(cluster, node_name, failure, detail, user=None, verify=False):
    """Start the next rung of `failure`'s ladder on the node, or give up when none is left.

    With `verify` (a failure a check found), the repair ends with a scan of that check: the repair
    is judged by the check that failed, not by the action having run."""
    from ..services import record_event, start_operation

    with transaction.atomic():
        if cluster.operations.filter(status__in=OperationStatus.active()).exists():
            return None  # one operation at a time; the next watch tries again
        node = Node.objects.select_for_update().get(cluster=cluster, name=node_name)
        action = next_action(node, failure)
        record_event(cluster, f"Detected {failure} on {node_name}: {detail}", level=EventLevel.WARNING, node=node_name)
        if action is None:
            give_up(cluster, node, failure)
            return None
        node.repairs = {**node.repairs, failure: node.repairs.get(failure, 0) + 1}
        node.save(update_fields=["repairs"])
        return start_operation(
            cluster,
            OperationKind.REPAIR,
            user,
            f"Repairing {node_name} ({failure}): {action}",
            params={
                "node": node_name,
                "failure": failure,
                "action": action,
                "done": [],
                # A node drained for good cannot be scanned: verify only what comes back into service.
                **({"checks": [failure]} if verify and action != "drain" else {}),
            },
        )


def give_up(cluster, node, failure):
    from ..services import record_event

    with contextlib.suppress(Exception):
        get_backend(cluster.backend).drain(cluster, node.name, f"{REASON_PREFIX}{failure}: {GAVE_UP}")
    expected = [ClusterStatus.READY, ClusterStatus.VERIFYING]
    cluster.set_status(ClusterStatus.DEGRADED, expected=expected, message=f"{node.name} keeps failing")
    record_event(
        cluster,
        f"Gave up on {node.name}: {failure} persists after {', '.join(policy()[failure]['ladder'])}; "
        "it stays drained and the cluster is degraded",
        level=EventLevel.ERROR,
        node=node.name,
    )


def repair_steps(operation):
    cluster = operation.cluster
    backend = get_backend(cluster.backend)
    node, failure, action = operation.params["node"], operation.params["failure"], operation.params["action"]

    def once(name, fn):
        """Run a step's action once across reruns: its name is kept in the operation when done."""

        def run():
            if name in operation.params.get("done", []):
                return
            fn()
            operation.params = {**operation.params, "done": [*operation.params.get("done", []), name]}
            Operation.objects.filter(pk=operation.pk).update(params=operation.params)

        return Step(name, run)

    verify = bool(operation.params.get("checks"))
    steps = [once(f"Drain {node}", lambda: backend.drain(cluster, node, f"{REASON_PREFIX}{failure}: {action}"))]
    if action == "replace":
        # The replacement is held from users' jobs until the verification scan passes it.
        steps.append(once(f"Replace {node}", lambda: replace(cluster, node, operation if verify else None)))
    elif action != "drain":
        steps.append(
            once(f"{action.replace('_', ' ').capitalize()} {node}", lambda: getattr(backend, action)(cluster, node))
        )
        if verify:
            steps.append(holds.hold_step(operation, node))
        steps.append(Step(f"Resume {node}", lambda: backend.resume(cluster, node)))
    if verify:
        steps += scans.scan_steps(operation, prefix="Verify: ")
    return steps


def replace(cluster, name, operation=None):
    """A new node takes the failing one's place in its pool (the cluster keeps its size); with
    `operation`, the new node is held for that operation's verification scan."""
    from ..services import add_nodes

    old = Node.objects.select_related("node_pool").get(cluster=cluster, name=name)
    pool = old.node_pool
    if old.state != NodeState.DELETING:
        index = max(pool.nodes.values_list("index", flat=True)) + 1
        add_nodes(pool, [index])
        Node.objects.filter(node_pool=pool, index=index).update(repairs=old.repairs, state=NodeState.PROVISIONING)
        Node.objects.filter(pk=old.pk).update(state=NodeState.DELETING)
    hold = None
    if operation is not None:
        hold = holds.begin(operation, list(cluster.starting_nodes().values_list("name", flat=True)))
    for step in get_backend(cluster.backend).apply_steps(cluster, hold=hold):
        step.run()
    cluster.nodes.filter(state=NodeState.DELETING).delete()
    cluster.wanted_nodes().update(state=NodeState.READY)
