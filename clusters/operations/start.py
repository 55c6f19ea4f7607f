"""start(): the one way to begin work on a cluster."""

import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from kombu.exceptions import OperationalError

from console.errors import Conflict, Unavailable

from ..choices import ClusterStatus
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
    check_broker()
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
                    cluster=cluster, kind=spec.name, created_by=user, params=params or {}, exclusive=spec.exclusive
                )
        except IntegrityError:
            cluster.status, cluster.status_message, cluster.updated = before
            raise Conflict(busy(cluster)) from None
        record_event(cluster, message, operation=operation)
        transaction.on_commit(lambda: enqueue(operation.pk))
    return operation


log = logging.getLogger(__name__)
BROKER_RETRY_AFTER = 30


def check_broker():
    """Unavailable (503, retry in 30 s) when the task queue cannot be reached, before anything is
    written: a create the console cannot hand to a worker is refused whole rather than half-made."""
    if not settings.OPERATION_CHECK_BROKER or settings.CELERY_TASK_ALWAYS_EAGER:
        return
    try:
        with run_operation_task.app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=0, timeout=settings.OPERATION_BROKER_TIMEOUT)
            connection.default_channel  # noqa: B018 (opens the channel: Redis answers or not)
    except (OperationalError, OSError):
        raise Unavailable(
            f"The console's task queue is not answering, so nothing was started; retry in {BROKER_RETRY_AFTER} s.",
            retry_after=BROKER_RETRY_AFTER,
        ) from None


def enqueue(operation_id):
    """Send the operation to a worker. When the broker went away after check_broker(), the committed
    operation stays PENDING and resume_stale_operations sends it once the broker is back."""
    try:
        run_operation_task.delay(operation_id)
    except (OperationalError, OSError):
        log.warning(
            "Operation %s is saved but not yet sent: the task queue is not answering; it is sent "
            "again once the queue is back (resume_stale_operations)",
            operation_id,
        )


def refusal(cluster, spec):
    wanted = " or ".join(sorted(ClusterStatus(s).label.lower() for s in spec.starts_from))
    return f"Cluster '{cluster.name}' is {cluster.get_status_display().lower()}; {spec.label.lower()} needs it {wanted}"


def busy(cluster):
    active = cluster.active_operation()
    if active is None:
        return f"Cluster '{cluster.name}' has another operation starting; try again in a moment"
    label = registry.kind(active.kind).label.lower() if active.kind in registry.kinds() else active.kind.lower()
    since = active.created.strftime("%H:%M:%S UTC")
    return f"Cluster '{cluster.name}' has a {label} in progress (since {since}); try again when it ends"
