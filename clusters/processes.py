"""Finding, starting and stopping the daemons a local cluster runs, by their command lines."""

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .work import heartbeat

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def program(name):
    path = shutil.which(name, path=SEARCH_PATH)
    if path is None:
        raise FileNotFoundError(f"{name} is not installed (apt-get install slurmctld slurmd slurm-client munge)")
    return path


def command_lines():
    """Yield (pid, argv) for every process we can read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield int(entry.name), raw.rstrip(b"\0").decode(errors="replace").split("\0")


def environ(pid):
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def job_processes(conf, node=None):
    """Pids of the job steps running under a cluster's slurm.conf (on `node`, if given): the tasks,
    found by SLURM_CONF and SLURMD_NODENAME in their environment, and their slurmstepd parents."""
    tasks = []
    for pid, _argv in command_lines():
        env = environ(pid)
        if env.get("SLURM_CONF") == conf and (node is None or env.get("SLURMD_NODENAME") == node):
            tasks.append(pid)
    parents = set()
    for pid in tasks:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            parent = int(stat.split(")")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        argv = Path(f"/proc/{parent}/cmdline").read_bytes() if Path(f"/proc/{parent}/cmdline").exists() else b""
        if argv.startswith(b"slurmstepd"):
            parents.add(parent)
    return sorted(set(tasks) | parents)


def find_pids(name, marker, node=None):
    """Pids of `name` processes whose argv holds `marker` (a conf path) and, if given, `-N node`."""
    pids = []
    for pid, argv in command_lines():
        if os.path.basename(argv[0]) != name or not any(marker in arg for arg in argv):
            continue
        if node is not None and not any(a == "-N" and b == node for a, b in itertools.pairwise(argv)):
            continue
        pids.append(pid)
    return sorted(pids)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it has exited all the same.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop(pids, timeout=15.0):
    """SIGTERM, then SIGKILL what is still there after `timeout` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_daemon(argv, env=None, timeout=60, cwd="/"):
    """Run a daemon that forks into the background; it gets its own session so it outlives the worker,
    and its own working directory (by default /), never the worker's checkout."""
    result = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    return result


def wait_for(predicate, timeout, interval=0.1, waiting_for=""):
    """Poll `predicate` until it is true or `timeout` seconds pass; returns its last value. Each poll is
    a heartbeat of the step this runs in (see clusters.work)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        heartbeat(waiting_for)
        time.sleep(interval)
