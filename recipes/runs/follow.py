"""Runs follow their Slurm jobs: the sync hook stores each active run's progress (metrics lines, the
log's tail) and moves it to what its job says, with compare-and-set transitions; cancel."""

import json
from pathlib import Path

from django.utils import timezone

from clusters import services as clusters
from clusters.choices import EventLevel
from clusters.events import record_event
from clusters.slurm import states
from console.errors import Conflict, ConsoleError

from .. import registry
from ..models import Run, RunMetric, RunStatus
from . import alerts


def run_status(job_state):
    """The run status a Slurm job state means (states: clusters.slurm.states)."""
    if job_state in states.JOB_COMPLETED:
        return RunStatus.COMPLETED
    if job_state in states.JOB_CANCELLED:
        return RunStatus.CANCELLED
    if job_state in states.JOB_FAILED:
        return RunStatus.FAILED
    if job_state in states.JOB_RUNNING:
        return RunStatus.RUNNING
    return RunStatus.QUEUED


def in_run(run, *parts):
    """A path in the run's folder relative to the cluster's shared home, for the cluster agent."""
    return run.in_home(*parts)


def latest_checkpoint(run):
    """(absolute path on the cluster, saved step) of the run's newest checkpoint, or None."""
    step = registry.newest_checkpoint(run)
    if step is None:
        return None
    name = f"step-{step}"
    meta = json.loads(clusters.read_file(run.cluster, in_run(run, "checkpoints", name, "meta.json")))
    return Path(run.work_dir) / "checkpoints" / name, meta["step"]


def result_of(run):
    """The run's result.json as a dict, or None while it has none."""
    if not clusters.file_exists(run.cluster, in_run(run, "result.json")):
        return None
    return json.loads(clusters.read_file(run.cluster, in_run(run, "result.json")))


def sync_runs(cluster, jobs):
    """The Slurm sync's hook (clusters.services.on_sync): store the progress of each active run of the
    cluster and follow its job in `jobs` ({job_id: JobStatus}, Slurm's queue at this sync)."""
    for run in cluster.runs.filter(status__in=RunStatus.active()):
        rows = read_progress(run)  # first: a job Slurm already reports ended has written all it will
        try:
            follow_run(run, jobs.get(run.slurm_job_id))
            alerts.watch(run, rows)
        except ConsoleError:
            continue  # the agent is not answering: judge the run at the next sync
        finally:
            registry.after_sync(run, len(rows), run.is_done)  # MLflow hears of it (in a task)


def refresh_run(run):
    """Ask Slurm for this one run's job now and store what it says (for scripts and tests; pages and
    the API read what the sync stored)."""
    if run.is_done or run.slurm_job_id is None:
        return run
    try:
        job = clusters.job_status(run.cluster, run.slurm_job_id)
    except ConsoleError:
        return run  # Slurm unreachable: keep what we know
    rows = read_progress(run)
    follow_run(run, job)
    alerts.watch(run, rows)
    return run


def read_progress(run):
    """Store the metrics lines the run appended since the last read, and its log's tail (through the
    cluster agent); a silent agent leaves both as they were."""
    try:
        chunk = clusters.read_file(run.cluster, in_run(run, "metrics.jsonl"), run.metrics_offset, METRICS_READ_BYTES)
    except ConsoleError:
        chunk = None  # no metrics yet, or the agent is not answering
    try:
        logs = clusters.list_files(run.cluster, in_run(run), "slurm-*.out")
        log = clusters.tail_file(run.cluster, in_run(run, logs[-1]), LOG_TAIL_LINES) if logs else ""
    except ConsoleError:
        log = run.log_tail
    rows, done = [], 0
    if chunk:
        done = chunk.rfind(b"\n") + 1  # a line still being written waits for the next sync
        line = run.metric_rows.count()
        for raw in chunk[:done].splitlines():
            try:
                record = json.loads(raw)  # Python's json reads the NaN and Infinity train.py writes
                step = int(record["step"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # not a metrics line: skipped, never fatal
            record, _ = alerts.finite(record)
            rows.append(RunMetric(run=run, line=line, step=max(step, 0), values=record))
            line += 1
    RunMetric.objects.bulk_create(rows, ignore_conflicts=True)
    fields = {"metrics_offset": run.metrics_offset + done, "log_tail": log, "progress_synced": timezone.now()}
    if rows:
        fields["metrics_seen"] = fields["progress_synced"]
    Run.objects.filter(pk=run.pk).update(**fields)
    for key, value in fields.items():
        setattr(run, key, value)
    return rows


METRICS_READ_BYTES = 4 << 20  # per sync; a longer backlog is read over the next syncs
LOG_TAIL_LINES = 40


def follow_run(run, job):
    """Move the run to what its Slurm job (a JobStatus, or None once Slurm forgot it) says; a
    transition is recorded at most once (compare-and-set)."""
    if run.is_done:
        return run
    now = timezone.now()
    if job is None:
        # Slurm forgot the job: judge by what the run left behind.
        new = RunStatus.COMPLETED if result_of(run) is not None else RunStatus.FAILED
        fields = {"finished": now}
        if new == RunStatus.FAILED:
            fields["error"] = "Slurm no longer knows the job and it left no result"
        moved = run.set_status(new, expected=RunStatus.active(), **fields)
    else:
        new = run_status(job.state)
        if new == RunStatus.COMPLETED and result_of(run) is None:
            new = RunStatus.FAILED  # judge success by the result, not only the exit code
        fields = {
            "slurm_state": job.state,
            "slurm_reason": "" if job.reason == "None" else job.reason,
            "exit_code": job.exit_code,
        }
        if new == RunStatus.RUNNING and run.started is None:
            fields["started"] = now
        if new in RunStatus.done():
            fields["finished"] = now
            if new == RunStatus.FAILED:
                fields["error"] = f"Slurm job {job.state.lower()} (exit code {job.exit_code})"
        if new == run.status:
            if any(getattr(run, key) != value for key, value in fields.items()):
                Run.objects.filter(pk=run.pk).update(**fields)
                for key, value in fields.items():
                    setattr(run, key, value)
            return run
        moved = run.set_status(new, expected=RunStatus.active(), **fields)
    if moved:
        level = EventLevel.ERROR if run.status == RunStatus.FAILED else EventLevel.INFO
        record_event(
            run.cluster,
            f"Run {run.recipe_id} (job {run.slurm_job_id}) is {run.get_status_display().lower()}",
            level=level,
        )
    return run


def cancel_run(run):
    if run.is_done:
        raise Conflict(f"The run has already {run.get_status_display().lower()}")
    try:
        clusters.cancel_job(run.cluster, run.slurm_job_id)
    except ConsoleError as exc:
        raise Conflict(f"scancel failed: {exc.message}") from None
    if run.set_status(
        RunStatus.CANCELLED, expected=RunStatus.active(), finished=timezone.now(), slurm_state="CANCELLED"
    ):
        record_event(run.cluster, f"Run {run.recipe_id} (job {run.slurm_job_id}) cancelled")
    return run


def log_name(run):
    """The name of the run's newest output file (slurm-<job>.out; a requeue appends to it), or ""."""
    logs = clusters.list_files(run.cluster, in_run(run), "slurm-*.out")
    return logs[-1] if logs else ""


def log_chunks(run, name, size=1 << 20):
    """The whole output file `name` of the run, in chunks read through the cluster agent."""
    offset = 0
    while True:
        chunk = clusters.read_file(run.cluster, in_run(run, name), offset, size)
        if not chunk:
            return
        yield chunk
        offset += len(chunk)
