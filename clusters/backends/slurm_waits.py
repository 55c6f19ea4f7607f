"""Waits every backend's steps share, asked of the cluster's Slurm through slurmrestd (a SlurmRest):
nodes up after a start or a resize, one node registered again after a reboot. Each wait is a heartbeat."""

import time

from .. import processes
from ..work import PermanentBackendError, TransientBackendError, heartbeat


def wait_idle(slurm, names, timeout, interval=0.2, failed=None, check_every=10.0):
    """Wait until every node in `names` is up in Slurm (registered, answering).

    `failed(waiting) -> {node: why}`, asked every `check_every` s about the nodes still waiting, says
    which of them will never come (their machine's startup failed): the wait ends at once with why."""

    def not_ready():
        statuses = {s.name: s for s in slurm.nodes()}
        return {
            name: statuses[name].display_state if name in statuses else "missing"
            for name in names
            if name not in statuses or not statuses[name].is_up
        }

    deadline = time.monotonic() + timeout
    checked = time.monotonic()
    waiting = not_ready()
    while waiting and time.monotonic() < deadline:
        heartbeat(f"{len(names) - len(waiting)}/{len(names)} nodes up")
        if failed and time.monotonic() - checked >= check_every:
            checked = time.monotonic()
            broken = failed(sorted(waiting))
            if broken:
                detail = "; ".join(f"{n}: {why}" for n, why in sorted(broken.items())[:5])
                more = f" (and {len(broken) - 5} more)" if len(broken) > 5 else ""
                raise PermanentBackendError(f"{len(broken)} node(s) failed to start: {detail}{more}")
        time.sleep(interval)
        waiting = not_ready()
    if waiting:
        detail = ", ".join(f"{n}: {s}" for n, s in sorted(waiting.items()))
        raise TransientBackendError(f"nodes did not become idle within {timeout:.0f} s ({detail})")


def wait_node_list(slurm, wanted, timeout, interval):
    """Wait until slurmctld answers (through slurmrestd) with exactly the `wanted` nodes: after a resize,
    a controller that reads its slurm.conf elsewhere restarts with the new one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            known = {status.name for status in slurm.nodes()}
            problem = "" if known == set(wanted) else f"Slurm knows {len(known)} nodes, {len(wanted)} wanted"
        except TransientBackendError as exc:
            problem = str(exc)
        if not problem:
            return
        if time.monotonic() > deadline:
            raise TransientBackendError(f"the controller's Slurm is not ready: {problem}")
        heartbeat(problem)
        time.sleep(interval)


def node_status(slurm, node):
    return next((status for status in slurm.nodes() if status.name == node), None)


def slurmd_start_time(slurm, node):
    """When the node's current slurmd registered (Unix time; 0 when it never has)."""
    status = node_status(slurm, node)
    return status.slurmd_start_time if status else 0


def wait_registered(slurm, node, before, timeout, steady=1.5):
    """Wait until a new slurmd (registered after `before`) has answered for `steady` seconds: just
    after registering, the controller may still flag the node NOT_RESPONDING for a moment (measured:
    set within 0.4 s of the restart, cleared by 0.9 s), and a job sent then would fail."""
    since = None

    def registered():
        nonlocal since
        status = node_status(slurm, node)
        if status is None or status.slurmd_start_time in (0, before) or "NOT_RESPONDING" in status.flags:
            since = None
            return False
        since = since or time.monotonic()
        return time.monotonic() - since >= steady

    if not processes.wait_for(registered, timeout=timeout, interval=0.3, waiting_for=f"{node} to register"):
        raise TransientBackendError(f"{node} did not register with slurmctld after its restart")
