"""slurmrestd's node and job answers (the same shapes as `sinfo --json` and `squeue --json`) as
NodeStatus and JobStatus."""

from .states import JobStatus, NodeStatus


def nodes_from(data):
    """NodeStatus per node of a slurmrestd /nodes answer (already checked for errors)."""
    return [
        NodeStatus(
            name=node["name"],
            state=str(node.get("state", "unknown")).lower(),
            flags=[str(f) for f in node.get("state_flags") or []],
            reason=node.get("reason") or "",
            partitions=node.get("partitions") or [],
            cpus=node.get("cpus") or 0,
            memory_mb=node.get("real_memory") or 0,
            slurmd_start_time=_number(node.get("slurmd_start_time")) or 0,
            address=node.get("address") or "",
        )
        for node in data.get("nodes", [])
    ]


def _number(value):
    # Later Slurm releases wrap numbers as {"set": true, "number": N}.
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) else None
    return value


def jobs_from(data):
    """JobStatus per job of a slurmrestd /jobs answer (already checked for errors)."""
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
