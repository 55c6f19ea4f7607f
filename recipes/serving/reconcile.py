"""Reconcile: drive an endpoint one step towards what it should be (recipes/serving/endpoints.py's
docstring): replicas followed, autoscaled, rolled to the wanted version, drained and stopped."""

from datetime import timedelta

from django.utils import timezone

from console.errors import ConsoleError

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
        follow(replica)
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
        Endpoint.objects.filter(pk=endpoint.pk).update(serving=want)
        endpoint.serving = want
    running = [r for r in running if r.state in ReplicaState.running()]
    current = [r for r in running if r.version_id == want.pk and r.state != ReplicaState.DRAINING]
    old = [r for r in running if r.version_id != want.pk and r.state != ReplicaState.DRAINING]
    ready = [r for r in current if r.state == ReplicaState.READY]
    try:
        for _ in range(endpoint.desired_replicas - len(current)):
            current.append(start(endpoint, want))
    except ConsoleError as exc:
        event(endpoint, f"Cannot start a replica of {want.ref}: {exc.message}")
    surplus = len(current) - endpoint.desired_replicas
    for replica in sorted(current, key=lambda r: (r.state == ReplicaState.READY, r.pk))[: max(0, surplus)]:
        drain(replica, f"scaled down to {endpoint.desired_replicas}")
    if old and len(ready) >= min(endpoint.desired_replicas, len(current)):
        for replica in old:
            drain(replica, f"replaced by {want.ref}")
    for replica in endpoint.replicas.filter(state=ReplicaState.DRAINING):
        why = drained(replica, now)
        if why:
            stop(replica, why=why)
    routed = endpoint.replicas.filter(state=ReplicaState.READY)
    status = (EndpointStatus.ROLLING if routed.exclude(version=want).exists() else EndpointStatus.READY) if (
        routed.exists()) else EndpointStatus.STARTING  # fmt: skip
    if status != endpoint.status:
        endpoint.set_status(status, expected=EndpointStatus.live())


def reconcile_all():
    """Drive every live (or deleting) endpoint one step; one whose cluster or registry is not
    answering is tried again next round."""
    live = EndpointStatus.live() | {EndpointStatus.DELETING}
    for endpoint in Endpoint.objects.filter(status__in=live).select_related("project", "cluster", "serving"):
        try:
            reconcile(endpoint)
        except ConsoleError:
            continue


def reconcile_one(endpoint_id):
    endpoint = Endpoint.objects.filter(pk=endpoint_id).select_related("project", "cluster", "serving").first()
    if endpoint is not None and endpoint.status != EndpointStatus.DELETED:
        reconcile(endpoint)
