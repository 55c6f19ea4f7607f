"""Slurm client commands (sinfo, squeue, scontrol, sbatch) and parsers for their output, shared by the backends."""

import json
import subprocess
from pathlib import Path

from ..processes import program
from ..work import TransientBackendError
from .states import JobStatus, NodeStatus


def run_client(conf, *args, timeout=20, check=True, cwd=None, user=None):
    """Run a Slurm client command (sinfo, squeue, scontrol, sbatch) against the cluster's slurm.conf,
    as `user` when given (root hands the command over with runuser; Slurm then sees that user).

    It runs in `cwd` (default: the folder of slurm.conf), never in the worker's own directory: a job
    submitted without --output writes slurm-<id>.out where it was submitted from."""
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    command = [program(args[0]), *args[1:]]
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    try:
        result = subprocess.run(
            command,
            env=env,
            cwd=cwd or Path(conf).parent,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise TransientBackendError(f"{args[0]} did not answer within {timeout} s") from None
    if check and result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise TransientBackendError(f"{' '.join(args[:2])} failed: {message[-1] if message else result.returncode}")
    return result


def load(text, command):
    """The JSON a Slurm command printed; its "errors" (exit status 0 all the same) become an exception."""
    data = json.loads(text)
    errors = data.get("errors") or []
    if errors:
        first = errors[0]
        detail = first.get("description") or first.get("error") or "unknown error"
        raise TransientBackendError(f"{command} failed: {detail} ({first.get('error', '')})")
    return data


def parse_sinfo(text):
    return nodes_from(load(text, "sinfo"))


def nodes_from(data):
    """NodeStatus per node of a `sinfo --json` or slurmrestd /nodes answer (already checked for errors)."""
    return [
        NodeStatus(
            name=node["name"],
            state=str(node.get("state", "unknown")).lower(),
            flags=[str(f) for f in node.get("state_flags") or []],
            reason=node.get("reason") or "",
            partitions=node.get("partitions") or [],
            cpus=node.get("cpus") or 0,
            memory_mb=node.get("real_memory") or 0,
        )
        for node in data.get("nodes", [])
    ]


def _number(value):
    # Later Slurm releases wrap numbers as {"set": true, "number": N}.
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) else None
    return value


def parse_squeue(text):
    return jobs_from(load(text, "squeue"))


def jobs_from(data):
    """JobStatus per job of a `squeue --json` or slurmrestd /jobs answer (already checked for errors)."""
    jobs = []
    for job in data.get("jobs", []):
        state = job.get("job_state")
        jobs.append(
            JobStatus(
                job_id=int(job["job_id"]),
                name=job.get("name", ""),
                user=job.get("user_name", ""),
                state=state[0] if isinstance(state, list) else str(state),
                partition=job.get("partition", ""),
                nodes=job.get("nodes", ""),
                node_count=_number(job.get("node_count")) or 0,
                reason=job.get("state_reason", ""),
                exit_code=_number(job.get("exit_code")),
                submit_time=_number(job.get("submit_time")) or 0,
                start_time=_number(job.get("start_time")) or 0,
                end_time=_number(job.get("end_time")) or 0,
            )
        )
    return jobs


def scontrol_fields(conf, kind, name):
    """`scontrol show <kind> <name> -o` as a dict of its Key=Value fields ({} when Slurm knows none)."""
    result = run_client(conf, "scontrol", "show", kind, name, "-o", check=False)
    return dict(f.split("=", 1) for f in result.stdout.split() if "=" in f)


def hostnames(conf, nodelist):
    """The node names a Slurm node list (e.g. "cpu-[0-2]") stands for."""
    return run_client(conf, "scontrol", "show", "hostnames", nodelist).stdout.split()
