"""Repairs on a local cluster that are the machine's, not Slurm's: a reboot as a real slurmd restart,
a scratch wipe, and killing a node for fault drills. Drain, resume and holds are the base backend's
(through the cluster agent)."""

import contextlib
import os
import shutil
import signal

from django.conf import settings

from ... import processes
from ...agent.client import AgentRefused
from .. import slurm_waits
from . import daemons


def kill_node(paths, node):
    """What a dead machine looks like to Slurm: its slurmd and its job steps vanish at once."""
    pids = processes.find_pids("slurmd", str(paths.conf), node) + processes.job_processes(str(paths.conf), node)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def reboot(cluster, paths, node, slurm, agent, wipe=False):
    """Restart the node as a machine reboot would: Slurm is told first (state DOWN), so the jobs on
    it end (requeueable ones are requeued) instead of waiting on steps that vanished; then its
    slurmd and job steps die, a new slurmd starts, and we wait until that slurmd has registered.
    With `wipe`, the node's folder goes too: the local stand-in for a fresh image."""
    before = slurm_waits.slurmd_start_time(slurm, node)
    with contextlib.suppress(AgentRefused):  # a node Slurm cannot mark down is rebooted all the same
        agent.slurm("down", node=node, reason="tcc reboot")
    kill_node(paths, node)
    processes.wait_for(lambda: not processes.find_pids("slurmd", str(paths.conf), node), timeout=10)
    if wipe:
        shutil.rmtree(paths.spool / node, ignore_errors=True)
    daemons.start_slurmd(cluster, paths, node)
    slurm_waits.wait_registered(slurm, node, before, settings.LOCAL_NODE_IDLE_TIMEOUT)


def clean_scratch(paths, node):
    shutil.rmtree(paths.spool / node / "scratch", ignore_errors=True)
