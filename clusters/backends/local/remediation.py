"""Repairs on a local cluster that are the machine's, not Slurm's: a reboot as a real slurmd restart,
a scratch wipe, and killing a node for fault drills. Drain, resume and holds are the base backend's
(through the cluster agent)."""

import contextlib
import os
import shutil
import signal

from ... import processes
from . import daemons


def kill_node(paths, node):
    """What a dead machine looks like to Slurm: its slurmd and its job steps vanish at once."""
    pids = processes.find_pids("slurmd", str(paths.conf), node) + processes.job_processes(str(paths.conf), node)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def restart_slurmd(cluster, paths, node, wipe=False):
    """The machine part of a local node's reboot: its slurmd and job steps die and a new slurmd starts.
    With `wipe`, the node's folder goes too: the local stand-in for a fresh image."""
    kill_node(paths, node)
    processes.wait_for(lambda: not processes.find_pids("slurmd", str(paths.conf), node), timeout=10)
    if wipe:
        shutil.rmtree(paths.spool / node, ignore_errors=True)
    daemons.start_slurmd(cluster, paths, node)


def clean_scratch(paths, node):
    shutil.rmtree(paths.spool / node / "scratch", ignore_errors=True)
