"""Runs that outlive their cluster: the registry keeps each run's newest checkpoint and its TensorBoard
event files as artifacts of the run's MLflow run ("checkpoints/step-<N>/" and "tensorboard/"), copied
from the cluster through its agent as the run goes (whenever it has saved a newer checkpoint, and once
it has ended) and one last time before its cluster is deleted (runs/keep.py). The run page, its
curves (the metrics rows and MLflow's metrics) and the kept checkpoint stay when the cluster goes; a run
on another cluster starts from that checkpoint (stage_checkpoint copies it into that cluster's home).

One checkpoint per run is kept (the newest; the one it replaces is deleted once the new one is whole).
A checkpoint larger than settings.RUN_ARCHIVE_MAX_BYTES is not copied through the console: a full-size
one is tens of GB (Llama 3.1 8B: fp32 weights and AdamW's two moments, 12 bytes a parameter, about
96 GB) and belongs on the cluster's own storage or a bucket; the run records why it was not kept
(archive["skipped"]) and its page says so.

    keep(run, final=False)              copy what is newer than what is kept; returns run.archive
    stage_checkpoint(run, cluster)      (path in the cluster's home, step) of the kept checkpoint there
    download_tensorboard(run, target)   the kept event files, for the run page's download
"""

import logging
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters import services as clusters
from clusters.choices import ClusterStatus
from console.errors import Conflict, ConsoleError

from ..models import Run
from .versions import RegistryUnavailable, answering, beating, client, mlflow_run, stage_folder

log = logging.getLogger(__name__)
GOING = (ClusterStatus.DELETING, ClusterStatus.DELETED)


def newest_checkpoint(run):
    """The step of the run's newest checkpoint on its cluster (the folders train.py renames into place
    whole: checkpoints/step-<N>), or None."""
    names = clusters.list_files(run.cluster, run.in_home("checkpoints"), "step-*")
    steps = [int(name[5:]) for name in names if name[5:].isdigit()]
    return max(steps, default=None)


def keep_files(run_id):
    """The tracking task's call after each sync that stored something: keep what the run saved since
    (the last time for a run that has ended). A cluster agent that does not answer is left for the next
    call; RegistryUnavailable is for the task to retry."""
    run = Run.objects.filter(pk=run_id).select_related("cluster__project").first()
    if run is None or run.cluster.status in GOING or (run.archive or {}).get("final"):
        return  # a cluster being deleted keeps its runs' files in its DELETE operation (runs/keep.py)
    try:
        keep(run, final=run.is_done)
    except RegistryUnavailable:
        raise
    except ConsoleError as exc:
        log.warning("run %s: its files were not kept this time: %s", run.uuid, exc)


def keep(run, *, final=False):
    """Copy into the registry what the run saved since the last call: its newest checkpoint when it is
    newer than the one kept, and its TensorBoard files with it (or, `final`: the run has ended or its
    cluster is going, whatever the checkpoint). ConsoleError when the cluster's agent cannot be read;
    RegistryUnavailable when MLflow is silent (what was copied stays recorded)."""
    archive = dict(run.archive or {})
    step = newest_checkpoint(run)
    fresh = step is not None and step > archive.get("step", -1) and step != archive.get("skipped_step")
    if not fresh and not final:
        return archive
    with tempfile.TemporaryDirectory(prefix="tcc-keep-") as temporary:
        with answering("keep the run's files"):
            mlflow = client()
            run_id = mlflow_run(mlflow, run)
        events = clusters.file_sizes(run.cluster, run.in_home("tensorboard"))
        written = sum(events.values())
        if written > settings.RUN_ARCHIVE_MAX_BYTES:  # scalars are KB to MB: not TensorBoard's
            archive["tensorboard_skipped"] = f"its tensorboard folder holds {gib(written)}, over RUN_ARCHIVE_MAX_BYTES"
        elif events and events != archive.get("tensorboard"):
            local = Path(temporary) / "tensorboard"
            clusters.download_folder(run.cluster, run.in_home("tensorboard"), local, files=events)
            with answering("keep the run's TensorBoard files"):
                mlflow.log_artifacts(run_id, str(local), "tensorboard")
            archive["tensorboard"] = events  # the sizes listed: a file grown since is copied again next time
        replaced = None
        if fresh:
            replaced, archive = keep_checkpoint(run, run_id, step, archive, Path(temporary))
        archive["at"] = timezone.now().isoformat()
        if final:
            archive["final"] = True
    archive = record(run, archive)
    if replaced is not None and replaced != archive.get("step"):
        forget(run_id, replaced)
    return archive


def keep_checkpoint(run, run_id, step, archive, temporary):
    """(the step it replaces or None, the archive) once checkpoint `step` is in the registry, or the
    archive saying why it is not."""
    folder = run.in_home("checkpoints", f"step-{step}")
    files = clusters.file_sizes(run.cluster, folder)
    size = sum(files.values())
    limit = settings.RUN_ARCHIVE_MAX_BYTES
    if size > limit:
        archive.update(
            skipped_step=step,
            skipped=f"step {step}'s checkpoint is {gib(size)}, over the {gib(limit)} the console copies into "
            "the registry (RUN_ARCHIVE_MAX_BYTES): it stays on the cluster's storage only",
        )
        return None, archive
    local = temporary / f"step-{step}"
    try:
        copied = clusters.download_folder(run.cluster, folder, local, files=files)
    except Conflict:
        # train.py keeps two checkpoints and removes the older as it saves: this one went while it was
        # read. The next call keeps the newer one.
        log.info("run %s: checkpoint step-%s went while it was copied", run.uuid, step)
        return None, archive
    with answering("keep the run's checkpoint"):
        beating(
            lambda: client().log_artifacts(run_id, str(local), f"checkpoints/step-{step}"),
            f"keeping run {run.recipe_id}'s checkpoint (step {step}) in the registry",
        )
    replaced = archive.get("step")
    archive.update(step=step, bytes=copied)
    archive.pop("skipped", None)
    archive.pop("skipped_step", None)
    return replaced, archive


def record(run, archive):
    """Store the archive unless another worker kept a newer checkpoint meanwhile (then theirs stands,
    with our TensorBoard copy); returns what is stored."""
    with transaction.atomic():
        stored = Run.objects.select_for_update().get(pk=run.pk).archive or {}
        if stored.get("step", -1) > archive.get("step", -1):
            archive = {**archive, **{k: stored[k] for k in ("step", "bytes") if k in stored}}
        Run.objects.filter(pk=run.pk).update(archive=archive)
    run.archive = archive
    return archive


def forget(run_id, step):
    """Delete a replaced checkpoint from the run's artifacts (best effort: a leftover costs storage only)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    try:
        with answering("delete a replaced checkpoint"):
            uri = client().get_run(run_id).info.artifact_uri
            repository = get_artifact_repository(uri, tracking_uri=settings.MLFLOW_TRACKING_URI)  # not MLflow's global
            repository.delete_artifacts(f"checkpoints/step-{step}")
    except ConsoleError as exc:
        log.warning("run %s: the replaced checkpoint step-%s stays in the registry: %s", run_id, step, exc)


def staged_checkpoint_path(run):
    """Where stage_checkpoint() puts the run's kept checkpoint in a cluster's shared home."""
    return f"models/runs/{run.uuid}/step-{run.archive['step']}"


def stage_checkpoint(run, cluster):
    """(path in the cluster's shared home, step) of the run's kept checkpoint, copied there from the
    registry the first time (the folder appears whole or not at all). Conflict when none is kept."""
    if "step" not in (run.archive or {}):
        raise Conflict(not_kept(run))
    step = run.archive["step"]
    path = stage_folder(
        cluster, staged_checkpoint_path(run), "meta.json",
        lambda target: client().download_artifacts(run.mlflow_run_id, f"checkpoints/step-{step}", target),
        doing="hand out the run's checkpoint", detail=f"downloading run {run.recipe_id}'s checkpoint from the registry",
        what=f"the registry's copy of run {run.uuid}'s checkpoint",
    )  # fmt: skip
    return path, step


def download_tensorboard(run, target):
    """The run's kept TensorBoard event files, downloaded into the local folder `target`; their folder."""
    with answering("hand out the run's TensorBoard files"):
        return Path(client().download_artifacts(run.mlflow_run_id, "tensorboard", str(target)))


def not_kept(run):
    """Why a run's checkpoint cannot start a run elsewhere (its cluster's name and the registry's reason)."""
    deleted = run.cluster.is_deleted
    where = f"{'were' if deleted else 'are'} on cluster {run.cluster.name}{' (deleted)' if deleted else ''}"
    reason = (run.archive or {}).get("skipped") or "the registry keeps none of them"
    return f"that run's checkpoints {where}, and {reason}"


def gib(size):
    return f"{size / (1 << 30):.1f} GiB"
