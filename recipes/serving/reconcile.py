"""Reconcile: drive an endpoint one step towards what it should be (recipes/serving/endpoints.py's
docstring): replicas followed, autoscaled, rolled to the wanted version, drained and stopped."""

from contextlib import suppress
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from clusters.choices import OperationStatus
from clusters.models import Operation
from console.errors import ConsoleError

from .. import registry
from ..models import Endpoint, EndpointStatus, ModelVersion, ReplicaState
from .autoscale import autoscale
from .endpoints import event
from .replicas import drain, drained, follow, start, stop, wanted_version


def reconcile(endpoint):
    now = timezone.now()
    running = list(endpoint.replicas.filter(state__in=ReplicaState.running()).select_related("version"))
    if endpoint.status == EndpointStatus.DELETING:
        for replica in running:
            stop(replica, why="the endpoint is deleted")
        if endpoint.set_status(EndpointStatus.DELETED, expected=[EndpointStatus.DELETING]):
            event(endpoint, "Deleted")
        return
    for replica in running:
        follow(replica, now)
    autoscale(endpoint, now)
    try:
        want = wanted_version(endpoint)
    except (ConsoleError, ModelVersion.DoesNotExist) as exc:
        message = getattr(exc, "message", None) or "its version no longer exists"
        if not endpoint.events.filter(message__endswith=message, time__gte=now - timedelta(minutes=5)).exists():
            event(endpoint, f"Cannot resolve {endpoint.target}: {message}")
        return
    if endpoint.serving_id != want.pk:
        if endpoint.serving_id is not None:
            event(endpoint, f"Rolling to {want.ref} ({endpoint.target} moved): new replicas first, then the old drain")
        serving = sum(r.state == ReplicaState.READY for r in running)
        Endpoint.objects.filter(pk=endpoint.pk).update(serving=want, failed_version=None, failure="",
                                                       roll_serving=serving)  # fmt: skip
        endpoint.serving, endpoint.failed_version_id, endpoint.roll_serving = want, None, serving
    if endpoint.failed_version_id == want.pk:  # held until told to try again: what runs keeps running
        finish_drains(endpoint, now)
        return
    # A roll (or the first deploy) is under way while an older version still serves or none of this one
    # has: a new replica that fails then fails the roll. Otherwise a failed replica is replaced.
    live = [r for r in running if r.state == ReplicaState.READY]
    rolling = any(r.version_id != want.pk for r in live) or not any(r.version_id == want.pk for r in live)
    if rolling and (why := never_served(running, want)):
        return fail_roll(endpoint, want, why, running, now)
    running = [r for r in running if r.state in ReplicaState.running()]
    current = [r for r in running if r.version_id == want.pk and r.state != ReplicaState.DRAINING]
    old = [r for r in running if r.version_id != want.pk and r.state != ReplicaState.DRAINING]
    ready = [r for r in current if r.state == ReplicaState.READY]
    missing = endpoint.desired_replicas - len(current)
    try:
        staged = staged_for(endpoint, want) if missing > 0 else None
        for _ in range(missing if staged else 0):
            current.append(start(endpoint, want, staged))
    except StagingFailed as exc:
        return fail_roll(endpoint, want, str(exc), running, now)
    except ConsoleError as exc:
        event(endpoint, f"Cannot start a replica of {want.ref}: {exc.message}")
    if rolling and (why := never_served(current, want)):  # its job could not even be submitted
        return fail_roll(endpoint, want, why, running + current, now)
    surplus = len(current) - endpoint.desired_replicas
    for replica in sorted(current, key=lambda r: (r.state == ReplicaState.READY, r.pk))[: max(0, surplus)]:
        drain(replica, f"scaled down to {endpoint.desired_replicas}")
    before = endpoint.desired_replicas if endpoint.roll_serving is None else endpoint.roll_serving
    for replica in replaced(old, ready, keep=min(endpoint.desired_replicas, before)):
        drain(replica, f"replaced by {want.ref}")
    finish_drains(endpoint, now)
    routed = endpoint.replicas.filter(state=ReplicaState.READY)
    status = (EndpointStatus.ROLLING if routed.exclude(version=want).exists() else EndpointStatus.READY) if (
        routed.exists()) else EndpointStatus.STARTING  # fmt: skip
    if status != endpoint.status:
        endpoint.set_status(status, expected=EndpointStatus.live())


def replaced(old, ready, keep):
    """The old version's replicas a roll drains now: as many as `keep` serve without them (those not yet
    serving go first), never all to none. `keep` is what served when the roll began (fewer if the endpoint
    scaled down since). Waiting for every new replica the endpoint wants stalled a roll onto a full
    cluster: a scale-up during the roll asked for a replica that could start only where an old one ran."""
    if not ready:
        return []
    needed = max(0, keep - len(ready))
    return sorted(old, key=lambda r: (r.state == ReplicaState.READY, r.pk))[: max(0, len(old) - needed)]


def finish_drains(endpoint, now):
    for replica in endpoint.replicas.filter(state=ReplicaState.DRAINING):
        why = drained(replica, now)
        if why:
            stop(replica, why=why)


def never_served(replicas, want):
    """Why a replica of `want` failed before it ever served ("replica N: ..."), or None if none did."""
    unborn = next((r for r in replicas if r.version_id == want.pk and r.state == ReplicaState.FAILED
                   and r.ready_at is None), None)  # fmt: skip
    return f"replica {unborn.pk}: {unborn.error or 'it failed'}" if unborn else None


class StagingFailed(Exception):
    """The wanted version could not be copied onto the cluster (its STAGE operation failed)."""


def staged_for(endpoint, want):
    """The wanted version's folder in the cluster's shared home once its STAGE operation succeeded;
    None while it runs. StagingFailed when it failed: the next try is a new operation, once the endpoint
    is changed."""
    operation = endpoint.staging
    if operation is not None and operation.params.get("version_id") == want.pk:
        operation.refresh_from_db(fields=["status", "error"])  # a worker moves it on
    else:
        # Another endpoint's (or an earlier) copy of the same version onto the same cluster will do.
        operation = Operation.objects.filter(cluster=endpoint.cluster, kind=registry.STAGE,
                                             params__version_id=want.pk).exclude(
            status=OperationStatus.FAILED).order_by("-created").first()  # fmt: skip
        if operation is None:
            operation = registry.start_staging(endpoint.cluster, want, user=endpoint.created_by)
            event(endpoint, f"Staging {want.ref} onto {endpoint.cluster.name} (operation {operation.uuid})")
        Endpoint.objects.filter(pk=endpoint.pk).update(staging=operation)
        endpoint.staging = operation
    if operation.status == OperationStatus.SUCCEEDED:
        return registry.staged_path(want)
    if operation.status == OperationStatus.FAILED:
        Endpoint.objects.filter(pk=endpoint.pk).update(staging=None)
        raise StagingFailed(f"staging it failed: {operation.error}")
    return None


def fail_roll(endpoint, want, why, running, now):
    """The version being rolled out cannot serve (it could not be staged, or a replica of it never
    served: its job ended, or it was not serving ENDPOINT_START_SECONDS after it was submitted): stop
    trying that version until the endpoint is changed, stop its other new replicas, and leave what
    served before serving. Starting new replicas again and again would fill the cluster's queue with
    jobs that fail the same way. Drains due are finished as at the end of every round."""
    before = [r for r in running if r.version_id != want.pk and r.state == ReplicaState.READY]
    for replica in running:
        if replica.version_id != want.pk or replica.state not in ReplicaState.running():
            continue
        if replica.state == ReplicaState.STARTING or (replica.state == ReplicaState.READY and before):
            drain(replica, f"the roll to {want.ref} failed")
    if endpoint.set_status(EndpointStatus.FAILED, expected=EndpointStatus.live(), failed_version=want,
                           failure=why[:300]):  # fmt: skip
        serving = ", ".join(sorted({r.version_ref for r in before})) or "nothing"
        event(endpoint, f"Roll to {want.ref} failed ({why}); {serving} still serves. Nothing more is tried until "
                        "the endpoint is deployed again (Retry on its page, or a PATCH)")  # fmt: skip
    finish_drains(endpoint, now)


def due():
    """The ids of every live (or deleting) endpoint: each gets its own round (recipes.tasks fans them
    out, each expiring at the next), so one slow endpoint never holds up the others."""
    live = EndpointStatus.live() | {EndpointStatus.DELETING}
    return list(Endpoint.objects.filter(status__in=live).values_list("pk", flat=True))


def reconcile_one(endpoint_id):
    """One round for the endpoint, if no other worker holds it (a lease of ENDPOINT_RECONCILE_LEASE_SECONDS,
    released at the end); one whose cluster or registry is not answering is tried again next round.
    Returns whether this call drove it."""
    now = timezone.now()
    lease = timedelta(seconds=settings.ENDPOINT_RECONCILE_LEASE_SECONDS)
    free = Q(reconciling_until__isnull=True) | Q(reconciling_until__lt=now)
    if not Endpoint.objects.filter(free, pk=endpoint_id).update(reconciling_until=now + lease):
        return False
    try:
        endpoint = Endpoint.objects.filter(pk=endpoint_id).select_related("project", "cluster", "serving").first()
        if endpoint is not None and endpoint.status != EndpointStatus.DELETED:
            with suppress(ConsoleError):
                reconcile(endpoint)
    finally:
        Endpoint.objects.filter(pk=endpoint_id).update(reconciling_until=None)
    return True
