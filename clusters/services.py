"""Cluster services: every way in (REST, compatible REST, browser) creates, updates and deletes here.

Each request creates the Operation row in the same transaction as its cluster change and enqueues the
worker task only after that transaction commits. The task calls `run_operation`, which claims the
operation with a compare-and-set, runs the backend's idempotent steps and reports progress.
"""

import logging
import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .backends import BackendError, TransientBackendError, all_backends, get_backend
from .choices import ClusterStatus, EventLevel, NodeRole, NodeState, OperationKind, OperationStatus
from .models import Cluster, ClusterEvent, Node, NodePool, Operation, Partition, SlurmJob
from .spec import SpecError, normalize, pool_node_count, validate_spec
from .spec.plan import cost, quota
from .spec.validator import RESOURCE_ID

log = logging.getLogger(__name__)


class ConsoleError(Exception):
    """An error with a message for the user; `code` is the HTTP status the API answers with."""

    code = 400

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class AlreadyExists(ConsoleError):
    code = 409


class Conflict(ConsoleError):
    code = 409


class QuotaExceeded(ConsoleError):
    code = 403


# -- requests ---------------------------------------------------------------------------------

CLUSTER_ID_RULE = "must be 1-63 lowercase letters, digits or hyphens, starting with a letter"


def validate_request(name, spec):
    """The validated spec; raises SpecError naming every bad field, the cluster id among them."""
    errors = {}
    if not isinstance(name, str) or not RESOURCE_ID.match(name):
        errors["cluster_id"] = [CLUSTER_ID_RULE]
    try:
        spec = validate_spec(spec, backends=all_backends())
    except SpecError as exc:
        errors.update(exc.errors)
    if errors:
        raise SpecError(errors)
    return spec


def checked_create(project, name, spec, location=""):
    """The validated spec of a create (or dry run), after the location, backend and quota checks."""
    spec = validate_request(name, spec)
    if location and location != region_of(spec):
        raise SpecError({"node_pools[0].zone": [f"must be a zone of {location}, the location in the request path"]})
    check_backend(project, spec)
    check_quota(project, spec)
    return spec


def new_cluster(*, project, name, spec, status, user):
    """The Cluster row, unless a live cluster holds the id (call inside a transaction)."""
    if Cluster.objects.live().filter(project=project, name=name).exists():
        raise AlreadyExists(f"Cluster '{name}' already exists in project '{project.slug}'")
    return Cluster.objects.create(
        project=project,
        name=name,
        location=region_of(spec),
        backend=backend_of(spec),
        spec=spec,
        status=status,
        created_by=user,
    )


def create_cluster(*, project, name, spec, user=None, location=""):
    """Validate, record the cluster with its pools, partitions and nodes, and enqueue provisioning."""
    spec = checked_create(project, name, spec, location)
    with transaction.atomic():
        cluster = new_cluster(project=project, name=name, spec=spec, status=ClusterStatus.PROVISIONING, user=user)
        build_topology(cluster, spec)
        return start_operation(cluster, OperationKind.CREATE, user, f"Create requested by {user or 'system'}")


def dry_run(*, project, name, spec, location=""):
    """What a create would make, named as the backend will name it, and what it costs; creates nothing."""
    spec = checked_create(project, name, spec, location)
    lines, total = cost(spec)
    backend = get_backend(backend_of(spec))
    return {
        "cluster_id": name,
        "backend": backend.name,
        "plan": [{"kind": k, "name": n, "detail": d} for k, n, d in backend.plan(project, name, spec)],
        "estimated_cost_per_hour": round(total, 2),
        "cost": [{"item": line.item, "quantity": line.quantity, "per_hour": line.per_hour} for line in lines],
    }


def create_draft(*, project, name, spec, user=None):
    """A DRAFT cluster holding a spec in progress (the wizard's); nothing is validated but the id."""
    if not isinstance(name, str) or not RESOURCE_ID.match(name):
        raise SpecError({"cluster_id": [CLUSTER_ID_RULE]})
    spec = normalize(spec) if isinstance(spec, dict) else {}
    with transaction.atomic():
        cluster = new_cluster(project=project, name=name, spec=spec, status=ClusterStatus.DRAFT, user=user)
        record_event(cluster, f"Draft started by {user or 'system'}")
    return cluster


def save_draft(cluster, spec, name=None):
    """Store a draft's spec (and new id); only while it is still a draft."""
    spec = normalize(spec)
    fields = {"spec": spec, "location": region_of(spec), "backend": backend_of(spec), "updated": timezone.now()}
    if name is not None and name != cluster.name:
        if not isinstance(name, str) or not RESOURCE_ID.match(name):
            raise SpecError({"cluster_id": [CLUSTER_ID_RULE]})
        if Cluster.objects.live().filter(project=cluster.project, name=name).exclude(pk=cluster.pk).exists():
            raise SpecError({"cluster_id": [f"a cluster named '{name}' already exists in this project"]})
        fields["name"] = name
    if not Cluster.objects.filter(pk=cluster.pk, status=ClusterStatus.DRAFT).update(**fields):
        raise Conflict("This cluster is no longer a draft; its spec can only change through an update")
    for key, value in fields.items():
        setattr(cluster, key, value)


def submit_draft(*, cluster, user=None):
    """Validate a draft and start provisioning it, as a create would."""
    spec = validate_request(cluster.name, cluster.spec)
    check_backend(cluster.project, spec)
    check_quota(cluster.project, spec, exclude=cluster)
    with transaction.atomic():
        if not cluster.set_status(ClusterStatus.PROVISIONING, expected=[ClusterStatus.DRAFT]):
            raise Conflict(f"Cluster '{cluster.name}' is not a draft any more")
        cluster.spec, cluster.backend, cluster.location = spec, backend_of(spec), region_of(spec)
        cluster.save(update_fields=["spec", "backend", "location", "updated"])
        build_topology(cluster, spec)
        return start_operation(cluster, OperationKind.CREATE, user, f"Create requested by {user or 'system'}")


def check_backend(project, spec):
    problems = get_backend(backend_of(spec)).project_problems(project)
    if problems:
        raise SpecError({"console.backend": problems})


def check_quota(project, spec, exclude=None):
    over = [line for line in quota(project, spec, exclude=exclude) if not line.ok]
    if over:
        raise QuotaExceeded(
            "Quota exceeded: "
            + "; ".join(
                f"{line.resource}: the project's quota is {line.limit}, its clusters use {line.in_use}, "
                f"this asks for {line.requested}"
                for line in over
            )
        )


def backend_of(spec):
    return (spec.get("console") or {}).get("backend") or settings.DEFAULT_CLUSTER_BACKEND


def update_cluster(*, cluster, spec, user=None):
    """Apply a new spec; only node counts (scaling_spec) may change after creation."""
    spec = validate_spec(spec, backends=all_backends())
    changed = immutable_changes(cluster.spec, spec)
    if changed:
        raise SpecError({path: ["cannot change after the cluster is created"] for path in changed})
    check_quota(cluster.project, spec, exclude=cluster)
    with transaction.atomic():
        previous = cluster.spec
        if not cluster.set_status(ClusterStatus.UPDATING, expected=ClusterStatus.usable()):
            raise Conflict(
                f"Cluster '{cluster.name}' is {cluster.get_status_display().lower()}; try again when it is ready"
            )
        cluster.spec = spec
        cluster.save(update_fields=["spec", "updated"])
        summary = resize_pools(cluster, spec)
        operation = start_operation(
            cluster,
            OperationKind.UPDATE,
            user,
            f"Update requested by {user or 'system'}: {summary or 'no node count changes'}",
            params={"previous_spec": previous},
        )
    return operation


def delete_cluster(*, cluster, user=None):
    """Delete through an operation; a draft has nothing running, so its operation is done at once."""
    if cluster.status == ClusterStatus.DRAFT:
        with transaction.atomic():
            if not cluster.set_status(ClusterStatus.DELETED, expected=[ClusterStatus.DRAFT]):
                raise Conflict(f"Cluster '{cluster.name}' is not a draft any more")
            operation = Operation.objects.create(
                cluster=cluster,
                kind=OperationKind.DELETE,
                created_by=user,
                status=OperationStatus.SUCCEEDED,
                progress=100,
                finished=timezone.now(),
            )
            record_event(cluster, f"Draft discarded by {user or 'system'}", operation=operation)
        return operation
    with transaction.atomic():
        if not cluster.set_status(ClusterStatus.DELETING, expected=ClusterStatus.deletable()):
            raise Conflict(
                f"Cluster '{cluster.name}' is {cluster.get_status_display().lower()}; it can be deleted once that ends"
            )
        operation = start_operation(cluster, OperationKind.DELETE, user, f"Delete requested by {user or 'system'}")
    return operation


def region_of(spec):
    zone = next((p.get("zone") for p in spec.get("node_pools", []) if p.get("zone")), "")
    return zone.rsplit("-", 1)[0] if zone else ""


def build_topology(cluster, spec):
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    login = slurm["login_node_pool_id"]
    pools = {}
    for item in spec["node_pools"]:
        machine = item["machine_spec"]
        pool = NodePool.objects.create(
            cluster=cluster,
            pool_id=item["id"],
            role=NodeRole.LOGIN if item["id"] == login else NodeRole.COMPUTE,
            machine_type=machine["machine_type"],
            accelerator_type=machine.get("accelerator_type", ""),
            accelerator_count=machine.get("accelerator_count", 0) or 0,
            node_count=pool_node_count(item),
            zone=item.get("zone", ""),
            provisioning_model=item.get("provisioning_model", "ON_DEMAND"),
        )
        pools[pool.pool_id] = pool
        add_nodes(pool, range(pool.node_count))
    for i, item in enumerate(slurm["partitions"]):
        partition = Partition.objects.create(cluster=cluster, name=item["id"], is_default=i == 0)
        partition.node_pools.set([pools[p] for p in item["node_pool_ids"]])
    from .health.schedule import schedule_for

    schedule_for(cluster)  # periodic health scans, from the installation's default


def node_name(pool, index):
    return f"{pool.pool_id}-{index}"


def add_nodes(pool, indices):
    Node.objects.bulk_create(
        Node(cluster=pool.cluster, node_pool=pool, name=node_name(pool, i), index=i) for i in indices
    )


def resize_pools(cluster, spec):
    """Add Node rows for grown pools and mark the highest-numbered ones of shrunk pools for removal."""
    counts = {p["id"]: pool_node_count(p) for p in spec["node_pools"]}
    changes = []
    for pool in cluster.node_pools.all():
        wanted = counts[pool.pool_id]
        current = list(pool.nodes.filter(state__in=NodeState.wanted()).order_by("index"))
        if wanted > len(current):
            start = max([n.index for n in pool.nodes.all()], default=-1) + 1
            add_nodes(pool, range(start, start + wanted - len(current)))
        elif wanted < len(current):
            Node.objects.filter(pk__in=[n.pk for n in current[wanted:]]).update(state=NodeState.DELETING)
        if wanted != len(current):
            changes.append(f"{pool.pool_id} {len(current)} → {wanted} nodes")
        pool.node_count = wanted
        pool.save(update_fields=["node_count"])
    return ", ".join(changes)


def immutable_changes(old, new):
    """Field paths that differ between two specs, other than node counts."""

    def strip(spec):
        return {
            **spec,
            "node_pools": [{k: v for k, v in p.items() if k != "scaling_spec"} for p in spec.get("node_pools", [])],
        }

    return sorted(differences(strip(old), strip(new)))


def differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from differences(a.get(key), b.get(key), f"{path}.{key}" if path else key)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield path or "spec"


def start_operation(cluster, kind, user, message, params=None):
    operation = Operation.objects.create(cluster=cluster, kind=kind, created_by=user, params=params or {})
    record_event(cluster, message, operation=operation)
    enqueue(operation)
    return operation


def enqueue(operation):
    from .tasks import run_operation_task

    transaction.on_commit(lambda: run_operation_task.delay(operation.pk))


def record_event(cluster, message, *, level=EventLevel.INFO, operation=None, node=""):
    log.info("cluster %s: %s", cluster, message)
    return ClusterEvent.objects.create(cluster=cluster, message=message, level=level, operation=operation, node=node)


# -- work (runs in a Celery worker) ------------------------------------------------------------


def run_operation(operation_id, stale_after=None):
    """Claim and run an operation; a second delivery of a finished or running one does nothing.

    A RUNNING operation is taken over only when its worker has been silent for `stale_after` seconds.
    """
    operation = Operation.objects.select_related("cluster").filter(pk=operation_id).first()
    if operation is None or operation.is_done:
        return
    stale_after = settings.OPERATION_STALE_AFTER if stale_after is None else stale_after
    if not operation.claim(stale_before=timezone.now() - timedelta(seconds=stale_after)):
        log.info("operation %s is being worked elsewhere; skipping", operation_id)
        return
    cluster = operation.cluster
    if operation.attempts > 1:
        record_event(
            cluster,
            f"Resuming {operation.get_kind_display().lower()} (attempt {operation.attempts})",
            operation=operation,
        )
    backend = get_backend(cluster.backend)
    try:
        if operation.kind == OperationKind.DELETE:
            run_steps(operation, backend.delete_steps(cluster))
            finish_delete(operation)
        elif operation.kind == OperationKind.SCAN:
            from .health import scans

            run_steps(operation, scans.scan_steps(operation))
            finish_scan(operation)
        elif operation.kind == OperationKind.REPAIR:
            from .health import repair

            run_steps(operation, repair.repair_steps(operation))
            finish_repair(operation)
        else:
            cluster.wanted_nodes().filter(state=NodeState.PENDING).update(state=NodeState.PROVISIONING)
            scan = first_scan_steps(operation)
            run_steps(operation, backend.apply_steps(cluster, hold=operation.params.get("hold")) + scan)
            finish_apply(operation)
    except TransientBackendError as exc:
        operation.release(f"Will retry: {exc}")
        raise
    except BackendError as exc:
        fail_operation(operation.pk, str(exc))
    except Exception as exc:
        log.exception("operation %s failed", operation_id)
        fail_operation(operation.pk, f"Internal error: {exc.__class__.__name__}: {exc}")


def run_steps(operation, steps):
    total = len(steps)
    for i, step in enumerate(steps):
        operation.report(progress=round(100 * i / total), step=step.name)
        started = time.monotonic()
        step.run()
        operation.report(
            progress=round(100 * (i + 1) / total),
            step=step.name,
            message=f"{step.name}: done in {time.monotonic() - started:.1f} s",
        )


def first_scan_steps(operation):
    """A create or a resize ends with a health scan of the nodes it starts, which are held from users'
    jobs until then (the cluster is READY only if it passes)."""
    from .health import holds, scans

    if operation.kind not in (OperationKind.CREATE, OperationKind.UPDATE) or not settings.HEALTH_SCAN_BEFORE_READY:
        return []
    cluster = operation.cluster
    if not get_backend(cluster.backend).runs_jobs:
        return []
    new = list(cluster.starting_nodes().values_list("name", flat=True))
    if not new:
        return []
    holds.begin(operation, new)
    return scans.scan_steps(operation, prefix="First health scan: ")


def finish_apply(operation):
    from .health import holds, repair, scans

    cluster = operation.cluster
    holds.end(operation, "failed its first health scan")
    cluster.nodes.filter(state=NodeState.DELETING).delete()
    cluster.wanted_nodes().update(state=NodeState.READY)
    busy = ClusterStatus.PROVISIONING if operation.kind == OperationKind.CREATE else ClusterStatus.UPDATING
    count = cluster.compute_nodes().count()
    nodes = f"{count} compute node{'s' if count != 1 else ''} idle in Slurm"
    scanned = operation.health_results.exists()
    summary, failing = scans.summary(operation) if scanned else ("", False)
    if failing:
        message = summary.replace("Health scan done", "First health scan")
        cluster.set_status(ClusterStatus.VERIFYING, expected=[busy], message=message)
    else:
        cluster.set_status(ClusterStatus.READY, expected=[busy])
    operation.finish(OperationStatus.SUCCEEDED)
    if failing:
        done = "Cluster provisioned" if operation.kind == OperationKind.CREATE else "Update done"
        record_event(
            cluster,
            f"{done} ({nodes}) but not ready: {cluster.status_message}. The failing nodes are drained; "
            "the cluster becomes ready once each is repaired and passes again.",
            level=EventLevel.WARNING,
            operation=operation,
        )
        repair.after_health(cluster, operation)
    elif operation.kind == OperationKind.UPDATE:
        new = ", ".join(operation.params.get("held", []))
        scan = f"; the first health scan of {new} passed" if scanned else ""
        record_event(cluster, f"Update done: {nodes}{scan}", operation=operation)
    elif scanned:
        record_event(cluster, f"Cluster ready: {nodes}; the first health scan passed", operation=operation)
    else:
        note = ""
        if settings.HEALTH_SCAN_BEFORE_READY:
            note = f" (no first health scan: the {cluster.backend} backend cannot run jobs from the console yet)"
        record_event(cluster, f"Cluster ready: {nodes}{note}", operation=operation)


def finish_scan(operation):
    from .health.repair import after_health
    from .health.scans import summary

    operation.finish(OperationStatus.SUCCEEDED)
    message, failing = summary(operation)
    level = EventLevel.WARNING if failing else EventLevel.INFO
    record_event(operation.cluster, message, level=level, operation=operation)
    after_health(operation.cluster, operation)


def finish_repair(operation):
    from .health.holds import end
    from .health.repair import after_health, verified

    params = operation.params
    node, failure, action = params["node"], params["failure"], params["action"]
    end(operation, f"{action} did not fix it", failure=failure)
    operation.finish(OperationStatus.SUCCEEDED)
    if not operation.health_results.exists():
        record_event(operation.cluster, f"Repaired {node} ({failure}) by {action}", operation=operation, node=node)
        return
    ok, detail = verified(operation)
    record_event(
        operation.cluster,
        f"Repaired {node} ({failure}) by {action}: {detail}" if ok else f"{action} did not fix {failure}: {detail}",
        level=EventLevel.INFO if ok else EventLevel.WARNING,
        operation=operation,
        node=node,
    )
    after_health(operation.cluster, operation)


def finish_delete(operation):
    cluster = operation.cluster
    cluster.nodes.all().delete()
    cluster.set_status(ClusterStatus.DELETED, expected=[ClusterStatus.DELETING])
    operation.finish(OperationStatus.SUCCEEDED)
    record_event(cluster, "Cluster deleted; every process and file it had is gone", operation=operation)


def fail_operation(operation_id, message):
    """Mark the operation failed and move its cluster to the state that failure leaves it in."""
    operation = Operation.objects.select_related("cluster").get(pk=operation_id)
    if not operation.finish(OperationStatus.FAILED, error=message):
        return
    cluster = operation.cluster
    end_hold_of_failed(operation)
    if operation.kind in (OperationKind.SCAN, OperationKind.REPAIR):
        pass  # the cluster's own state is unchanged; a failed repair leaves the node drained for the next
    elif operation.kind == OperationKind.UPDATE:
        cluster.set_status(ClusterStatus.DEGRADED, expected=[ClusterStatus.UPDATING], message=message)
    else:
        busy = ClusterStatus.PROVISIONING if operation.kind == OperationKind.CREATE else ClusterStatus.DELETING
        cluster.set_status(ClusterStatus.FAILED, expected=[busy], message=message)
    cluster.wanted_nodes().filter(state=NodeState.PROVISIONING).update(state=NodeState.FAILED)
    record_event(
        cluster,
        f"{operation.get_kind_display()} failed at '{operation.step}': {message}",
        level=EventLevel.ERROR,
        operation=operation,
    )


def end_hold_of_failed(operation):
    """A failed operation's held nodes that no scan passed stay out of service (drained), the rest return."""
    from .health.holds import end

    if operation.kind in (OperationKind.CREATE, OperationKind.DELETE) or "hold" not in operation.params:
        return  # a failed create's cluster is FAILED as a whole (its Slurm may never have started)
    why, failure = "its operation failed before a scan passed it", operation.params.get("failure")
    try:
        drained = end(operation, why, failure=failure)
    except BackendError as exc:
        record_event(
            operation.cluster,
            f"Could not end hold {operation.params['hold']}: {exc}",
            level=EventLevel.ERROR,
            operation=operation,
        )
        return
    if drained:
        record_event(
            operation.cluster,
            f"Drained {', '.join(drained)}: {operation.get_kind_display().lower()} failed before a scan passed them",
            level=EventLevel.WARNING,
            operation=operation,
        )


def resume_stale_operations(stale_after=None):
    """Enqueue again operations whose worker died (silent too long) or whose message was lost."""
    stale_after = settings.OPERATION_STALE_AFTER if stale_after is None else stale_after
    cutoff = timezone.now() - timedelta(seconds=stale_after)
    stale = Operation.objects.filter(status=OperationStatus.RUNNING, heartbeat__lt=cutoff) | Operation.objects.filter(
        status=OperationStatus.PENDING, created__lt=cutoff
    )
    ids = list(stale.values_list("pk", flat=True))
    from .tasks import run_operation_task

    for pk in ids:
        run_operation_task.delay(pk, stale_after=stale_after)
    return ids


# -- reading live state ------------------------------------------------------------------------


def refresh_nodes(cluster):
    """Ask Slurm for every node's state and store it; returns an error message when Slurm is unreachable."""
    if cluster.status in (ClusterStatus.DELETED, ClusterStatus.DRAFT):
        return ""
    try:
        statuses = {s.name: s for s in get_backend(cluster.backend).node_statuses(cluster)}
    except (BackendError, OSError, ValueError) as exc:
        return f"Slurm is not answering: {exc}"
    now = timezone.now()
    for node in cluster.nodes.filter(node_pool__role=NodeRole.COMPUTE):
        status = statuses.get(node.name)
        if status is None:
            continue
        Node.objects.filter(pk=node.pk).update(
            slurm_state=status.display_state, slurm_reason=status.reason, slurm_seen=now
        )
    return ""


ACTIVE_JOB_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def list_jobs(cluster, limit=200):
    """(jobs, error): Slurm's queue merged into the console's job history, newest first.

    Jobs Slurm no longer reports (aged out, or the controller lost them) keep their last known state.
    """
    error = ""
    if cluster.status in ClusterStatus.usable() | {ClusterStatus.UPDATING}:
        try:
            record_jobs(cluster, get_backend(cluster.backend).jobs(cluster))
        except (BackendError, OSError, ValueError) as exc:
            error = f"Slurm is not answering: {exc}; showing the last known jobs"
    return list(cluster.slurm_jobs.all()[:limit]), error


def record_jobs(cluster, jobs):
    """Store Slurm's view of each job; pages poll this, so only new or changed jobs are written."""

    def when(epoch):
        return datetime.fromtimestamp(epoch, tz=UTC) if epoch else None

    now = timezone.now()
    fields = {
        job.job_id: {
            "name": job.name[:200],
            "user": job.user[:64],
            "state": job.state,
            "partition": job.partition,
            "nodes": job.nodes[:500],
            "node_count": job.node_count,
            "reason": "" if job.reason == "None" else job.reason[:200],
            "exit_code": job.exit_code,
            "submit_time": when(job.submit_time),
            "start_time": when(job.start_time),
            "end_time": when(job.end_time) if job.state not in ACTIVE_JOB_STATES else None,
        }
        for job in jobs
    }
    live = set(fields)
    known = {row.job_id: row for row in cluster.slurm_jobs.filter(job_id__in=live)}
    SlurmJob.objects.bulk_create(
        SlurmJob(cluster=cluster, job_id=job_id, seen=now, **values)
        for job_id, values in fields.items()
        if job_id not in known
    )
    for job_id, row in known.items():
        if any(getattr(row, key) != value for key, value in fields[job_id].items()):
            SlurmJob.objects.filter(pk=row.pk).update(**fields[job_id])
    cluster.slurm_jobs.filter(job_id__in=live).update(seen=now)
    cluster.slurm_jobs.filter(state__in=ACTIVE_JOB_STATES).exclude(job_id__in=live).update(
        state="UNKNOWN", reason="Slurm no longer reports this job"
    )
