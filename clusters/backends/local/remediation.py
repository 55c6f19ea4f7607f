"""Repairs on a local cluster: drain and resume through scontrol, a reboot as a real slurmd restart,
holds as Slurm reservations."""

import contextlib
import os
import shutil
import signal

from ... import processes
from ...slurm.client import hostnames, run_client, scontrol_fields
from ...work import TransientBackendError
from . import daemons


def drain(paths, node, reason):
    run_client(paths.conf, "scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason[:100]}")


def resume(paths, node):
    result = run_client(paths.conf, "scontrol", "update", f"nodename={node}", "state=resume", check=False)
    if result.returncode != 0 and "Invalid node state" not in result.stderr:
        raise TransientBackendError(f"scontrol could not resume {node}: {result.stderr.strip()}")


def kill_node(paths, node):
    """What a dead machine looks like to Slurm: its slurmd and its job steps vanish at once."""
    pids = processes.find_pids("slurmd", str(paths.conf), node) + processes.job_processes(str(paths.conf), node)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def reboot(cluster, paths, node, wipe=False):
    """Restart the node as a machine reboot would: Slurm is told first (state DOWN), so the jobs on
    it end (requeueable ones are requeued) instead of waiting on steps that vanished; then its
    slurmd and job steps die, a new slurmd starts, and we wait until that slurmd has registered.
    With `wipe`, the node's folder goes too: the local stand-in for a fresh image."""
    before = daemons.slurmd_start_time(paths, node)
    run_client(paths.conf, "scontrol", "update", f"nodename={node}", "state=down", "reason=tcc reboot", check=False)
    kill_node(paths, node)
    processes.wait_for(lambda: not processes.find_pids("slurmd", str(paths.conf), node), timeout=10)
    if wipe:
        shutil.rmtree(paths.spool / node, ignore_errors=True)
    daemons.start_slurmd(cluster, paths, node)
    daemons.wait_registered(paths, node, before)


def clean_scratch(paths, node):
    shutil.rmtree(paths.spool / node / "scratch", ignore_errors=True)


def hold(paths, name, nodes):
    """A reservation for root: FLEX lets a scan job asking for it use unheld nodes too (scheduled by
    backfill, hence bf_interval=2 in slurm.conf); IGNORE_JOBS lets it cover a node that has jobs."""
    conf = paths.conf
    held = scontrol_fields(conf, "reservation", name).get("Nodes")
    if held:
        nodes = sorted(set(hostnames(conf, held)) | set(nodes))
        args = ["update", f"reservationname={name}", f"nodes={','.join(nodes)}"]
    else:
        args = ["create", "reservation", f"reservationname={name}", f"nodes={','.join(nodes)}", "users=root"]
        args += ["starttime=now", "duration=infinite", "flags=flex,ignore_jobs"]
    result = run_client(conf, "scontrol", *args, check=False)
    if result.returncode != 0:
        raise TransientBackendError(f"Slurm refused hold {name} on {', '.join(nodes)}: {result.stderr.strip()}")


def release(paths, name):
    """Delete the reservation; Slurm refuses while a job that asked for it is still completing."""
    errors = []

    def deleted():
        result = run_client(paths.conf, "scontrol", "delete", f"reservationname={name}", check=False)
        errors[:] = [result.stderr.strip()]
        gone = ("Invalid reservation name", "Requested reservation is invalid")
        return result.returncode == 0 or any(text in result.stderr for text in gone)

    if not processes.wait_for(deleted, timeout=30, interval=0.5, waiting_for=f"Slurm to end hold {name}"):
        raise TransientBackendError(f"Slurm would not end hold {name}: {errors[0]}")
