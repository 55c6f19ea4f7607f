"""Runs that outlive their cluster: the registry keeps each run's newest checkpoint and its TensorBoard
event files as artifacts of the run's MLflow run ("checkpoints/step-<N>/" and "tensorboard/"), copied
from the cluster through its agent as the run goes (whenever it has saved a newer checkpoint, and once
it has ended) and one last time before its cluster is deleted (runs/keep.py). The run page, its
curves (the metrics rows and MLflow's metrics) and the kept checkpoint stay when the cluster goes; a run
on another cluster starts from that checkpoint (stage_checkpoint copies it into that cluster's home).

One checkpoint per run is kept (the newest; the one it replaces is deleted once the new one is whole).
A checkpoint larger than settings.RUN_ARCHIVE_MAX_BYTES is not copied through the console: a full-size
one is tens of GB (Llama 3.1 8B: fp32 weights and AdamW's two moments, 12 bytes a parameter, about
96 GB). It goes from the cluster straight into the artifact store instead (direct.py: MLflow's
multipart upload, each part sent by the cluster agent), in a task of its own (copy_checkpoint: the
console's Celery tasks run for an hour at most, so a copy goes on file by file from where the last one
stopped, recorded in archive["copying"] with the bytes sent for the run page's progress bar), or inside
the cluster's DELETE operation when the cluster is going. A store that takes no multipart uploads (the
embedded registry's folder), or a checkpoint over RUN_ARCHIVE_DIRECT_MAX_BYTES, is not kept: the run
records why (archive["skipped"]) and its page says so.

    keep(run, final=False, wait=False)  copy what is newer than what is kept; returns run.archive
    copy_checkpoint(run_id, step)       the task's call: a large checkpoint, straight from the cluster
    stage_checkpoint(run, cluster)      (path in the cluster's home, step) of the kept checkpoint there
    download_tensorboard(run, target)   the kept event files, for the run page's download
"""

import logging
import secrets
import tempfile
from copy import deepcopy
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters import services as clusters
from clusters.choices import ClusterStatus
from clusters.work import heartbeat
from console.errors import Conflict, ConsoleError

from ..models import Run
from ..queue import later
from . import direct
from .versions import RegistryUnavailable, answering, artifacts, beating, client, mlflow_run, stage_folder

log = logging.getLogger(__name__)
GOING = (ClusterStatus.DELETING, ClusterStatus.DELETED)
COPY_STALLED = 1800  # a copy records progress after every part (128 MiB by default)


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


def keep(run, *, final=False, wait=False):
    """Copy into the registry what the run saved since the last call: its newest checkpoint when it is
    newer than the one kept, and its TensorBoard files with it (or, `final`: the run has ended or its
    cluster is going, whatever the checkpoint). A large checkpoint is copied by copy_checkpoint's task,
    or here when `wait` (the cluster is going). ConsoleError when the cluster's agent cannot be read;
    RegistryUnavailable when MLflow is silent (what was copied stays recorded)."""
    archive = dict(run.archive or {})
    step = newest_checkpoint(run)
    fresh = step is not None and step > archive.get("step", -1) and step != archive.get("skipped_step")
    copying = archive.get("copying") or {}
    if copying and copying["step"] == step:
        fresh = False  # its copy is under way (a task's), or finished below when `wait`
        same = lambda archive: archive.get("copying") == copying  # noqa: E731 - read under the row's lock
        if not wait and stalled(copying) and change_archive(run, restart, only_if=same):
            later("copy_checkpoint", run.pk, step)  # its task gave up or was lost: a new one goes on from there
        if not final and not wait:
            return run.archive
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
        started = fresh and archive.get("copying", {}).get("step") == step
        archive["at"] = timezone.now().isoformat()
        if final:
            archive["final"] = True
    archive = record(run, archive, started=started)
    if replaced is not None and replaced != archive.get("step"):
        forget(run_id, replaced)
    if wait and archive.get("copying", {}).get("step") == step:
        archive = store_directly(run, step, force=True)  # the cluster is going: the copy cannot wait for a task
    elif started:
        later("copy_checkpoint", run.pk, step)  # after the commit: the task reads what was recorded
    return archive


def keep_checkpoint(run, run_id, step, archive, temporary):
    """(the step it replaces or None, the archive) once checkpoint `step` is in the registry, or the
    archive saying why it is not, or (a large one) that its copy is to start (archive["copying"])."""
    folder = run.in_home("checkpoints", f"step-{step}")
    files = clusters.file_sizes(run.cluster, folder)
    size = sum(files.values())
    limit = settings.RUN_ARCHIVE_MAX_BYTES
    if size > limit:
        why = ""
        if size > settings.RUN_ARCHIVE_DIRECT_MAX_BYTES:
            why = f"over RUN_ARCHIVE_DIRECT_MAX_BYTES ({gib(settings.RUN_ARCHIVE_DIRECT_MAX_BYTES)})"
        else:
            try:
                direct.repository(client(), run_id)
                for each in files.values():
                    direct.part_size(each)
            except direct.NotDirect as exc:
                why = exc.message
        if why:
            archive.update(skipped_step=step, skipped=too_big(step, size, why))
            return None, archive
        archive["copying"] = {"step": step, "bytes": size, "sent": 0, "files": {}, "at": timezone.now().isoformat()}
        archive.pop("skipped", None)
        archive.pop("skipped_step", None)
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
    archive.pop("direct", None)
    archive.pop("skipped", None)
    archive.pop("skipped_step", None)
    return replaced, archive


def copy_checkpoint(run_id, step):
    """The task's call: copy the run's large checkpoint `step` straight from its cluster into the
    registry, from where the last try stopped. Nothing when another step is copied by now, or the cluster
    is going (its DELETE copies it)."""
    run = Run.objects.filter(pk=run_id).select_related("cluster__project").first()
    if run is None or run.cluster.status in GOING or (run.archive or {}).get("copying", {}).get("step") != step:
        return
    store_directly(run, step)


class Superseded(Exception):
    """Another worker took the copy over, or a newer checkpoint's copy replaced it."""


class CopyBusy(Exception):
    """Another worker is copying that checkpoint (its task tries again later: the owner may have died)."""


def store_directly(run, step, force=False):
    """Send the checkpoint's files not sent yet (direct.py), recording each one sent; once all are, the
    checkpoint is the kept one and the one it replaced goes. One worker copies at a time (the copy's
    `owner`; `force`: the cluster's DELETE takes it over); a checkpoint that went meanwhile (train.py keeps
    two) or that a newer one replaced is given up, its files sent so far deleted. Returns the archive."""
    token = secrets.token_hex(4)

    def ours(archive, claiming=False):
        copying = archive.get("copying") or {}
        owner = copying.get("owner")
        return copying.get("step") == step and (
            owner == token or (claiming and (force or owner is None or stalled(copying)))
        )

    def progress(change):
        def apply(archive):
            change(archive["copying"])
            archive["copying"]["at"] = timezone.now().isoformat()

        if not change_archive(run, apply, only_if=ours):
            raise Superseded

    if not change_archive(run, lambda a: a["copying"].update(owner=token), only_if=lambda a: ours(a, claiming=True)):
        if (run.archive.get("copying") or {}).get("step") != step:
            return run.archive  # done, or replaced by a newer one's
        raise CopyBusy(f"run {run.uuid}: another worker copies checkpoint step-{step}")
    try:
        return send_directly(run, step, ours, progress)
    except BaseException:  # the task's time limit, a silent registry: the next try goes on from here
        change_archive(run, lambda archive: archive["copying"].pop("owner"), only_if=ours)
        raise


def send_directly(run, step, ours, progress):
    """store_directly's work once this worker owns the copy (`ours`; progress(change) records, or raises
    Superseded when the copy is no longer this worker's)."""
    folder = run.in_home("checkpoints", f"step-{step}")
    with answering("keep the run's checkpoint"):
        mlflow = client()
        run_id = mlflow_run(mlflow, run)
    try:
        repo = direct.repository(mlflow, run_id)
        files = clusters.file_sizes(run.cluster, folder)
        for name, size in sorted(files.items()):
            if run.archive["copying"]["files"].get(name) == size:
                continue  # sent by an earlier try

            def sent(count, name=name):
                progress(lambda copy: copy.update(sent=copy["sent"] + count))
                heartbeat(f"{copied_share(run)} sent to the registry ({name})")  # in an operation

            direct.send_file(run.cluster, repo, f"{folder}/{name}", name, size, f"checkpoints/step-{step}", sent)
            progress(lambda copy, name=name, size=size: copy["files"].update({name: size}))
    except (Conflict, Superseded) as exc:
        log.info("run %s: checkpoint step-%s is not copied: %s", run.uuid, step, exc or "another copy took over")
        change_archive(run, lambda archive: archive.pop("copying"), only_if=ours)
        forget_unless_kept(run, run_id, step)
        return run.archive
    except direct.NotDirect as exc:  # MLflow's store said so when asked (its folder store takes no parts)
        reason = exc.message

        def refused(archive):
            size = archive.pop("copying")["bytes"]
            archive.update(skipped_step=step, skipped=too_big(step, size, reason))

        change_archive(run, refused, only_if=ours)
        return run.archive
    replaced = run.archive.get("step")
    total = sum(files.values())

    def kept(archive):
        archive.update(step=step, bytes=total, direct=True, at=timezone.now().isoformat())
        archive.pop("copying")

    if change_archive(run, kept, only_if=lambda archive: ours(archive) and archive.get("step", -1) < step):
        if replaced is not None:
            forget(run_id, replaced)
    else:
        forget_unless_kept(run, run_id, step)
    return run.archive


def forget_unless_kept(run, run_id, step):
    """Delete what a given-up copy sent of checkpoint `step`, unless it is the kept one or is being copied."""
    stored = Run.objects.get(pk=run.pk).archive or {}
    if stored.get("step") != step and (stored.get("copying") or {}).get("step") != step:
        forget(run_id, step)


def change_archive(run, change, only_if):
    """change(archive) of the stored archive, under its row's lock, when only_if(archive): whether it was
    changed (run.archive is the stored one after)."""
    with transaction.atomic():
        archive = deepcopy(Run.objects.select_for_update().get(pk=run.pk).archive or {})
        changed = only_if(archive)
        if changed:
            change(archive)
            Run.objects.filter(pk=run.pk).update(archive=archive)
    run.archive = archive
    return changed


def too_big(step, size, why):
    limit = settings.RUN_ARCHIVE_MAX_BYTES
    return (f"step {step}'s checkpoint is {gib(size)}, over the {gib(limit)} the console copies through itself "
            f"(RUN_ARCHIVE_MAX_BYTES), and {why}: it stays on the cluster's storage only")  # fmt: skip


def restart(archive):
    archive["copying"].pop("owner", None)
    archive["copying"]["at"] = timezone.now().isoformat()


def stalled(copying):
    """Whether a copy has not moved for COPY_STALLED seconds (its task was lost, or gave up retrying)."""
    return (timezone.now() - datetime.fromisoformat(copying["at"])).total_seconds() > COPY_STALLED


def copied_share(run):
    copy = run.checkpoint_copy
    return f"{copy['percent']}% of {gib(copy['bytes'])}"


def record(run, archive, started=False):
    """Store the archive unless another worker kept a newer checkpoint meanwhile (then theirs stands,
    with our TensorBoard copy); the copy under way stays as its task recorded it, unless this call
    `started` one. Returns what is stored."""

    def merge(stored):
        ours = dict(archive)
        if stored.get("step", -1) > ours.get("step", -1):
            ours.update({k: stored[k] for k in ("step", "bytes", "direct") if k in stored})
            if not stored.get("direct"):
                ours.pop("direct", None)
        if not started:
            ours.pop("copying", None)
            if "copying" in stored:
                ours["copying"] = stored["copying"]
        if ours.get("copying", {}).get("step", -1) <= ours.get("step", -1):
            ours.pop("copying", None)  # a newer checkpoint was kept: the older one's copy stops
        stored.clear()
        stored.update(ours)

    change_archive(run, merge, only_if=lambda stored: True)
    return run.archive


def forget(run_id, step):
    """Delete a replaced checkpoint from the run's artifacts (best effort: a leftover costs storage only)."""
    try:
        with answering("delete a replaced checkpoint"):
            _uri, repository = artifacts(client(), run_id)
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
    return f"{size / (1 << 30):.1f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.1f} MiB"
