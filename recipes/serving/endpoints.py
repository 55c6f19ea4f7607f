"""Inference endpoints: a registered version, or whatever version an alias names, served by replicas
that are Slurm jobs on a cluster (recipes/serve.py), behind the router (recipes/router.py).

One periodic task (recipes.tasks.reconcile_endpoints, every ENDPOINT_RECONCILE_SECONDS) sends one round
per live endpoint, each a task of its own expiring when the next is due and holding its endpoint with a
lease (two rounds never drive one endpoint), which moves the endpoint towards what it should be,
idempotently:

    autoscale   desired replicas from the router's samples: requests queued in a router for a free
                replica (every one has ROUTER_REPLICA_CONCURRENCY) -> one more at once, unless one is
                still starting; mean requests in flight per routed replica
                above `target_in_flight`, or p95 latency above `target_p95_ms` when set -> one more
                (up to max); no request for
                ENDPOINT_SCALE_DOWN_IDLE_SECONDS -> one fewer (down to min); a cooldown between moves
    roll        the version wanted (the alias resolved in MLflow) differs from the replicas' -> start
                `desired` replicas of it; each that answers /health lets one old one drain (as many
                serve as before the roll, never fewer, so a full cluster makes room as it goes). A new
                replica that never serves (its job ends, or ENDPOINT_START_SECONDS pass) fails the
                roll: FAILED, the old replicas keep serving, nothing is retried until the endpoint is
                changed (an empty PATCH, or Retry on its page)
    replicas    STARTING -> READY when its announce file is written and /health answers; READY ->
                DRAINING (no new requests once the routers re-read their table) -> STOPPED (scancel)
                once it has no request in flight, at the latest after ENDPOINT_DRAIN_SECONDS (at least
                the router's request timeout); a job that ended -> FAILED and replaced

Every scale, roll and replica change is an EndpointEvent on the endpoint's timeline.
"""

import math
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from clusters import services as clusters
from clusters.events import record_event
from clusters.models import Cluster
from clusters.spec.validator import ID_RULE, RESOURCE_ID
from console.errors import Conflict, FieldErrors
from console.fields import whole_number

from .. import registry
from ..models import Endpoint, EndpointEvent, EndpointStatus, ModelVersion
from ..partitions import default_partition, partition_shape
from ..queue import later

MAX_REPLICAS = 16


def event(endpoint, message):
    """On the endpoint's timeline and its cluster's: what serves on a cluster is part of its story."""
    EndpointEvent.objects.create(endpoint=endpoint, message=message)
    record_event(endpoint.cluster, f"Endpoint {endpoint.name}: {message}")


def whole(data, field, errors, low, high, default):
    value = data.get(field)
    return whole_number(default if value in (None, "") else value, field, errors, low=low, high=high)


TENSOR_PARALLEL = (1, 2, 4, 8)


def gpus_per_replica(cluster, data, current, errors):
    """GPUs each replica takes on the cluster's default partition: vLLM's tensor parallel size (1, 2, 4
    or 8, at most a node's GPUs: vLLM shards the model's attention heads over them, and a power of two
    divides every catalog model's heads), 1 by default; 0 where the partition has no GPUs."""
    partition = default_partition(cluster)
    per_node = (partition_shape(cluster, partition) or (0, 0, ""))[1] if partition else 0
    asked = data.get("gpus_per_replica")
    if asked in (None, ""):
        kept = current.gpus_per_replica if current is not None else None
        return kept if kept is not None and (kept > 0) == (per_node > 0) else min(1, per_node)
    number = whole_number(asked, "gpus_per_replica", errors, low=0, high=64)
    if number is None:
        return 0
    if not per_node and number:
        errors["gpus_per_replica"] = [f"the cluster's default partition ({partition or 'none'}) has no GPUs: replicas "
                                      "run on a CPU (give 0 or leave it out)"]  # fmt: skip
    elif per_node and (number not in TENSOR_PARALLEL or number > per_node):
        allowed = ", ".join(str(n) for n in TENSOR_PARALLEL if n <= per_node)
        errors["gpus_per_replica"] = [f"must be one of {allowed}: vLLM's tensor parallel size, at most the "
                                      f"{per_node} GPUs of a node of partition {partition}"]  # fmt: skip
    return number


def check(project, data, *, current=None):
    """The checked fields of a create (or of a change to `current`), or FieldErrors naming each bad one."""
    errors = {}
    fields = {}
    if current is None:
        name = data.get("name")
        if not isinstance(name, str) or not RESOURCE_ID.match(name):
            errors["name"] = [ID_RULE]
        elif Endpoint.objects.filter(project=project, name=name).exclude(status=EndpointStatus.DELETED).exists():
            errors["name"] = [f"the project already has an endpoint named {name}"]
        cluster = Cluster.objects.live().filter(project=project, name=data.get("cluster") or "").first()
        if cluster is None:
            errors["cluster"] = ["the project has no such cluster"]
        elif not cluster.is_usable:
            errors["cluster"] = [f"the cluster is {cluster.get_status_display().lower()}; replicas need a ready one"]
        elif why := clusters.endpoints_refused(cluster):
            errors["cluster"] = [why]
        fields.update(name=name, cluster=cluster)
    model = data.get("model", current.model_name if current else None)
    version, alias = data.get("version"), data.get("alias")
    if current is not None and version in (None, "") and alias in (None, ""):
        version, alias = current.version, current.alias
    if not isinstance(model, str) or not ModelVersion.objects.filter(project=project, name=model).exists():
        errors["model"] = ["the project has no registered model by that name"]
    elif (version in (None, "")) == (alias in (None, "")):
        errors["version"] = ["give a version number or an alias (not both)"]
    elif version not in (None, ""):
        number = whole({"version": version}, "version", errors, 1, 1 << 30, None)
        if number and not ModelVersion.objects.filter(project=project, name=model, version=number).exists():
            errors["version"] = [f"{model} has no version {number}"]
        fields.update(version=number, alias="")
    else:
        if not isinstance(alias, str) or not registry.ALIAS.match(alias):
            errors["alias"] = [registry.ALIAS_RULE]
        elif alias not in registry.aliases(project, model):
            errors["alias"] = [f"{model} has no alias {alias}; set it on the model first"]
        fields.update(alias=alias, version=None)
    fields["model_name"] = model
    cluster = fields.get("cluster") or (current.cluster if current else None)
    if cluster is not None:
        fields["gpus_per_replica"] = gpus_per_replica(cluster, data, current, errors)
    low = whole(data, "min_replicas", errors, 1, MAX_REPLICAS, current.min_replicas if current else 1)
    high = whole(data, "max_replicas", errors, 1, MAX_REPLICAS, current.max_replicas if current else (low or 1))
    if low and high and low > high:
        errors.setdefault("min_replicas", []).append(f"min_replicas ({low}) is more than max_replicas ({high})")
    target = data.get("target_in_flight", current.target_in_flight if current else 2.0)
    try:
        target = float(target)
        if not 0.1 <= target <= 1000:
            raise ValueError
    except (TypeError, ValueError):
        errors["target_in_flight"] = ["must be a number of requests in flight per replica, from 0.1 to 1000"]
    p95 = data.get("target_p95_ms", current.target_p95_ms if current else None)
    if p95 in ("", None):
        p95 = None
    else:
        try:
            p95 = float(p95)
            if not 1 <= p95 <= 600_000:
                raise ValueError
        except (TypeError, ValueError):
            errors["target_p95_ms"] = ["must be a p95 latency in milliseconds, from 1 to 600000 (or empty)"]
    if errors:
        raise FieldErrors(errors)
    fields.update(min_replicas=low, max_replicas=high, target_in_flight=target, target_p95_ms=p95)
    return fields


def create_endpoint(project, data, user=None):
    fields = check(project, data)
    with transaction.atomic():
        endpoint = Endpoint.objects.create(project=project, created_by=user, desired_replicas=fields["min_replicas"],
                                           **fields)  # fmt: skip
        event(endpoint, f"Created: {endpoint.target} on {endpoint.cluster.name}, {endpoint.min_replicas} to "
                        f"{endpoint.max_replicas} replicas by {user or 'system'}")  # fmt: skip
        later("reconcile_endpoint", endpoint.pk)
    return endpoint


def change_endpoint(endpoint, data, user=None):
    """Deploy another version or alias, or change the replica bounds; the next reconcile rolls."""
    if endpoint.status not in EndpointStatus.live():
        raise Conflict(f"The endpoint is {endpoint.get_status_display().lower()}")
    fields = check(endpoint.project, data, current=endpoint)
    before = endpoint.target
    fields["desired_replicas"] = min(max(endpoint.desired_replicas, fields["min_replicas"]), fields["max_replicas"])
    retried = endpoint.failed_version.ref if endpoint.failed_version_id else ""
    # Any change, an empty one too, is what tells a failed roll to try again.
    Endpoint.objects.filter(pk=endpoint.pk).update(failed_version=None, failure="", **fields)
    endpoint.refresh_from_db()
    event(endpoint, f"Changed by {user or 'system'}: {before} -> {endpoint.target}, {endpoint.min_replicas} to "
                    f"{endpoint.max_replicas} replicas" + (f"; trying {retried} again" if retried else ""))  # fmt: skip
    later("reconcile_endpoint", endpoint.pk)
    return endpoint


def delete_endpoint(endpoint, user=None):
    if endpoint.set_status(EndpointStatus.DELETING, expected=EndpointStatus.live()):
        event(endpoint, f"Deleting (by {user or 'system'}): its replicas stop")
        later("reconcile_endpoint", endpoint.pk)
    return endpoint


def live_endpoint(project, name):
    """The project's endpoint `name` unless deleted; Http404 otherwise, as clusters.access answers."""

    found = (
        Endpoint.objects.filter(project=project, name=name).exclude(status=EndpointStatus.DELETED)
        .select_related("project", "cluster", "serving").first()
    )  # fmt: skip
    if found is None:
        raise Http404("No such endpoint")
    return found


def traffic(endpoint, minutes, points=300):
    """The router's samples of the last `minutes` in at most `points` equal periods (never shorter than
    a sample), for the charts: per period its start (seconds since the epoch), requests/s and errors
    (every router's samples add up), p50 (the samples' mean weighted by their requests), p95, requests
    queued and replicas (the most of any sample). A period without samples has None everywhere and one
    with samples but no request None for latency: the charts leave both as gaps."""
    now = timezone.now()
    since = now - timedelta(minutes=minutes)
    width = max(settings.ROUTER_SAMPLE_SECONDS, minutes * 60 / points)
    buckets = {}
    for s in endpoint.samples.filter(time__gte=since).order_by("time"):
        buckets.setdefault(int((s.time - since).total_seconds() // width), []).append(s)
    rows = []
    for index in range(math.ceil(minutes * 60 / width)):
        start = since.timestamp() + index * width
        found = buckets.get(index)
        if not found:
            rows.append({"time": start})
            continue
        requests = sum(s.requests for s in found)
        timed = [s for s in found if s.p50_ms is not None and s.requests]
        rows.append({
            "time": start,
            "requests_per_s": requests / width,
            "errors": sum(s.errors for s in found),
            "p50_ms": sum(s.p50_ms * s.requests for s in timed) / sum(s.requests for s in timed) if timed else None,
            "p95_ms": max((s.p95_ms for s in found if s.p95_ms is not None), default=None),
            "queued": max(s.queued for s in found),
            "replicas": max(s.replicas for s in found),
        })  # fmt: skip
    return rows


def series(endpoint, minutes=15):
    """The router's samples of the last `minutes`, as lists per measure (REST and the charts)."""
    since = timezone.now() - timedelta(minutes=minutes)
    rows = endpoint.samples.filter(time__gte=since).order_by("time")
    return [
        {
            "time": s.time.isoformat(),
            "requests_per_s": round(s.requests_per_s, 3),
            "errors": s.errors,
            "p50_ms": s.p50_ms,
            "p95_ms": s.p95_ms,
            "in_flight": round(s.in_flight, 3),
            "queued": s.queued,
            "replicas": s.replicas,
        }
        for s in rows
    ]
