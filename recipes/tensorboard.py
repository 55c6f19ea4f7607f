"""A TensorBoard server per cluster, started on demand, bound to 127.0.0.1 and reached only through the
console's login (the view in recipes/views.py proxies to it, keeping the path prefix)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from clusters import processes, services


def prefix(cluster):
    return f"/clusters/{cluster.project.slug}/{cluster.name}/tensorboard"


def state_file(cluster):
    return Path(services.shared_dir(cluster)).parent / "tensorboard.json"


def running(cluster):
    """The port of this cluster's TensorBoard when it is up, else None."""
    path = state_file(cluster)
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    if not processes.alive(state["pid"]) or str(path) not in " ".join(_argv(state["pid"])):
        return None
    return state["port"]


def _argv(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure(cluster, timeout=30):
    """Start the cluster's TensorBoard unless it runs; return its port once it answers."""
    port = running(cluster)
    if port is not None:
        return port
    logdir = Path(services.shared_dir(cluster)) / "runs"
    logdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    path = state_file(cluster)
    log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - handed to the daemon
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(logdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--path_prefix",
            prefix(cluster),
            "--reload_interval",
            "5",
            # Marks the process as this cluster's, so running() never trusts a reused pid.
            "--window_title",
            str(path),
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    path.write_text(json.dumps({"pid": process.pid, "port": port}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return port
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    raise RuntimeError(f"TensorBoard did not start; see {path.with_suffix('.log')}")


def stop(cluster):
    port = running(cluster)
    if port is not None:
        processes.stop([json.loads(state_file(cluster).read_text())["pid"]])
