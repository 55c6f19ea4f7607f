"""Runs outlive their cluster: before a cluster's DELETE operation takes its files away (the first step
of the operation, an extension registered here with the engine), each run's last progress is stored,
a run still active is cancelled (its Slurm goes with the cluster) and the registry keeps its newest
checkpoint and TensorBoard files (registry.keep). The run page, its curves and that checkpoint stay;
a run on another cluster starts from it (launch.py: init_from the run's id)."""

import contextlib

from django.utils import timezone

from clusters import operations
from clusters.choices import EventLevel, OperationKind
from clusters.events import record_event
from clusters.work import Step
from console.errors import ConsoleError, Unavailable

from .. import registry
from ..models import Run, RunStatus
from .follow import read_progress


def keep_steps(ctx):
    if not ctx.cluster.runs.exclude(status=RunStatus.SUBMITTING).exists():
        return []
    return [Step("Keep the runs' checkpoints and TensorBoard files in the registry", keep_runs)]


def keep_runs(ctx):
    cluster = ctx.cluster
    unreachable = ""  # once the cluster's agent does not answer, no other run of it is tried
    lost = []
    for run in cluster.runs.exclude(status=RunStatus.SUBMITTING).select_related("cluster__project"):
        ctx.heartbeat(f"keeping run {run.recipe_id} ({str(run.uuid)[:8]})")
        if run.status in RunStatus.active():
            if not unreachable:
                with contextlib.suppress(ConsoleError):
                    read_progress(run)  # the steps it logged last
            if run.set_status(
                RunStatus.CANCELLED,
                expected=RunStatus.active(),
                finished=timezone.now(),
                error="Its cluster was deleted while it ran",
            ):
                registry.after_sync(run, 0, True)  # MLflow hears that it ended
                record_event(
                    cluster,
                    f"Run {run.recipe_id} (job {run.slurm_job_id}) cancelled: the cluster is being deleted",
                    operation=ctx.operation,
                )
        if (run.archive or {}).get("final") and not (run.archive or {}).get("copying"):
            continue
        reason = unreachable
        if not reason:
            try:
                registry.keep(run, final=True, wait=True)
                continue
            except registry.RegistryUnavailable as exc:
                reason = exc.message
            except Unavailable as exc:
                reason = unreachable = exc.message
            except ConsoleError as exc:
                reason = exc.message
        archive = {**(run.archive or {}), "final": True}
        archive.setdefault("skipped", f"it was not kept before its cluster was deleted: {reason}")
        copying = archive.pop("copying", None)  # a large checkpoint's copy cannot go on without its cluster
        if copying and run.mlflow_run_id:
            registry.forget(run.mlflow_run_id, copying["step"])  # the files it had sent (best effort)
        Run.objects.filter(pk=run.pk).update(archive=archive)
        lost.append((run, reason))
    if lost:
        names = ", ".join(f"{run.recipe_id} ({str(run.uuid)[:8]})" for run, _ in lost[:5])
        more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
        record_event(
            cluster,
            f"{len(lost)} run(s) not kept in the registry before the cluster's deletion: {names}{more}: {lost[0][1]}",
            level=EventLevel.WARNING,
            operation=ctx.operation,
        )


operations.extend(OperationKind.DELETE, operations.Extension(first_steps=keep_steps))
