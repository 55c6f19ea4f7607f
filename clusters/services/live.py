"""What Slurm said at the last sync (clusters.services.sync): node states and jobs, read from the
database only. Pages and GET endpoints call these; none of them reaches Slurm."""

import re
from dataclasses import dataclass

from django.db.models import Count, OuterRef, Q, Subquery
from django.utils import timezone

from console.errors import FieldErrors

from ..choices import ClusterStatus, NodeRole
from ..models import Operation, SlurmSync
from ..slurm.states import JOB_ACTIVE, JOB_CANCELLED, JOB_COMPLETED, JOB_FAILED, JOB_RUNNING, JOB_WAITING, node_colour

# ?state= takes Slurm's job states and these groups of them.
JOB_STATE_GROUPS = {
    "active": JOB_ACTIVE,
    "pending": JOB_WAITING,
    "running": JOB_RUNNING,
    "completed": JOB_COMPLETED,
    "failed": JOB_FAILED,
    "cancelled": JOB_CANCELLED,
}
JOB_STATES = JOB_ACTIVE | JOB_COMPLETED | JOB_FAILED | JOB_CANCELLED | {"UNKNOWN", "PREEMPTED", "SPECIAL_EXIT"}
FILTER_TEXT = re.compile(r"[\w.@+-]{1,64}\Z")


@dataclass
class SyncState:
    """How fresh the rows are: shown as "as of HH:MM:SS" and flagged when stale."""

    synced: object = None  # datetime of the last sync that reached Slurm
    failing_since: object = None
    error: str = ""
    expected: bool = False  # the cluster's Slurm may be up, so a sync should be running
    stale: bool = False

    @property
    def age_s(self):
        return None if self.synced is None else int((timezone.now() - self.synced).total_seconds())


def sync_state(cluster):
    """The cluster's SyncState (one query); a cluster never synced yet has synced=None."""
    expected = cluster.status in ClusterStatus.synced()
    row = SlurmSync.objects.filter(pk=cluster.pk).first()
    if row is None:
        return SyncState(expected=expected, stale=expected)
    return SyncState(
        synced=row.synced,
        failing_since=row.failing_since,
        error=row.error,
        expected=expected,
        stale=expected and row.is_stale(),
    )


def job_filters(params):
    """The jobs list's filters from query parameters: state (comma-separated Slurm states or the
    groups active, pending, running, completed, failed, cancelled), user, partition, q (a job id or
    part of a name). FieldErrors naming each bad parameter."""
    errors, found = {}, {}
    states = set()
    for word in filter(None, (w.strip() for w in str(params.get("state", "")).split(","))):
        if word.lower() in JOB_STATE_GROUPS:
            states |= JOB_STATE_GROUPS[word.lower()]
        elif word.upper() in JOB_STATES:
            states.add(word.upper())
        else:
            groups = ", ".join(JOB_STATE_GROUPS)
            errors.setdefault("state", []).append(f"'{word[:40]}' is not a Slurm job state nor one of {groups}")
    if states:
        found["state"] = states
    for key in ("user", "partition"):
        value = str(params.get(key, "")).strip()
        if value and not FILTER_TEXT.match(value):
            errors[key] = ["must be a name of at most 64 letters, digits and . _ - @ +"]
        elif value:
            found[key] = value
    q = str(params.get("q", "")).strip()
    if len(q) > 200 or any(ord(c) < 32 for c in q):
        errors["q"] = ["must be a job id or at most 200 characters of a job name"]
    elif q:
        found["q"] = q
    if errors:
        raise FieldErrors(errors)
    return found


def jobs_of(cluster, filters=None):
    """The cluster's jobs as last synced, newest first, narrowed by job_filters()."""
    rows = cluster.slurm_jobs.all()
    filters = filters or {}
    if "state" in filters:
        rows = rows.filter(state__in=sorted(filters["state"]))
    if "user" in filters:
        rows = rows.filter(user=filters["user"])
    if "partition" in filters:
        rows = rows.filter(partition=filters["partition"])
    if "q" in filters:
        q = filters["q"]
        match = Q(name__icontains=q)
        if q.isdigit() and len(q) <= 10:
            match |= Q(job_id=int(q))
        rows = rows.filter(match)
    return rows


def node_state_counts(cluster):
    """[(Slurm state, colour, count)] over the cluster's compute nodes, most common first (one query)."""
    rows = (
        cluster.nodes.filter(node_pool__role=NodeRole.COMPUTE)
        .values("slurm_state")
        .annotate(n=Count("pk"))
        .order_by("-n", "slurm_state")
    )
    return [(row["slurm_state"] or "not seen", node_colour(row["slurm_state"]), row["n"]) for row in rows]


def nodes_of(cluster):
    return cluster.nodes.select_related("node_pool").prefetch_related("node_pool__partitions")


def with_latest_operations(clusters, page=None):
    """The clusters (a queryset) as a list, each with its latest operation (Cluster.latest_operation)
    read in two queries for all of them rather than one per cluster: what a list of clusters shows.
    `page`, given, picks the part of the queryset to read (a paginator's paginate_queryset)."""
    latest = Operation.objects.filter(cluster=OuterRef("pk"), exclusive=True).order_by("-created").values("pk")[:1]
    clusters = clusters.select_related("project").prefetch_related("node_pools").annotate(latest_pk=Subquery(latest))
    found = list(page(clusters) if page else clusters)
    operations = Operation.objects.in_bulk([c.latest_pk for c in found if c.latest_pk])
    for cluster in found:
        operation = operations.get(cluster.latest_pk)
        if operation is not None:
            operation.cluster = cluster
        cluster.known_latest_operation = operation
    return found
