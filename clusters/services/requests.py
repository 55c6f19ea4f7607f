"""Cluster requests: every way in (REST, compatible REST, browser) creates, updates and deletes here.

Each request validates, then creates the Operation row in the same transaction as its cluster
change through `operations.start`, which enqueues the worker task only after that commits.
"""

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.errors import AlreadyExists, Conflict, ConsoleError, QuotaExceeded, Unavailable

from ..backends import all_backends, get_backend
from ..choices import ClusterStatus, OperationKind, OperationStatus
from ..events import record_event
from ..models import Cluster, Operation
from ..operations import start
from ..spec import SpecError, normalize, validate_spec
from ..spec.plan import cost, quota
from ..spec.validator import ID_RULE, RESOURCE_ID
from ..topology import build_topology, resize_pools
from ..work import BackendError


def validate_request(name, spec):
    """The validated spec; raises SpecError naming every bad field, the cluster id among them."""
    errors = {}
    if not isinstance(name, str) or not RESOURCE_ID.match(name):
        errors["cluster_id"] = [ID_RULE]
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
        cluster = new_cluster(project=project, name=name, spec=spec, status=ClusterStatus.DRAFT, user=user)
        build_topology(cluster, spec)
        return start_create(cluster, user)


def start_create(cluster, user):
    return start(cluster, OperationKind.CREATE, user=user, message=f"Create requested by {user or 'system'}")


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


def preflight(*, project, spec):
    """Is the backend's side ready for this spec (gce: APIs enabled, quotas, reservations)? The spec is
    validated first (SpecError); returns the backend's findings (.status ok / fail / warn, .check, .detail)."""
    spec = validate_spec(spec, backends=all_backends())
    check_backend(project, spec)
    backend = get_backend(backend_of(spec))
    try:
        return backend.preflight(project, spec)
    except BackendError as exc:
        raise (Unavailable if exc.retryable else Conflict)(str(exc)) from None


def bake_node_image(*, project, zone, gpu=False, arm64=False, family="", base="", report=print):
    """Bake a gce node image with Slurm, munge, gcsfuse and the node runtime installed (nodes boot it
    without the internet); returns what was made (.image, .family, .family_url). arm64: for A4X's GPUs."""
    try:
        return get_backend("gce").bake_image(
            project, zone, gpu=gpu, arm64=arm64, family=family, base=base, report=report
        )
    except BackendError as exc:
        raise (Unavailable if exc.retryable else Conflict)(str(exc)) from None


def create_draft(*, project, name, spec, user=None):
    """A DRAFT cluster holding a spec in progress (the wizard's); nothing is validated but the id."""
    if not isinstance(name, str) or not RESOURCE_ID.match(name):
        raise SpecError({"cluster_id": [ID_RULE]})
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
            raise SpecError({"cluster_id": [ID_RULE]})
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
        updated = Cluster.objects.filter(pk=cluster.pk, status=ClusterStatus.DRAFT).update(
            spec=spec, backend=backend_of(spec), location=region_of(spec)
        )
        if not updated:
            raise Conflict(f"Cluster '{cluster.name}' is not a draft any more")
        cluster.spec, cluster.backend, cluster.location = spec, backend_of(spec), region_of(spec)
        build_topology(cluster, spec)
        return start_create(cluster, user)


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


def region_of(spec):
    zone = next((p.get("zone") for p in spec.get("node_pools", []) if p.get("zone")), "")
    return zone.rsplit("-", 1)[0] if zone else ""


def update_cluster(*, cluster, spec, user=None):
    """Apply a new spec; only node counts (scaling_spec) may change after creation."""
    spec = validate_spec(spec, backends=all_backends())
    changed = immutable_changes(cluster.spec, spec)
    if changed:
        raise SpecError({path: ["cannot change after the cluster is created"] for path in changed})
    problems = {}
    for path, message in get_backend(backend_of(cluster.spec)).update_problems(cluster.spec, spec):
        problems.setdefault(path, []).append(message)
    if problems:
        raise SpecError(problems)
    check_quota(cluster.project, spec, exclude=cluster)
    previous = cluster.spec
    try:
        with transaction.atomic():
            cluster.spec = spec
            cluster.save(update_fields=["spec", "updated"])
            summary = resize_pools(cluster, spec)
            return start(
                cluster,
                OperationKind.UPDATE,
                user=user,
                message=f"Update requested by {user or 'system'}: {summary or 'no node count changes'}",
                params={"previous_spec": previous},
            )
    except ConsoleError:
        cluster.spec = previous  # the transaction rolled the row back; the instance follows
        raise


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
    return start(cluster, OperationKind.DELETE, user=user, message=f"Delete requested by {user or 'system'}")


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
    elif a != b and not (a in EMPTY and b in EMPTY):  # an empty list left out is the same empty list
        yield path or "spec"


EMPTY = (None, [], {}, "")
