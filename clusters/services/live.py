"""What Slurm says now: node states and the job queue, read from the cluster's backend and kept in the
database (so history outlives Slurm's memory and pages still show the last known state)."""

from datetime import UTC, datetime

from django.utils import timezone

from ..backends import get_backend
from ..choices import ClusterStatus, NodeRole
from ..models import Node, SlurmJob
from ..slurm.states import JOB_ACTIVE
from ..work import BackendError


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
            "end_time": None if job.is_active else when(job.end_time),
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
    cluster.slurm_jobs.filter(state__in=JOB_ACTIVE).exclude(job_id__in=live).update(
        state="UNKNOWN", reason="Slurm no longer reports this job"
    )
