"""Health's operation kinds, registered with the engine: SCAN and REPAIR, and the first scan that
extends the lifecycle's CREATE and UPDATE (verification.py)."""

from ..choices import ClusterStatus, OperationKind
from ..operations import Extension, Kind, extend, register
from . import repair, scans, verification


def scan_done(ctx):
    scans.announce(ctx)
    repair.after_health(ctx.cluster, ctx.operation)


register(
    Kind(
        name=OperationKind.SCAN,
        label="Health scan",
        metadata_type="GenericOperationMetadata",
        starts_from=frozenset(ClusterStatus.watched()),
        steps=lambda ctx: scans.scan_steps(),
        after_success=scan_done,
    )
)
register(
    Kind(
        name=OperationKind.REPAIR,
        label="Repair",
        metadata_type="GenericOperationMetadata",
        starts_from=frozenset(ClusterStatus.watched()),
        steps=repair.repair_steps,
        on_success=repair.release_hold,
        after_success=repair.announce,
        on_failure=repair.failed,
    )
)
FIRST_SCAN = Extension(
    prepare=verification.prepare,
    steps=verification.steps,
    on_success=verification.verdict,
    after_success=verification.follow_up,
    on_failure=verification.failed,
)
extend(OperationKind.CREATE, FIRST_SCAN)
extend(OperationKind.UPDATE, FIRST_SCAN)
