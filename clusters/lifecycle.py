"""Create, update (resize) and delete: the cluster lifecycle's operation kinds, registered with the engine.

The requests that start them are in clusters.services; the work is the backend's steps. A create or
resize may be extended by other modules (health's first scan holds the new nodes and scans them):
an extension leaves its verdict in the checkpoint under "verdict" ({"failing", "message",
"not_ready", "note"}), and the cluster is READY, or VERIFYING when the verdict says it is failing.
"""

from .choices import ClusterStatus, EventLevel, NodeState, OperationKind
from .events import record_event
from .operations import Kind, kind, register
from .topology import settle_nodes

TYPE = "ModelDevelopmentClusterOperationMetadata"


def mark_provisioning(ctx):
    ctx.cluster.wanted_nodes().filter(state=NodeState.PENDING).update(state=NodeState.PROVISIONING)


def apply_steps(ctx):
    return ctx.backend.apply_steps(ctx.cluster, hold=ctx.checkpoint.get("hold"))


def delete_steps(ctx):
    return ctx.backend.delete_steps(ctx.cluster)


def compute_nodes_sentence(cluster):
    count = cluster.compute_nodes().count()
    return f"{count} compute node{'s' if count != 1 else ''} idle in Slurm"


def settle(ctx):
    """The last step is done: nodes settle, and the cluster is READY, or VERIFYING on a failing verdict."""
    busy = kind(ctx.operation.kind).busy_status
    verdict = ctx.checkpoint.get("verdict") or {}
    settle_nodes(ctx.cluster)
    if verdict.get("failing"):
        ctx.cluster.set_status(ClusterStatus.VERIFYING, expected=[busy], message=verdict["message"])
    else:
        ctx.cluster.set_status(ClusterStatus.READY, expected=[busy])


def announce(ctx, done, ready):
    cluster, verdict = ctx.cluster, ctx.checkpoint.get("verdict") or {}
    nodes = compute_nodes_sentence(cluster)
    if verdict.get("failing"):
        record_event(
            cluster,
            f"{done} ({nodes}) but not ready: {cluster.status_message}. {verdict.get('not_ready', '')}".strip(),
            level=EventLevel.WARNING,
            operation=ctx.operation,
        )
    else:
        record_event(cluster, f"{ready}: {nodes}{verdict.get('note', '')}", operation=ctx.operation)


def failed(status):
    """An on_failure hook: the cluster leaves the kind's busy status for `status` (with the error as its
    message), and the nodes the operation was bringing up are FAILED."""

    def hook(ctx, message):
        ctx.cluster.set_status(status, expected=[kind(ctx.operation.kind).busy_status], message=message)
        ctx.cluster.wanted_nodes().filter(state=NodeState.PROVISIONING).update(state=NodeState.FAILED)

    return hook


def deleted(ctx):
    ctx.cluster.nodes.all().delete()
    ctx.cluster.set_status(ClusterStatus.DELETED, expected=[ClusterStatus.DELETING])


register(
    Kind(
        name=OperationKind.CREATE,
        label="Create",
        metadata_type=f"Create{TYPE}",
        starts_from=frozenset({ClusterStatus.DRAFT}),
        busy_status=ClusterStatus.PROVISIONING,
        prepare=mark_provisioning,
        steps=apply_steps,
        on_success=settle,
        after_success=lambda ctx: announce(ctx, "Cluster provisioned", "Cluster ready"),
        on_failure=failed(ClusterStatus.FAILED),
    )
)
register(
    Kind(
        name=OperationKind.UPDATE,
        label="Update",
        metadata_type=f"Update{TYPE}",
        starts_from=frozenset(ClusterStatus.usable()),
        busy_status=ClusterStatus.UPDATING,
        prepare=mark_provisioning,
        steps=apply_steps,
        on_success=settle,
        after_success=lambda ctx: announce(ctx, "Update done", "Update done"),
        on_failure=failed(ClusterStatus.DEGRADED),  # the cluster runs, resized or not
    )
)
register(
    Kind(
        name=OperationKind.DELETE,
        label="Delete",
        metadata_type=f"Delete{TYPE}",
        starts_from=frozenset(ClusterStatus.deletable() - {ClusterStatus.DRAFT}),
        busy_status=ClusterStatus.DELETING,
        steps=delete_steps,
        on_success=deleted,
        after_success=lambda ctx: record_event(
            ctx.cluster, "Cluster deleted; every process and file it had is gone", operation=ctx.operation
        ),
        on_failure=failed(ClusterStatus.FAILED),
        response="empty",
    )
)
