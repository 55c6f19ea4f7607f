"""A local cluster's daemons: its munged, slurmctld, one slurmd per node, slurmrestd and the agent.

Processes are found by their command line (the conf path and `-N <node>`), so a rerun of any step
never starts a second daemon. Every wait is a heartbeat of the step it runs in. What these steps ask
Slurm goes through the cluster's slurmrestd (`slurm`) and agent (`agent`), as the console's own
calls do: no Slurm client program runs here.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from ... import processes
from ...agent import server
from ...work import BackendError, TransientBackendError
from ..base import Backend
from . import conf
from .paths import SLURMRESTD_USER
from .ports import port_answers


def socket_answers(path):
    """Something accepts connections on the Unix socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def start_munged(paths):
    if processes.find_pids("munged", str(paths.munge_socket)):
        return
    result = processes.start_daemon(
        [
            processes.program("munged"),
            "--force",
            f"--socket={paths.munge_socket}",
            f"--key-file={paths.munge_key}",
            f"--pid-file={paths.munge_dir / 'munged.pid'}",
            f"--log-file={paths.logs / 'munged.log'}",
            f"--seed-file={paths.munge_dir / 'munged.seed'}",
        ],
        cwd=paths.root,
    )
    if not processes.wait_for(paths.munge_socket.exists, timeout=10, waiting_for="munged"):
        raise TransientBackendError(f"munged did not start: {result.stderr.strip() or 'no socket after 10 s'}")


def start_slurmctld(cluster, paths, slurm):
    """Start slurmctld, or restart it if it runs with an older node list (Slurm 22.05 needs that);
    it is up when slurmrestd's ping says so."""
    digest = conf.digest(paths)
    running = processes.find_pids("slurmctld", str(paths.conf))
    if running and cluster.backend_state.get("slurmctld_conf") == digest:
        return
    if running:
        processes.stop(running)
    result = processes.start_daemon([processes.program("slurmctld"), "-f", str(paths.conf)], cwd=paths.root)
    if result.returncode != 0:
        raise TransientBackendError(f"slurmctld failed to start: {result.stderr.strip()}")
    if not processes.wait_for(slurm.ping, timeout=30, interval=0.2, waiting_for="slurmctld"):
        raise TransientBackendError(f"slurmctld is not answering; see {paths.logs / 'slurmctld.log'}")
    Backend.save_state(cluster, slurmctld_conf=digest)


def start_slurmd(cluster, paths, node):
    if processes.find_pids("slurmd", str(paths.conf), node):
        return
    if settings.LOCAL_NODE_START_DELAY:
        time.sleep(settings.LOCAL_NODE_START_DELAY)
    (paths.spool / node).mkdir(parents=True, exist_ok=True)
    result = processes.start_daemon([processes.program("slurmd"), "-f", str(paths.conf), "-N", node], cwd=paths.root)
    if result.returncode != 0:
        raise TransientBackendError(f"slurmd {node} failed to start: {result.stderr.strip()}")
    started = cluster.backend_state.get("slurmd_conf", {})
    Backend.save_state(cluster, slurmd_conf={**started, node: conf.digest(paths)})


def stop_slurmd(paths, node):
    processes.stop(processes.find_pids("slurmd", str(paths.conf), node))


def cancel_jobs(slurm):
    """Cancel every job of the cluster while slurmctld still runs (a job's processes outlive a slurmd
    stopped under them); nothing to do when slurmrestd or the controller is already gone."""
    try:
        rest = slurm()
        for job in rest.jobs():
            if job.is_active:
                rest.cancel(job.job_id)
    except BackendError:
        return


def leftovers(paths):
    """Pids of whatever still runs for the cluster: anything naming its folder on its command line
    (TensorBoard's --logdir, a daemon) or running with its slurm.conf (a job step, a login shell)."""
    root = str(paths.root)
    named = {pid for pid, argv in processes.command_lines() if any(root in arg for arg in argv)}
    conf = str(paths.conf)
    envs = {pid for pid, _argv in processes.command_lines() if processes.environ(pid).get("SLURM_CONF") == conf}
    return sorted((named | envs) - {os.getpid()})


def agent_processes(paths):
    """{pid: argv} of the cluster's agent processes."""
    return {
        pid: argv
        for pid, argv in processes.command_lines()
        if any(arg.endswith("agent/server.py") for arg in argv) and str(paths.jobs) in argv
    }


def start_agent(cluster, paths):
    """The cluster agent (clusters/agent/server.py) on 127.0.0.1, serving the cluster's home; as on a
    VM's controller, it runs as root beside slurmctld. One started with other arguments is replaced."""

    ports = cluster.backend_state["ports"]
    port = ports["agent"]
    argv = [sys.executable, server.__file__, "--home", str(paths.jobs), "--key-file", str(paths.agent_key),
            "--listen", f"127.0.0.1:{port}", "--tensorboard-python", sys.executable,
            "--slurm-conf", str(paths.conf), "--account-prefix", settings.POSIX_ACCOUNT_PREFIX,
            "--tls-bundle", str(paths.tls_bundle), "--tensorboard-socket-dir", str(paths.tensorboard),
            "--slurmrestd-relay", f"127.0.0.1:{ports['slurmrestd']}={paths.slurmrestd_socket}"]  # fmt: skip
    running = agent_processes(paths)
    if running and all(line == argv for line in running.values()):
        return
    replace_server("the cluster agent", sorted(running), port, argv, paths, "agent.log", env={"PATH": "/usr/bin:/bin"})


def replace_server(what, running, port, argv, paths, log_name, env):
    """Stop `running`, wait until the port is let go (or "answers" below would be the old one's last
    words), start `argv` in its own session and wait until it accepts connections on the port (a TCP
    port, or the path of a Unix socket)."""
    answers = socket_answers if isinstance(port, Path) else port_answers
    processes.stop(running)
    processes.wait_for(lambda: not answers(port), timeout=15, waiting_for=f"the old {what} to stop")
    with open(paths.logs / log_name, "ab") as log:
        # setsid -f: the server runs in the foreground; the extra fork leaves no zombie in the worker.
        subprocess.Popen(
            ["setsid", "-f", *argv], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=paths.root,
        )  # fmt: skip
    if not processes.wait_for(lambda: answers(port), timeout=15, waiting_for=what):
        raise TransientBackendError(f"{what} did not start; see {paths.logs / log_name}")


def stop_all(paths, slurm):
    """The delete steps' work, in order: the jobs, the agent, slurmrestd, every slurmd, slurmctld,
    munged, then anything of the cluster still running (job steps, TensorBoard)."""
    return [
        ("every job", lambda: cancel_jobs(slurm)),
        ("the cluster agent", lambda: processes.stop(sorted(agent_processes(paths)))),
        ("slurmrestd", lambda: processes.stop(processes.find_pids("slurmrestd", str(paths.conf)))),
        ("slurmd on every node", lambda: processes.stop(processes.find_pids("slurmd", str(paths.conf)))),
        ("slurmctld", lambda: processes.stop(processes.find_pids("slurmctld", str(paths.conf)))),
        ("munged", lambda: processes.stop(processes.find_pids("munged", str(paths.munge_socket)))),
        ("what is left (job steps, TensorBoard)", lambda: processes.stop(leftovers(paths))),
    ]


def reconfigure(cluster, paths, names, agent):
    """Make slurmds started with an older slurm.conf read the new one."""
    digest = conf.digest(paths)
    started = {n: d for n, d in cluster.backend_state.get("slurmd_conf", {}).items() if n in names}
    if all(value == digest for value in started.values()):
        return
    agent.slurm("reconfigure")
    Backend.save_state(cluster, slurmd_conf=dict.fromkeys(started, digest))


def start_slurmrestd(cluster, paths):
    """slurmrestd with JWT auth on a Unix socket in its own 0700 run/ folder: the console reaches it through the
    agent's TLS relay alone (it has no TLS of its own), and no member's process can take its place while it is
    down. It refuses to run as root; it runs as its own account (paths.SLURMRESTD_USER), which makes the socket.

    Only the slurm/v0.0.38 plugin is loaded: the slurmdb ones refuse to start without slurmdbd.
    """
    running = processes.find_pids("slurmrestd", str(paths.conf))
    socket_path = paths.slurmrestd_socket
    # One started before TLS listens on a TCP port, not the socket: replaced at the cluster's next apply.
    if running and cluster.backend_state.get("slurmrestd_conf") == conf.digest(paths) and socket_answers(socket_path):
        return
    argv = [processes.program("slurmrestd"), "-f", str(paths.conf), "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38",
            "-u", SLURMRESTD_USER, f"unix:{socket_path}"]  # fmt: skip
    env = {"SLURM_JWT": "daemon", "SLURM_CONF": str(paths.conf), "PATH": "/usr/bin:/bin"}
    processes.stop(running)
    socket_path.unlink(missing_ok=True)  # an old one's socket: slurmrestd would not bind over it
    replace_server("slurmrestd", [], socket_path, argv, paths, "slurmrestd.log", env)
    Backend.save_state(cluster, slurmrestd_conf=conf.digest(paths))
