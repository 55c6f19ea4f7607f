"""Staging: a registered version copied onto a cluster's shared home as an operation of its own (kind
STAGE). Not exclusive (it only writes into the shared home: runs, scans and other stagings go on
beside it); it heartbeats while it downloads from the registry and writes through the cluster agent,
so the engine resumes it elsewhere if its worker dies, and shows its progress like any operation.

Serving starts one before a roll's first replica, and the periodic reconcile only looks at how it
went: a copy of a large model inside the reconcile ran into that task's time limit and aborted the
round for every endpoint."""

from clusters import operations
from clusters.choices import ClusterStatus
from clusters.work import PermanentBackendError, Step, as_step_error
from console.errors import ConsoleError

from ..models import ModelVersion
from .versions import stage

STAGE = "STAGE"


def start_staging(cluster, version, user=None):
    """The STAGE operation copying `version` onto `cluster` (ConsoleError: a busy or unusable cluster,
    a task queue that does not answer)."""
    return operations.start(cluster, STAGE, message=f"Staging {version.ref} onto the cluster", user=user,
                            params={"version_id": version.pk, "version": version.ref})  # fmt: skip


def copy(ctx):
    version = ModelVersion.objects.filter(pk=ctx.params["version_id"]).first()
    if version is None:
        raise PermanentBackendError(f"{ctx.params.get('version', 'the version')} was deleted")
    try:
        stage(version, ctx.cluster)
    except ConsoleError as exc:  # retried when the registry or the cluster was only not answering
        raise as_step_error(exc) from None


operations.register(
    operations.Kind(
        name=STAGE,
        label="Model staging",
        metadata_type="GenericOperationMetadata",
        starts_from=frozenset(ClusterStatus.usable()),
        steps=lambda ctx: [Step(f"Copy {ctx.params.get('version', 'the version')} onto the cluster", copy)],
        response="empty",
        exclusive=False,
    )
)
