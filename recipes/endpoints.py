"""Inference endpoints: a registered version, or whatever version an alias names, served by replicas
that are Slurm jobs on a cluster (recipes/serve.py), behind the router (recipes/router.py).

One periodic task (`reconcile_endpoints`, every ENDPOINT_RECONCILE_SECONDS) drives every live
endpoint towards what it should be, idempotently:

    autoscale   desired replicas from the router's samples: mean requests in flight per routed replica
                above `target_in_flight`, or p95 latency above `target_p95_ms` when set -> one more
                (up to max); no request for
                ENDPOINT_SCALE_DOWN_IDLE_SECONDS -> one fewer (down to min); a cooldown between moves
    roll        the version wanted (the alias resolved in MLflow) differs from the replicas' -> start
                `desired` replicas of it; once they all answer /health, drain the old ones
    replicas    STARTING -> READY when its announce file is written and /health answers; READY ->
                DRAINING (no new requests) -> STOPPED (scancel) after ENDPOINT_DRAIN_SECONDS, more than
                the router's refresh plus the longest request; a job that ended -> FAILED and replaced

Every scale, roll and replica change is an EndpointEvent on the endpoint's timeline.
"""

import contextlib
import json
import shlex
import urllib.request
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters import services as clusters
from clusters.choices import ClusterStatus
from clusters.models import Cluster
from clusters.slurm import states
from clusters.spec.validator import RESOURCE_ID
from console.errors import Conflict, ConsoleError, FieldErrors

from . import registry
from .models import (
    Endpoint,
    EndpointEvent,
    EndpointSample,
    EndpointStatus,
    ModelVersion,
    Replica,
    ReplicaState,
)
from .partitions import partition_shape

MAX_REPLICAS = 16


def event(endpoint, message):
    EndpointEvent.objects.create(endpoint=endpoint, message=message)


def whole(data, field, errors, low, high, default):
    value = data.get(field)
    if value in (None, ""):
        value = default
    try:
        number = int(value)
    except (TypeError, ValueError):
        errors.setdefault(field, []).append("must be a whole number")
        return None
    if not low <= number <= high:
        errors.setdefault(field, []).append(f"must be from {low} to {high}")
        return None
    return number


def check(project, data, *, current=None):
    """The checked fields of a create (or of a change to `current`), or FieldErrors naming each bad one."""
    errors = {}
    fields = {}
    if current is None:
        name = data.get("name")
        if not isinstance(name, str) or not RESOURCE_ID.match(name):
            errors["name"] = ["must be lowercase letters, digits and hyphens, starting with a letter"]
        elif Endpoint.objects.filter(project=project, name=name).exclude(status=EndpointStatus.DELETED).exists():
            errors["name"] = [f"the project already has an endpoint named {name}"]
        cluster = Cluster.objects.filter(project=project, name=data.get("cluster") or "").first()
        if cluster is None or cluster.status == ClusterStatus.DELETED:
            errors["cluster"] = ["the project has no such cluster"]
        elif not cluster.is_usable:
            errors["cluster"] = [f"the cluster is {cluster.get_status_display().lower()}; replicas need a ready one"]
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
            errors["alias"] = ["an alias is lowercase letters, digits, '-' and '_', starting with a letter"]
        elif alias not in registry.aliases(project, model):
            errors["alias"] = [f"{model} has no alias {alias}; set it on the model first"]
        fields.update(alias=alias, version=None)
    fields["model_name"] = model
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
        transaction.on_commit(lambda: reconcile_endpoint.delay(endpoint.pk))
    return endpoint


def change_endpoint(endpoint, data, user=None):
    """Deploy another version or alias, or change the replica bounds; the next reconcile rolls."""
    if endpoint.status not in EndpointStatus.live():
        raise Conflict(f"The endpoint is {endpoint.get_status_display().lower()}")
    fields = check(endpoint.project, data, current=endpoint)
    before = endpoint.target
    fields["desired_replicas"] = min(max(endpoint.desired_replicas, fields["min_replicas"]), fields["max_replicas"])
    Endpoint.objects.filter(pk=endpoint.pk).update(**fields)
    endpoint.refresh_from_db()
    event(endpoint, f"Changed by {user or 'system'}: {before} -> {endpoint.target}, {endpoint.min_replicas} to "
                    f"{endpoint.max_replicas} replicas")  # fmt: skip
    transaction.on_commit(lambda: reconcile_endpoint.delay(endpoint.pk))
    return endpoint


def delete_endpoint(endpoint, user=None):
    if endpoint.set_status(EndpointStatus.DELETING, expected=EndpointStatus.live()):
        event(endpoint, f"Deleting (by {user or 'system'}): its replicas stop")
        transaction.on_commit(lambda: reconcile_endpoint.delay(endpoint.pk))
    return endpoint


def live_endpoint(project, name):
    """The project's endpoint `name` unless deleted; Http404 otherwise, as console.access answers."""
    from django.http import Http404

    found = (
        Endpoint.objects.filter(project=project, name=name).exclude(status=EndpointStatus.DELETED)
        .select_related("project", "cluster", "serving").first()
    )  # fmt: skip
    if found is None:
        raise Http404("No such endpoint")
    return found


def wanted_version(endpoint):
    if endpoint.alias:
        return registry.resolve(endpoint.project, f"{endpoint.model_name}@{endpoint.alias}")
    return ModelVersion.objects.get(project=endpoint.project, name=endpoint.model_name, version=endpoint.version)


def replica_script(endpoint, replica, staged, runtime):
    python = shlex.quote(runtime.python)
    home = clusters.shared_dir(endpoint.cluster)
    folder = f"{home}/{replica.folder}"
    partition = endpoint.cluster.partitions.filter(is_default=True).values_list("name", flat=True).first() or ""
    gpus = (partition_shape(endpoint.cluster, partition) or (0, 0, ""))[1] if partition else 0
    engine = ["--engine", "vllm", "--gpus", "1"] if gpus else []  # one GPU per replica
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name=serve-{endpoint.name}-{replica.pk}",
            *([f"#SBATCH --partition={partition}"] if partition else []),
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks=1",
            "#SBATCH --cpus-per-task=1",
            *(["#SBATCH --gpus-per-node=1"] if gpus else []),
            f"#SBATCH --output={folder}/slurm-%j.out",
            "set -euo pipefail",
            f"export XDG_CACHE_HOME={shlex.quote(folder)}/.cache HF_HOME={shlex.quote(folder)}/.cache/huggingface",
            f"cd {shlex.quote(runtime.folder)}",
            f"exec srun {python} -m recipes.serve --model {shlex.quote(f'{home}/{staged}')} "
            f"--served-name {shlex.quote(endpoint.name)} --version {shlex.quote(replica.version_ref)} "
            f"--announce {shlex.quote(folder + '/announce.json')}" + "".join(f" {a}" for a in engine),
            "",
        ]
    )


def start_replica(endpoint, version):
    staged = registry.stage(version, endpoint.cluster)
    runtime = clusters.node_runtime(endpoint.cluster)
    replica = Replica.objects.create(endpoint=endpoint, version=version, version_ref=version.ref)
    replica.folder = f"endpoints/{endpoint.uuid}/replica-{replica.pk}"
    script = replica_script(endpoint, replica, staged, runtime)
    clusters.write_file(endpoint.cluster, f"{replica.folder}/serve.sbatch", script)
    try:
        replica.slurm_job_id = clusters.submit_batch(endpoint.cluster, f"{replica.folder}/serve.sbatch",
                                                     user=endpoint.created_by)  # fmt: skip
    except ConsoleError as exc:
        replica.state, replica.error, replica.stopped_at = ReplicaState.FAILED, exc.message[:300], timezone.now()
        replica.save()
        event(endpoint, f"Replica {replica.pk} ({version.ref}) could not be submitted: {exc.message}")
        return replica
    replica.save()
    event(endpoint, f"Replica {replica.pk} ({version.ref}) submitted as Slurm job {replica.slurm_job_id}")
    return replica


def healthy(replica, timeout=2):
    try:
        with urllib.request.urlopen(f"{replica.url}/health", timeout=timeout) as answer:
            return answer.status == 200
    except (OSError, ValueError):
        return False


def job_ended(replica):
    try:
        job = clusters.job_status(replica.endpoint.cluster, replica.slurm_job_id)
    except ConsoleError:
        return False  # Slurm not answering: judge it later
    return job is None or job.state not in states.JOB_ACTIVE


def stop(replica, state=ReplicaState.STOPPED, why=""):
    if replica.slurm_job_id:
        # Gone already, or Slurm silent: the job ends with the endpoint's cluster anyway.
        with contextlib.suppress(ConsoleError):
            clusters.cancel_job(replica.endpoint.cluster, replica.slurm_job_id)
    if replica.set_state(state, expected=ReplicaState.running(), stopped_at=timezone.now(), error=why[:300]):
        event(replica.endpoint, f"Replica {replica.pk} ({replica.version_ref}) {state.label.lower()}"
                                + (f": {why}" if why else ""))  # fmt: skip


def follow(replica):
    """Move a STARTING or READY replica on from what its job, announce file and /health say."""
    if replica.state == ReplicaState.STARTING:
        if not replica.host:
            try:
                raw = clusters.read_file(replica.endpoint.cluster, f"{replica.folder}/announce.json")
                announced = json.loads(raw)
                Replica.objects.filter(pk=replica.pk).update(host=announced["host"], port=int(announced["port"]))
                replica.host, replica.port = announced["host"], int(announced["port"])
            except (ConsoleError, ValueError, KeyError, TypeError):
                if job_ended(replica):
                    stop(replica, ReplicaState.FAILED, "its job ended before it served")
                return
        if healthy(replica) and replica.set_state(ReplicaState.READY, expected=[ReplicaState.STARTING],
                                                  ready_at=timezone.now()):  # fmt: skip
            event(replica.endpoint, f"Replica {replica.pk} ({replica.version_ref}) ready at {replica.url}")
    elif replica.state == ReplicaState.READY and not healthy(replica) and job_ended(replica):
        stop(replica, ReplicaState.FAILED, "its job ended")


def drain(replica, why):
    if replica.state == ReplicaState.STARTING:
        stop(replica, why=why)
    elif replica.set_state(ReplicaState.DRAINING, expected=[ReplicaState.READY], draining_at=timezone.now()):
        event(replica.endpoint, f"Replica {replica.pk} ({replica.version_ref}) draining: {why}")


def autoscale(endpoint, now):
    """One step of desired replicas from the router's samples (see the module's docstring)."""
    window = now - timedelta(seconds=settings.ENDPOINT_SCALE_WINDOW_SECONDS)
    samples = list(EndpointSample.objects.filter(endpoint=endpoint, time__gte=window))
    cooled = endpoint.last_scaled is None or now - endpoint.last_scaled >= timedelta(
        seconds=settings.ENDPOINT_SCALE_COOLDOWN_SECONDS
    )
    desired, reason = endpoint.desired_replicas, ""
    routed = max((s.replicas for s in samples), default=0)
    if samples and cooled and routed:
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
            current.append(start_replica(endpoint, want))
    except ConsoleError as exc:
        event(endpoint, f"Cannot start a replica of {want.ref}: {exc.message}")
    surplus = len(current) - endpoint.desired_replicas
    for replica in sorted(current, key=lambda r: (r.state == ReplicaState.READY, r.pk))[: max(0, surplus)]:
        drain(replica, f"scaled down to {endpoint.desired_replicas}")
    if old and len(ready) >= min(endpoint.desired_replicas, len(current)):
        for replica in old:
            drain(replica, f"replaced by {want.ref}")
    grace = now - timedelta(seconds=settings.ENDPOINT_DRAIN_SECONDS)
    for replica in endpoint.replicas.filter(state=ReplicaState.DRAINING, draining_at__lt=grace):
        stop(replica, why="drained")
    routed = endpoint.replicas.filter(state=ReplicaState.READY)
    status = (EndpointStatus.ROLLING if routed.exclude(version=want).exists() else EndpointStatus.READY) if (
        routed.exists()) else EndpointStatus.STARTING  # fmt: skip
    if status != endpoint.status:
        endpoint.set_status(status, expected=EndpointStatus.live())


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
            "replicas": s.replicas,
        }
        for s in rows
    ]


@shared_task(soft_time_limit=120)
def reconcile_endpoints():
    """Drive every live (or deleting) endpoint one step (the module's docstring)."""
    live = EndpointStatus.live() | {EndpointStatus.DELETING}
    for endpoint in Endpoint.objects.filter(status__in=live).select_related("project", "cluster", "serving"):
        try:
            reconcile(endpoint)
        except ConsoleError:
            continue  # the cluster or the registry is not answering: the next round tries again


@shared_task(soft_time_limit=120)
def reconcile_endpoint(endpoint_id):
    endpoint = Endpoint.objects.filter(pk=endpoint_id).select_related("project", "cluster", "serving").first()
    if endpoint is not None and endpoint.status != EndpointStatus.DELETED:
        reconcile(endpoint)
