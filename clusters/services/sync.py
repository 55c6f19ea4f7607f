"""The Slurm sync: the one place the console reads a cluster's node states and job queue.

Celery beat runs `clusters.tasks.sync_clusters` every SLURM_SYNC_SECONDS; it sends one
`sync_cluster` task per cluster whose Slurm may be up, and each pulls nodes and jobs once and writes
only the rows that changed, in bulk. Pages and GET endpoints read those rows (clusters.services.live)
and never Slurm, so N open tabs cost the cluster no more Slurm calls than none.

Other apps keep their own rows in step through hooks registered with on_sync() (recipes: each
run's Slurm state and progress); clusters never imports them.
"""

import logging
from datetime import UTC, datetime, timedelta

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


def sync_cluster(cluster):
    """Pull the cluster's nodes and jobs from Slurm into the database. Returns "" when Slurm answered,
    else why not (the rows keep their last known state, and the cluster's SlurmSync says since when).

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
        backend = get_backend(cluster.backend)
        try:
            statuses = backend.node_statuses(cluster)
            jobs = backend.jobs(cluster)
        except (BackendError, OSError, ValueError) as exc:
            return failed(cluster, f"Slurm is not answering: {exc}", now)
        nodes_written = write_nodes(cluster, statuses, now)
        jobs_written = write_jobs(cluster, jobs, now)
        recovered(cluster, now)
        SlurmSync.objects.filter(pk=cluster.pk).update(
            synced=now, error="", nodes_written=nodes_written, jobs_written=jobs_written
        )
        by_id = {job.job_id: job for job in jobs}
        for hook in HOOKS:
            hook(cluster, by_id)
        return ""
    finally:
        SlurmSync.objects.filter(pk=cluster.pk, claimed_until=lease).update(claimed_until=None)


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
    """Store each compute node's Slurm state where it changed; slurm_seen is when it last changed."""
    reported = {status.name: status for status in statuses}
    changed = []
    rows = cluster.nodes.filter(node_pool__role=NodeRole.COMPUTE).only(
        "pk", "cluster", "name", "slurm_state", "slurm_reason"
    )
    for node in rows:
        status = reported.get(node.name)
        if status is None:
            continue
        state, reason = status.display_state[:64], status.reason[:500]
        if (node.slurm_state, node.slurm_reason) != (state, reason):
            node.slurm_state, node.slurm_reason, node.slurm_seen = state, reason, now
            changed.append(node)
    Node.objects.bulk_update(changed, ["slurm_state", "slurm_reason", "slurm_seen"], batch_size=CHUNK)
    return len(changed)


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
    """Insert new jobs, update the ones whose fields changed (their `seen` with them), and mark active
    jobs Slurm no longer reports as UNKNOWN; returns how many rows were written."""
    fields = {job.job_id: job_fields(job) for job in jobs}
    ids = list(fields)
    known = {}
    for start in range(0, len(ids), CHUNK):
        for row in cluster.slurm_jobs.filter(job_id__in=ids[start : start + CHUNK]).only(
            "pk", "cluster", "job_id", *JOB_FIELDS
        ):
            known[row.job_id] = row
    new = [SlurmJob(cluster=cluster, job_id=i, seen=now, **values) for i, values in fields.items() if i not in known]
    changed = []
    for job_id, row in known.items():
        values = fields[job_id]
        if any(getattr(row, key) != value for key, value in values.items()):
            for key, value in values.items():
                setattr(row, key, value)
            row.seen = now
            changed.append(row)
    SlurmJob.objects.bulk_create(new, batch_size=CHUNK, ignore_conflicts=True)
    SlurmJob.objects.bulk_update(changed, [*JOB_FIELDS, "seen"], batch_size=CHUNK)
    return len(new) + len(changed) + mark_lost(cluster, set(fields), now)


def mark_lost(cluster, live, now):
    """Active jobs Slurm no longer reports (aged out, or the controller lost them) become UNKNOWN."""
    active = cluster.slurm_jobs.filter(state__in=JOB_ACTIVE).values_list("pk", "job_id")
    lost = [pk for pk, job_id in active if job_id not in live]
    for start in range(0, len(lost), CHUNK):
        SlurmJob.objects.filter(pk__in=lost[start : start + CHUNK]).update(
            state="UNKNOWN", reason="Slurm no longer reports this job", seen=now
        )
    return len(lost)
