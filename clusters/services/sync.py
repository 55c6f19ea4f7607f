"""The Slurm sync: the one place the console reads a cluster's node states and job queue.

Celery beat runs `clusters.tasks.sync_clusters` every SLURM_SYNC_SECONDS; it sends one
`sync_cluster` task per cluster whose Slurm may be up, and each pulls nodes and jobs once and writes
only the rows that changed, in bulk. Pages and GET endpoints read those rows (clusters.services.live)
and never Slurm, so N open tabs cost the cluster no more Slurm calls than none.

A sync has two rounds. The pull round (backend -> rows) writes what changed: nodes by one UPDATE per
distinct (state, reason), jobs by one upsert per batch (INSERT ... ON CONFLICT DO UPDATE), unchanged
rows not at all. The hooks round lets other apps react to the rows (recipes: each run's Slurm state
and progress, registered with on_sync(); clusters never imports them): a hook that raises is logged
and put on the cluster's timeline, and the sync, and the health scans that pull first, still finish.
Scans and repair detection ask for the pull round only (`hooks=False`).
"""

import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ..backends import get_backend
from ..choices import ClusterStatus, EventLevel, NodeRole
from ..events import record_event
from ..models import Node, SlurmJob, SlurmSync
from ..slurm.states import JOB_ACTIVE
from ..work import BackendError

log = logging.getLogger("clusters.sync")

HOOKS = []
CHUNK = 500  # rows per IN (...) and per bulk write


def on_sync(hook):
    """Register hook(cluster, jobs) to run after each sync that reached Slurm (jobs: {job_id: JobStatus})."""
    if hook not in HOOKS:
        HOOKS.append(hook)
    return hook


def sync_cluster(cluster, *, hooks=True):
    """Pull the cluster's nodes and jobs from Slurm into the database, then (unless hooks=False) run the
    hooks round. Returns "" when Slurm answered, else why not (the rows keep their last known state,
    and the cluster's SlurmSync says since when).

    A sync that another worker holds is not repeated: this returns that sync's last known error."""
    if cluster.status not in ClusterStatus.synced():
        return ""
    state, _ = SlurmSync.objects.get_or_create(cluster=cluster)
    now = timezone.now()
    lease = now + timedelta(seconds=settings.SLURM_SYNC_LEASE_SECONDS)
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    if not SlurmSync.objects.filter(free, pk=cluster.pk).update(claimed_until=lease, attempted=now):
        return state.error
    try:
        error, jobs = pull(cluster, now)
        if hooks and not error:
            run_hooks(cluster, jobs)
        return error
    finally:
        SlurmSync.objects.filter(pk=cluster.pk, claimed_until=lease).update(claimed_until=None)


def pull(cluster, now):
    """The pull round: ("", {job_id: JobStatus}) once the rows hold what Slurm said, or (why not, None)."""
    backend = get_backend(cluster.backend)
    try:
        statuses = backend.node_statuses(cluster)
        jobs = backend.jobs(cluster)
    except (BackendError, OSError, ValueError) as exc:
        return failed(cluster, f"Slurm is not answering: {exc}", now), None
    nodes_written = write_nodes(cluster, statuses, now)
    jobs_written = write_jobs(cluster, jobs, now)
    recovered(cluster, now)
    SlurmSync.objects.filter(pk=cluster.pk).update(
        synced=now, error="", nodes_written=nodes_written, jobs_written=jobs_written
    )
    return "", {job.job_id: job for job in jobs}


HOOK_FAILURE_QUIET = timedelta(minutes=10)  # one timeline entry per failing hook and message in this long


def run_hooks(cluster, jobs):
    """The hooks round: each hook sees the rows the pull wrote; one that raises does not stop the others."""
    for hook in HOOKS:
        try:
            hook(cluster, jobs)
        except SoftTimeLimitExceeded:
            raise  # the task's own time is up: stop here, the next sync goes on
        except Exception as exc:
            name = f"{hook.__module__}.{hook.__qualname__}"
            log.exception("sync hook %s failed on %s", name, cluster)
            message = f"After the Slurm sync, {name} failed: {type(exc).__name__}: {exc}"[:500]
            recent = timezone.now() - HOOK_FAILURE_QUIET
            if not cluster.events.filter(message=message, created__gte=recent).exists():
                record_event(cluster, message, level=EventLevel.ERROR)


def failed(cluster, message, now):
    """Keep the error; once the cluster's Slurm should be up (not while it is being built), note since
    when it has been silent, once on the timeline."""
    message = message[:500]
    watched = cluster.status in ClusterStatus.watched()
    if watched and SlurmSync.objects.filter(pk=cluster.pk, failing_since__isnull=True).update(failing_since=now):
        record_event(cluster, f"{message}; pages show the state as last seen", level=EventLevel.WARNING)
    SlurmSync.objects.filter(pk=cluster.pk).update(error=message)
    log.info("sync of %s failed: %s", cluster, message)
    return message


def recovered(cluster, now):
    since = SlurmSync.objects.filter(pk=cluster.pk).values_list("failing_since", flat=True).first()
    if since and SlurmSync.objects.filter(pk=cluster.pk, failing_since=since).update(failing_since=None):
        local = timezone.localtime(since)
        record_event(cluster, f"Slurm answers again (it had not answered since {local:%H:%M:%S})")


def write_nodes(cluster, statuses, now):
    """Store each compute node's Slurm state where it changed (one UPDATE per distinct state and
    reason); slurm_seen is when it last changed."""
    reported = {status.name: (status.display_state[:64], status.reason[:500]) for status in statuses}
    changed = defaultdict(list)
    rows = cluster.nodes.filter(node_pool__role=NodeRole.COMPUTE).values_list(
        "pk", "name", "slurm_state", "slurm_reason"
    )
    for pk, name, state, reason in rows:
        wanted = reported.get(name)
        if wanted is not None and (state, reason) != wanted:
            changed[wanted].append(pk)
    for (state, reason), pks in changed.items():
        for start in range(0, len(pks), CHUNK):
            Node.objects.filter(pk__in=pks[start : start + CHUNK]).update(
                slurm_state=state, slurm_reason=reason, slurm_seen=now
            )
    return sum(len(pks) for pks in changed.values())


def job_fields(job):
    def when(epoch):
        return datetime.fromtimestamp(epoch, tz=UTC) if epoch else None

    return {
        "name": job.name[:200],
        "user": job.user[:64],
        "state": job.state[:32],
        "partition": job.partition[:63],
        "nodes": job.nodes[:500],
        "node_count": job.node_count,
        "reason": "" if job.reason == "None" else job.reason[:200],
        "exit_code": job.exit_code,
        "submit_time": when(job.submit_time),
        "start_time": when(job.start_time),
        "end_time": None if job.is_active else when(job.end_time),
    }


JOB_FIELDS = [
    "name",
    "user",
    "state",
    "partition",
    "nodes",
    "node_count",
    "reason",
    "exit_code",
    "submit_time",
    "start_time",
    "end_time",
]  # the keys of job_fields()


def write_jobs(cluster, jobs, now):
    """Upsert the jobs that are new or whose fields changed (their `seen` with them), and mark active
    jobs Slurm no longer reports as UNKNOWN; returns how many rows were written.

    What the database holds is read in one range query from the oldest job Slurm reports on (its queue
    is its recent jobs, and job ids grow) and compared as tuples: unchanged rows are not written."""
    fields = {job.job_id: job_fields(job) for job in jobs}
    oldest = min(fields, default=None)
    rows = cluster.slurm_jobs.filter(job_id__gte=oldest) if oldest is not None else cluster.slurm_jobs.none()
    known = {job_id: tuple(values) for job_id, *values in rows.values_list("job_id", *JOB_FIELDS)}
    written = [
        SlurmJob(cluster=cluster, job_id=job_id, seen=now, **values)
        for job_id, values in fields.items()
        if known.get(job_id) != tuple(values[key] for key in JOB_FIELDS)
    ]
    SlurmJob.objects.bulk_create(
        written,
        batch_size=CHUNK,
        update_conflicts=True,
        unique_fields=["cluster", "job_id"],
        update_fields=[*JOB_FIELDS, "seen"],
    )
    return len(written) + mark_lost(cluster, fields, known, oldest, now)


STATE = JOB_FIELDS.index("state")


def mark_lost(cluster, live, known, oldest, now):
    """Active jobs Slurm no longer reports (aged out, or the controller lost them) become UNKNOWN: those
    the range read found (`known`), and the active ones older than it."""
    lost = [job_id for job_id, values in known.items() if values[STATE] in JOB_ACTIVE and job_id not in live]
    older = cluster.slurm_jobs.filter(state__in=JOB_ACTIVE)
    if oldest is not None:
        older = older.filter(job_id__lt=oldest)
    lost += older.values_list("job_id", flat=True)
    for start in range(0, len(lost), CHUNK):
        cluster.slurm_jobs.filter(job_id__in=lost[start : start + CHUNK]).update(
            state="UNKNOWN", reason="Slurm no longer reports this job", seen=now
        )
    return len(lost)
