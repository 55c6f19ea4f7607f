"""Health scans: one Slurm job per partition runs the agent on every node in parallel; the console
collects each node's JSON, compares speeds with the fleet median and records every result.

A scan is an Operation of kind SCAN, worked by the same task as create/update/delete, so it gets the
same claim, heartbeat, progress bar and resume-after-crash. The scan job's id is kept in the
operation's params, so a rerun waits for the job it already submitted instead of submitting another.
"""

import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction

from ..backends import PermanentBackendError, TransientBackendError, get_backend
from ..backends.base import Step
from ..choices import NodeRole, OperationKind, OperationStatus
from ..models import HealthResult, Operation
from . import FAIL, PASS, WARN, load_checks, thresholds
from .checks.correctness import checksum
from .faults import faults_dir

SCAN_TIMEOUT = 1800


class ScanError(Exception):
    """A scan request that cannot be accepted; `errors` maps fields to reasons."""

    def __init__(self, errors):
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in errors.items()))
        self.errors = errors


def start_scan(*, cluster, checks=None, user=None):
    from ..services import Conflict, start_operation

    known = load_checks()
    checks = list(checks) if checks else list(known)
    unknown = [c for c in checks if c not in known]
    if unknown:
        raise ScanError({"checks": [f"unknown check {c!r}; choose from: {', '.join(known)}" for c in unknown]})
    if not cluster.is_usable:
        raise Conflict(
            f"Cluster '{cluster.name}' is {cluster.get_status_display().lower()}; scans run on a ready cluster"
        )
    if cluster.operations.filter(status__in=OperationStatus.active()).exists():
        raise Conflict(f"Cluster '{cluster.name}' has an operation in progress; scan when it ends")
    with transaction.atomic():
        return start_operation(
            cluster,
            OperationKind.SCAN,
            user,
            f"Health scan requested by {user or 'system'}: {', '.join(checks)}",
            params={"checks": checks},
        )


def scan_dir(operation):
    cluster = operation.cluster
    return Path(get_backend(cluster.backend).shared_dir(cluster)) / "scans" / str(operation.uuid)


def partitions(cluster):
    """{partition: [compute node names]} for every partition with nodes."""
    found = {}
    for partition in cluster.partitions.prefetch_related("node_pools__nodes"):
        nodes = [
            n.name
            for pool in partition.node_pools.all()
            if pool.role == NodeRole.COMPUTE
            for n in pool.nodes.all()
            if n.state in ("READY", "PROVISIONING", "PENDING")
        ]
        if nodes:
            found[partition.name] = sorted(nodes)
    return found


def scan_steps(operation):
    return [
        Step("Write the scan job", lambda: write_job(operation)),
        Step("Submit the scan job", lambda: submit(operation)),
        Step("Wait for every node's results", lambda: wait(operation)),
        Step("Compare nodes and record results", lambda: evaluate(operation)),
    ]


def summary(operation):
    results = list(operation.health_results.all())
    failing = sorted({f"{r.node} {r.check_name}" for r in results if r.status == FAIL})
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "warn", "fail", "skipped")}
    text = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return f"Health scan done: {text}" + (f"; failing: {', '.join(failing)}" if failing else ""), bool(failing)


def write_job(operation):
    cluster = operation.cluster
    folder = scan_dir(operation)
    folder.mkdir(parents=True, exist_ok=True)
    pool = cluster.node_pools.filter(role=NodeRole.COMPUTE).first()
    limits = thresholds()["correctness"]
    context = {
        "checks": operation.params["checks"],
        "paths": ["/tmp", str(folder.parent.parent)],
        "faults_dir": str(faults_dir(cluster)),
        "gpus_per_node": 0 if cluster.backend == "local" else (pool.accelerator_count if pool else 0),
        "accelerator_type": pool.accelerator_type if pool else "",
        "reference_checksum": checksum(limits["size"], limits["rounds"], limits["seed"]),
    }
    (folder / "context.json").write_text(json.dumps(context))
    for name, nodes in partitions(cluster).items():
        script = "\n".join(
            [
                "#!/bin/bash",
                f"#SBATCH --job-name=health-scan-{str(operation.uuid)[:8]}",
                f"#SBATCH --partition={name}",
                f"#SBATCH --nodes={len(nodes)}",
                "#SBATCH --ntasks-per-node=1",
                "#SBATCH --time=30",
                f"#SBATCH --output={folder}/slurm-{name}-%j.out",
                f"cd {shlex.quote(str(settings.BASE_DIR))}",
                # One BLAS thread per task: each node measures itself, not a fight over shared cores.
                "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1",
                f"srun {shlex.quote(sys.executable)} -m clusters.health.agent {folder}/context.json {folder}",
                "",
            ]
        )
        (folder / f"scan-{name}.sbatch").write_text(script)


def submit(operation):
    """Submit one job per partition, once: job ids are kept so a rerun does not submit again."""
    cluster = operation.cluster
    jobs = dict(operation.params.get("jobs", {}))
    backend = get_backend(cluster.backend)
    for name in partitions(cluster):
        if name not in jobs:
            jobs[name] = backend.submit_batch(cluster, scan_dir(operation) / f"scan-{name}.sbatch")
            operation.params = {**operation.params, "jobs": jobs}
            Operation.objects.filter(pk=operation.pk).update(params=operation.params)


def expected_nodes(operation):
    return sorted(n for nodes in partitions(operation.cluster).values() for n in nodes)


def wait(operation, timeout=SCAN_TIMEOUT):
    cluster = operation.cluster
    backend = get_backend(cluster.backend)
    folder = scan_dir(operation)
    wanted = expected_nodes(operation)
    deadline = time.monotonic() + timeout
    while True:
        done = [n for n in wanted if (folder / f"{n}.json").exists()]
        operation.report(progress=operation.progress, step=f"Wait for every node's results ({len(done)}/{len(wanted)})")
        if len(done) == len(wanted):
            return
        jobs = operation.params.get("jobs", {})
        states = {name: backend.job_status(cluster, job_id) for name, job_id in jobs.items()}
        ended = [
            s
            for s in states.values()
            if s is None or s.state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
        ]
        if ended and len(ended) == len(states):
            missing = sorted(set(wanted) - set(done))
            detail = ", ".join(f"{s.state} exit {s.exit_code}" for s in states.values() if s is not None)
            raise PermanentBackendError(
                f"the scan job ended without results from {', '.join(missing)} ({detail or 'gone'})"
            )
        if time.monotonic() > deadline:
            for job_id in jobs.values():
                backend.cancel_job(cluster, job_id)
            raise TransientBackendError(f"the scan job did not finish within {timeout} s; it was cancelled")
        time.sleep(0.5)


def evaluate(operation):
    """Record every node's results; a node well below the fleet's median speed is a straggler."""
    folder = scan_dir(operation)
    reports = {n: json.loads((folder / f"{n}.json").read_text())["results"] for n in expected_nodes(operation)}
    speeds = {n: r["speed"]["values"]["gflops"] for n, r in reports.items() if "speed" in r and r["speed"]["values"]}
    if speeds:
        median = statistics.median(speeds.values())
        fraction = thresholds()["speed"]["straggler_fraction"]
        for node, gflops in speeds.items():
            result = reports[node]["speed"]
            result["threshold"] = {"fleet_median_gflops": round(median, 3), "straggler_fraction": fraction}
            if gflops < fraction * median:
                result["status"] = FAIL if gflops < 0.5 * median else WARN
                result["reason"] = f"straggler: {gflops:.2f} GFLOP/s is {gflops / median:.0%} of the fleet median"
    sums = {n: r["correctness"]["values"].get("checksum") for n, r in reports.items() if "correctness" in r}
    if len(set(sums.values())) > 1:
        for node, value in sums.items():
            others = [n for n, v in sums.items() if v != value]
            if len(others) > len(sums) / 2 and reports[node]["correctness"]["status"] != FAIL:
                reports[node]["correctness"].update(status=FAIL, reason=f"differs from {', '.join(others)}")
    evaluate_links(reports)
    HealthResult.objects.filter(operation=operation).delete()  # a rerun of this step records once
    HealthResult.objects.bulk_create(
        HealthResult(
            operation=operation,
            cluster=operation.cluster,
            node=node,
            check_name=name,
            status=result["status"],
            values=result.get("values", {}),
            threshold=result.get("threshold", {}),
            reason=result.get("reason", "")[:500],
        )
        for node, results in reports.items()
        for name, result in results.items()
    )


def evaluate_links(reports):
    """Judge each node's links against a reference pair speed: slow to every peer means its own link."""
    measured = {
        n: r["interconnect"]["values"] for n, r in reports.items() if r.get("interconnect", {}).get("status") == PASS
    }
    pairs = {}
    for node, values in measured.items():
        for peer, gbps in values["pairs"].items():
            key = tuple(sorted((node, peer)))
            pairs[key] = min(gbps, pairs.get(key, gbps))
    if not pairs:
        return
    limits = thresholds()["interconnect"]
    # The reference is the median over nodes of each node's best pair: a bad node's pairs are many
    # (n-1 of them) but it is one node, so fewer than half the nodes bad still leave a true reference.
    best = [max((v for k, v in pairs.items() if node in k), default=0) for node in measured]
    median = statistics.median(best)
    floor = limits["min_busbw_gbps"].get(next(iter(measured.values()))["backend"], 0)
    # With three or more nodes a slow pair stands out; with two, only the floor can tell.
    relative = len(measured) >= 3
    slow = {k for k, v in pairs.items() if v < floor or (relative and v < limits["slow_link_fraction"] * median)}
    for node, values in measured.items():
        result = reports[node]["interconnect"]
        result["threshold"] = {
            "reference_gbps": round(median, 3),
            "slow_link_fraction": limits["slow_link_fraction"],
            "min_gbps": floor,
        }
        peers = sorted(values["pairs"])
        slow_peers = [p for p in peers if tuple(sorted((node, p))) in slow]
        if values["busbw_gbps"] < floor:
            result.update(status=WARN, reason=f"all-reduce bus bandwidth {values['busbw_gbps']} GB/s is below {floor}")
        if not slow_peers:
            continue
        shown = ", ".join(f"{p} {pairs[tuple(sorted((node, p)))]} GB/s" for p in slow_peers)
        if len(slow_peers) == len(peers) and len(peers) >= 2:
            result.update(status=FAIL, reason=f"slow to every peer ({shown}; reference {median:.3f} GB/s): its link")
        else:
            result.update(status=WARN, reason=f"slow link to {shown} (reference {median:.3f} GB/s)")


def latest_results(cluster):
    """(scan operation, {node: {check: result}}) of the last finished scan, or (None, {})."""
    scan = (
        cluster.operations.filter(kind=OperationKind.SCAN, status=OperationStatus.SUCCEEDED)
        .order_by("-created")
        .first()
    )
    if scan is None:
        return None, {}
    grid = {}
    for result in scan.health_results.all():
        grid.setdefault(result.node, {})[result.check_name] = result
    return scan, grid
