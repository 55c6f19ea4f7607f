"""Autoscaling: one step of an endpoint's desired replicas from the router's samples (the rules are in
recipes/serving/endpoints.py's docstring)."""

from datetime import timedelta

from django.conf import settings

from ..models import Endpoint, EndpointSample, ReplicaState
from .endpoints import event


def autoscale(endpoint, now):
    """One step of desired replicas from the router's samples (see the module's docstring)."""
    window = now - timedelta(seconds=settings.ENDPOINT_SCALE_WINDOW_SECONDS)
    samples = list(EndpointSample.objects.filter(endpoint=endpoint, time__gte=window))
    cooled = endpoint.last_scaled is None or now - endpoint.last_scaled >= timedelta(
        seconds=settings.ENDPOINT_SCALE_COOLDOWN_SECONDS
    )
    desired, reason = endpoint.desired_replicas, ""
    routed = max((s.replicas for s in samples), default=0)
    # A queue building up (requests waiting in a router for a free replica) is a burst the window's mean
    # sees only later: one more replica at once, cooldown or not, unless one is still starting.
    lately = now - timedelta(seconds=2 * settings.ROUTER_SAMPLE_SECONDS)
    queued = max((s.queued for s in samples if s.time >= lately), default=0)
    if (
        queued
        and routed >= desired < endpoint.max_replicas
        and not endpoint.replicas.filter(state=ReplicaState.STARTING).exists()
    ):
        desired, reason = desired + 1, f"{queued} request{'s' if queued > 1 else ''} waited for a free replica"
    elif samples and cooled and routed:
        # Request-seconds over the window: the routers' samples add up (several routers, one sum each).
        in_flight = sum(s.in_flight * s.seconds for s in samples) / settings.ENDPOINT_SCALE_WINDOW_SECONDS
        per_replica = in_flight / routed
        p95 = max((s.p95_ms for s in samples if s.p95_ms is not None), default=None)
        slow = endpoint.target_p95_ms is not None and p95 is not None and p95 > endpoint.target_p95_ms
        if desired < endpoint.max_replicas and routed >= desired:
            if per_replica > endpoint.target_in_flight:
                reason = (
                    f"{per_replica:.1f} requests in flight per replica, over the target {endpoint.target_in_flight:g}"
                )
            elif slow:
                reason = f"p95 latency {p95:.0f} ms, over the target {endpoint.target_p95_ms:g} ms"
            desired += 1 if reason else 0
    idle_since = now - timedelta(seconds=settings.ENDPOINT_SCALE_DOWN_IDLE_SECONDS)
    if not reason and desired > endpoint.min_replicas and cooled and endpoint.created < idle_since:
        recent = EndpointSample.objects.filter(endpoint=endpoint, time__gte=idle_since)
        if not recent.filter(requests__gt=0).exists():
            desired -= 1
            reason = f"no request for {settings.ENDPOINT_SCALE_DOWN_IDLE_SECONDS:g} s"
    desired = min(max(desired, endpoint.min_replicas), endpoint.max_replicas)
    if desired != endpoint.desired_replicas and Endpoint.objects.filter(
        pk=endpoint.pk, desired_replicas=endpoint.desired_replicas
    ).update(desired_replicas=desired, last_scaled=now):
        verb = "up" if desired > endpoint.desired_replicas else "down"
        event(endpoint, f"Scaled {verb} to {desired} replica{'s' if desired > 1 else ''}: {reason or 'its bounds'}")
        endpoint.desired_replicas, endpoint.last_scaled = desired, now
