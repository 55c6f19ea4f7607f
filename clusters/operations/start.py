"""start(): the one way to begin work on a cluster."""

from django.db import IntegrityError, transaction

from console.errors import Conflict

from ..choices import ClusterStatus, OperationStatus
from ..events import record_event
from ..models import Cluster, Operation
from . import registry
from .tasks import run_operation_task


def start(cluster, kind, *, message, user=None, params=None):
    """Start an operation of `kind` on `cluster` and return it.

    In one transaction: move the cluster to the kind's busy status from one it may start in (or check
    it is in one), insert the Operation row (the database allows one active operation per cluster),
    put `message` on the timeline, and enqueue the task once the transaction commits. Conflict (409)
    when the cluster is busy with another operation or in a status the kind does not start from;
    then nothing has changed."""
    spec = registry.kind(kind)
    before = (cluster.status, cluster.status_message, cluster.updated)
    with transaction.atomic():
        if spec.busy_status:
            moved = cluster.set_status(spec.busy_status, expected=spec.starts_from)
        else:
            moved = Cluster.objects.filter(pk=cluster.pk, status__in=spec.starts_from).exists()
        if not moved:
            cluster.refresh_from_db(fields=["status"])
            raise Conflict(refusal(cluster, spec))
        try:
            with transaction.atomic():
                operation = Operation.objects.create(
                    cluster=cluster, kind=spec.name, created_by=user, params=params or {}
                )
        except IntegrityError:
            cluster.status, cluster.status_message, cluster.updated = before
            raise Conflict(busy(cluster)) from None
        record_event(cluster, message, operation=operation)
        transaction.on_commit(lambda: run_operation_task.delay(operation.pk))
    return operation


def refusal(cluster, spec):
    wanted = " or ".join(sorted(ClusterStatus(s).label.lower() for s in spec.starts_from))
    return f"Cluster '{cluster.name}' is {cluster.get_status_display().lower()}; {spec.label.lower()} needs it {wanted}"


def busy(cluster):
    active = cluster.operations.filter(status__in=OperationStatus.active()).order_by("created").first()
    if active is None:
        return f"Cluster '{cluster.name}' has another operation starting; try again in a moment"
    label = registry.kind(active.kind).label.lower() if active.kind in registry.kinds() else active.kind.lower()
    since = active.created.strftime("%H:%M:%S UTC")
    return f"Cluster '{cluster.name}' has a {label} in progress (since {since}); try again when it ends"
