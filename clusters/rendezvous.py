"""Where the ranks of a Slurm job meet for torch.distributed, without Django (job steps import it).

Ranks come from torchrun's variables or, under plain srun, from Slurm's (SLURM_PROCID, SLURM_NTASKS);
the rendezvous host is the first node of SLURM_JOB_NODELIST (its NodeAddr, so the local backend's
nodes, which all live on 127.0.0.1, work too). The port is derived from the cluster and job, below
the local backend's daemon ports (LOCAL_PORT_RANGE, 20000+) and Linux's ephemeral ports (32768+), so
two jobs, or two local clusters on one machine, do not take the same port.
"""

import os
import socket
import subprocess
import zlib

PORT_BASE, PORT_SPAN = 10000, 10000


def dist_env():
    """(rank, world size, local rank), from torchrun or from Slurm; sets MASTER_ADDR/PORT under Slurm."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in os.environ:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        os.environ.setdefault("MASTER_ADDR", first_host())
        os.environ.setdefault("MASTER_PORT", str(job_port()))
        return rank, world, int(os.environ.get("SLURM_LOCALID", 0))
    return 0, 1, 0


def job_port():
    key = f"{os.environ.get('SLURM_CLUSTER_NAME', '')}/{os.environ.get('SLURM_JOB_ID', '0')}"
    return PORT_BASE + zlib.crc32(key.encode()) % PORT_SPAN


def first_host():
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return "127.0.0.1"
    try:
        first = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10
        ).stdout.split()[0]
        address = subprocess.run(["scontrol", "show", "node", first], capture_output=True, text=True, timeout=10).stdout
        for field in address.split():
            if field.startswith("NodeAddr="):
                return field.split("=", 1)[1]
        return socket.gethostbyname(first)
    except (OSError, IndexError, subprocess.SubprocessError):
        return "127.0.0.1"


def leave():
    """End a rank of a multi-rank job without the interpreter's teardown. After destroy_process_group,
    tearing down torch's distributed state (gloo's threads) still aborted a rank now and then
    ("terminate called without an active exception", SIGABRT, no Python frame): 3 runs in 20 of the 2 x 2
    mesh as srun starts it (benchmarks/training_exits.py), each failing its Slurm job after every step
    had trained and the model was written. Call it once everything the rank writes is closed: it
    flushes the standard streams and exits with 0."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
