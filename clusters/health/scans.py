"""Health scans: one Slurm job per partition runs the agent on every node in parallel; the console
collects each node's JSON, compares speeds with the fleet median and records every result.

A scan is an Operation of kind SCAN (registered in kinds.py), worked by the same engine as create, update
and delete, so it gets the same claim, heartbeat, progress bar and resume-after-crash. The nodes it
picked and the scan jobs' ids are kept in the operation's checkpoint, so a rerun scans the same nodes
and waits for the jobs it already submitted instead of submitting others.
"""

import json
import shlex
import statistics
import time
from pathlib import Path

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from console.errors import FieldErrors

from .. import services
from ..choices import ClusterStatus, EventLevel, NodeRole, NodeState, OperationKind, OperationStatus
from ..events import record_event
from ..models import HealthResult
from ..operations import start
from ..slurm import batch
from ..slurm.hooks import GPU_CHECK
from ..slurm.states import NODE_UP, is_down, is_drained, is_schedulable, split_state
from ..spec.catalog import accelerator_info, machine_fabric, machine_type_info
from ..work import PermanentBackendError, Step, TransientBackendError, heartbeat
from . import FAIL, PASS, WARN, epilog, load_checks, threshold_errors, thresholds, unknown_checks
from .checks.correctness import checksum
from .faults import FOLDER as FAULTS
from .policy import actions

SCAN_TIMEOUT = 1800
SYSTEM = "system"
# Once every result is in, how long a scan job may take to end by itself before it is cancelled.
SETTLE_SECONDS = 15
# How long a scan waits for nodes that are up but flagged NOT_RESPONDING before leaving them out.
NOT_RESPONDING_GRACE = 20


def start_scan(*, cluster, checks=None, user=None, thresholds=None, idle_only=False, reason=""):
    """Validate a scan request and start its operation; FieldErrors (a 400) names every bad field, and
    Conflict (a 409) says another operation is running."""
    checks = list(checks) if checks else list(load_checks())
    errors = {}
    if unknown_checks(checks):
        errors["checks"] = unknown_checks(checks)
    errors.update(threshold_errors(thresholds or {}))
    if not scannable(cluster):
        errors["cluster"] = [
            f"'{cluster.name}' is {cluster.get_status_display().lower()}; scans run on a ready, degraded "
            "or verifying cluster"
        ]
    if errors:
        raise FieldErrors(errors)
    return start(
        cluster,
        OperationKind.SCAN,
        user=user,
        message=f"Health scan {reason or f'requested by {user or SYSTEM}'}: {', '.join(checks)}",
        params={"checks": checks, "thresholds": thresholds or {}, "idle_only": idle_only},
    )


def scannable(cluster):
    return cluster.status in ClusterStatus.watched()


def scan_dir(ctx):
    """The scan's folder as the cluster's nodes see it (for the job script)."""
    return Path(ctx.backend.shared_dir(ctx.cluster)) / "scans" / str(ctx.operation.uuid)


def in_scan(ctx, name=""):
    """A path in the scan's folder relative to the cluster's home, for the cluster agent: the console
    writes the scan's files and reads its results only through the agent."""
    return f"scans/{ctx.operation.uuid}" + (f"/{name}" if name else "")


def targets(cluster, idle_only=False, held=()):
    """({partition: [node names]}, {node: why skipped}): the compute nodes Slurm can run a scan on now.

    Drained or down nodes are skipped (a scan job asking for them would wait forever), and so are nodes
    in a hold other than the scan's own (`held`); with `idle_only` (periodic scans) so are nodes running
    jobs. A node in two partitions is scanned in the first.
    """
    services.sync_cluster(cluster, hooks=False)
    found, skipped, seen = {}, {}, set()
    for partition in cluster.partitions.prefetch_related("node_pools__nodes"):
        for pool in partition.node_pools.all():
            if pool.role != NodeRole.COMPUTE:
                continue
            for node in pool.nodes.all():
                if node.state not in (NodeState.READY, NodeState.PROVISIONING) or node.name in seen:
                    continue
                seen.add(node.name)
                why = unschedulable(node, idle_only, held)
                if why:
                    skipped[node.name] = why
                else:
                    found.setdefault(partition.name, []).append(node.name)
    return {name: sorted(nodes) for name, nodes in found.items()}, skipped


def settled_targets(cluster, idle_only=False, held=(), grace=NOT_RESPONDING_GRACE):
    """targets(), after giving nodes that are up but only flagged NOT_RESPONDING a moment: the flag
    is often a missed ping (a just-restarted slurmd gets it for about a second) that the next clears."""
    deadline = time.monotonic() + grace
    while True:
        nodes, skipped = targets(cluster, idle_only, held)
        flagged = [why for why in skipped.values() if split_state(why.split(" ")[0])[0] in NODE_UP]
        if not flagged or time.monotonic() >= deadline:
            return nodes, skipped
        heartbeat(f"waiting for {len(flagged)} flagged node(s) to answer")
        time.sleep(1)


def unschedulable(node, idle_only, held=()):
    """Why a scan job cannot use this node now, or ""."""
    base, flags = split_state(node.slurm_state)
    if not is_schedulable(node.slurm_state):
        return (node.slurm_state or "not seen by Slurm") + (f" ({node.slurm_reason})" if node.slurm_reason else "")
    if "reserved" in flags and node.name not in held:
        return f"{node.slurm_state}: held for another operation's scan"
    if idle_only and base != "idle":
        return f"{base}: running jobs"
    return ""


def scan_steps(prefix=""):
    return [
        Step(f"{prefix}Write the scan job", write_job),
        Step(f"{prefix}Submit the scan job", submit),
        Step(f"{prefix}Wait for every node's results", wait),
        Step(f"{prefix}Compare nodes and record results", evaluate),
    ]


def summary(operation):
    results = list(operation.health_results.all())
    failing = sorted({f"{r.node} {r.check_name}" for r in results if r.status == FAIL})
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "warn", "fail", "skipped")}
    text = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    skipped = operation.checkpoint.get("skipped_nodes") or {}
    if skipped:
        text += f"; not scanned: {', '.join(f'{n} ({why})' for n, why in sorted(skipped.items()))}"
    return f"Health scan done: {text}" + (f"; failing: {', '.join(failing)}" if failing else ""), bool(failing)


def limits_for(operation):
    return thresholds({"backend": operation.cluster.backend, "thresholds": operation.params.get("thresholds")})


def checks_of(operation):
    """The checks a scan runs: those its request names, else every check."""
    return operation.params.get("checks") or list(load_checks())


def write_job(ctx):
    """Pick the nodes (kept in the checkpoint, so a rerun scans the same ones) and write one job per partition."""
    cluster, checkpoint = ctx.cluster, ctx.checkpoint
    folder = scan_dir(ctx)
    agent = ctx.backend.agent(cluster)
    if "nodes" not in checkpoint:
        held = checkpoint.get("held", [])
        nodes, skipped = settled_targets(cluster, idle_only=ctx.params.get("idle_only", False), held=held)
        if held and ctx.operation.kind != OperationKind.REPAIR:
            # A create's or resize's first scan is of the nodes it started; a repair's verification
            # scans its held node among the others (speed and links are judged against peers).
            nodes = {p: [n for n in names if n in held] for p, names in nodes.items()}
            nodes = {p: names for p, names in nodes.items() if names}
            skipped = {n: why for n, why in skipped.items() if n in held}
        checkpoint.set("skipped_nodes", skipped)
        checkpoint.set("nodes", nodes)
    if not checkpoint["nodes"]:
        skipped = checkpoint["skipped_nodes"]
        raise PermanentBackendError(
            "no node can be scanned now: " + (", ".join(f"{n} {why}" for n, why in skipped.items()) or "no nodes")
        )
    pool = cluster.node_pools.filter(role=NodeRole.COMPUTE).first()
    limits = limits_for(ctx.operation)["correctness"]
    context = {
        "backend": cluster.backend,
        "checks": checks_of(ctx.operation),
        "thresholds": ctx.params.get("thresholds") or {},
        "paths": ["/tmp", str(folder.parent.parent)],
        "faults_dir": f"{ctx.backend.shared_dir(cluster)}/{FAULTS}" if ctx.backend.injects_faults else "/nonexistent",
        "gpus_per_node": ctx.backend.node_shape(cluster, pool).gpus if pool else 0,
        "accelerator_type": pool.accelerator_type if pool else "",
        "accelerator": accelerator_info(pool.accelerator_type) if pool else None,  # expected figures
        "reference_checksum": checksum(limits["size"], limits["rounds"], limits["seed"]),
    }
    agent.write(in_scan(ctx, "context.json"), json.dumps(context).encode())  # makes the folder too
    runtime = services.runtime.install(ctx.backend, cluster)  # the health agent's code, in the shared home
    write_gpu_check(ctx, runtime, context)
    hold = checkpoint.get("hold")
    for name, nodes in checkpoint["nodes"].items():
        script = batch.render(
            {
                "job-name": f"health-scan-{str(ctx.operation.uuid)[:8]}",
                "partition": name,
                "nodelist": ",".join(nodes),
                "nodes": len(nodes),
                "ntasks-per-node": 1,
                "time": 30,
                # A scan is judged on the nodes it was given; it is never rerun behind the console's back.
                "no-requeue": True,
                # On GPU nodes a scan takes the whole node: DCGM's diagnostic and the GPU checks must
                # never share a GPU with a user's job (nor measure one that is busy).
                "exclusive": True if context["gpus_per_node"] else None,
                "reservation": hold or None,
                "output": f"{folder}/slurm-{name}-%j.out",
            },
            # One BLAS thread per task: each node measures itself, not a fight over shared cores.
            environment={"OMP_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1, "MKL_NUM_THREADS": 1},
            folder=runtime.folder,
            # The interconnect check's collectives go over the GPU network, set up as for a user's run.
            body=[
                *batch.nccl_lines(machine_fabric(pool.machine_type) if pool and context["gpus_per_node"] else ""),
                f"srun {shlex.quote(runtime.python)} -m clusters.health.agent {folder}/context.json {folder}",
            ],
        )
        agent.write(in_scan(ctx, f"scan-{name}.sbatch"), script.encode())


def write_gpu_check(ctx, runtime, context):
    """The epilog's GPU check (clusters/slurm/hooks.py): its script and context in the shared home,
    refreshed by every scan, so it runs this console version's checks with the pools' GPU figures."""
    cluster, agent = ctx.cluster, ctx.backend.agent(ctx.cluster)
    pools = {
        pool.pool_id: {
            "gpus_per_node": ctx.backend.node_shape(cluster, pool).gpus,
            "accelerator_type": pool.accelerator_type,
        }
        for pool in cluster.node_pools.filter(role=NodeRole.COMPUTE)
    }
    shared = ctx.backend.shared_dir(cluster)
    # The default thresholds (not this scan's overrides): the epilog judges every job the same way.
    check = {"backend": context["backend"], "faults_dir": context["faults_dir"], "thresholds": {}, "pools": pools,
             "checks": list(epilog.CHECKS)}  # fmt: skip
    agent.write(f"{GPU_CHECK}.json", json.dumps(check).encode(), mode=0o644)
    script = (
        "#!/bin/bash\n# The console's fast GPU checks after a job (clusters/health/epilog.py), written by each scan.\n"
        f"cd {shlex.quote(runtime.folder)} && exec {shlex.quote(runtime.python)} -m clusters.health.epilog "
        f"{shlex.quote(f'{shared}/{GPU_CHECK}.json')}\n"
    )
    agent.write(GPU_CHECK, script.encode(), mode=0o644)


def submit(ctx):
    """Submit one job per partition, once: job ids are kept so a rerun does not submit again."""
    jobs = dict(ctx.checkpoint.get("jobs", {}))
    for name in ctx.checkpoint["nodes"]:
        if name not in jobs:
            jobs[name] = ctx.backend.submit_batch(ctx.cluster, in_scan(ctx, f"scan-{name}.sbatch"))
            ctx.checkpoint.set("jobs", jobs)


def expected_nodes(checkpoint):
    return sorted(n for nodes in checkpoint["nodes"].values() for n in nodes)


def wait(ctx, timeout=SCAN_TIMEOUT):
    cluster, backend = ctx.cluster, ctx.backend
    agent = backend.agent(cluster)
    wanted = expected_nodes(ctx.checkpoint)
    jobs = ctx.checkpoint.get("jobs", {})
    deadline, settle_by = time.monotonic() + timeout, None
    while True:
        # The jobs' states before the results: a job that wrote its results and ended between the two
        # reads must be seen with them (read the other way round, it once ended "without results").
        states = {name: backend.job_status(cluster, job_id) for name, job_id in jobs.items()}
        running = {name: s for name, s in states.items() if s is not None and s.is_active}
        written = set(agent.list(in_scan(ctx), "*.json"))
        done = [n for n in wanted if f"{n}.json" in written]
        ctx.heartbeat(f"{len(done)}/{len(wanted)}")
        if len(done) == len(wanted):
            # Every result is in; a job still tearing down must not hold its nodes for what follows
            # (a repair, a training job), so give it a moment and then cancel it.
            settle_by = settle_by or time.monotonic() + SETTLE_SECONDS
            if running and time.monotonic() < min(deadline, settle_by):
                time.sleep(0.5)
                continue
            for name in running:
                backend.cancel_job(cluster, jobs[name])
            return
        pending = [name for name, status in running.items() if status.state == "PENDING"]
        if pending and not done:
            lost = lost_nodes(backend, cluster, wanted)
            if lost:
                for job_id in jobs.values():
                    backend.cancel_job(cluster, job_id)
                raise PermanentBackendError(f"the scan could not start: {lost}")
        if not running:
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


def lost_nodes(backend, cluster, wanted):
    """Which of the scan's nodes Slurm took away after the scan picked them (drained or down, e.g. by
    its HealthCheckProgram), as a sentence; "" when none: a scan job waiting for them would wait for
    ever, so it fails at once and the drained node goes to its repair instead."""
    gone = [
        f"{status.name} is {status.display_state} ({status.reason or 'no reason'})"
        for status in backend.node_statuses(cluster)
        if status.name in wanted and (is_drained(status.display_state) or is_down(status.display_state))
    ]
    return "; ".join(gone)


def evaluate(ctx):
    """Record every node's results; a node well below the fleet's median speed is a straggler."""
    operation = ctx.operation
    agent = ctx.backend.agent(ctx.cluster)
    reports = {n: json.loads(agent.read(in_scan(ctx, f"{n}.json")))["results"] for n in expected_nodes(ctx.checkpoint)}
    speeds = {n: r["speed"]["values"]["gflops"] for n, r in reports.items() if "speed" in r and r["speed"]["values"]}
    if speeds:
        median = statistics.median(speeds.values())
        limits = limits_for(operation)["speed"]
        fraction, failing = limits["straggler_fraction"], limits["straggler_fail_fraction"]
        for node, gflops in speeds.items():
            result = reports[node]["speed"]
            result["threshold"] = {
                "fleet_median_gflops": round(median, 3),
                "straggler_fraction": fraction,
                "straggler_fail_fraction": failing,
            }
            if gflops < fraction * median:
                result["status"] = FAIL if gflops < failing * median else WARN
                result["reason"] = f"straggler: {gflops:.2f} GFLOP/s is {gflops / median:.0%} of the fleet median"
    sums = {n: r["correctness"]["values"].get("checksum") for n, r in reports.items() if "correctness" in r}
    if len(set(sums.values())) > 1:
        for node, value in sums.items():
            others = [n for n, v in sums.items() if v != value]
            if len(others) > len(sums) / 2 and reports[node]["correctness"]["status"] != FAIL:
                reports[node]["correctness"].update(status=FAIL, reason=f"differs from {', '.join(others)}")
    pool = ctx.cluster.node_pools.filter(role=NodeRole.COMPUTE).first()
    machine = machine_type_info(pool.machine_type) if pool else None
    evaluate_links(reports, limits_for(operation)["interconnect"], machine.gpu_nic_gbps if machine else 0)
    record(operation, reports)


def record(operation, reports):
    """Write the scan's results as the newest of their node and check (a rerun of this step records once)."""
    cluster = operation.cluster
    with transaction.atomic():
        HealthResult.objects.filter(operation=operation).delete()
        # One update per set of checks reported (usually one set for every node), not one per node.
        by_checks = {}
        for node, results in reports.items():
            by_checks.setdefault(frozenset(results), []).append(node)
        for checks, nodes in by_checks.items():
            HealthResult.objects.filter(cluster=cluster, node__in=nodes, check_name__in=checks, latest=True).update(
                latest=False
            )
        HealthResult.objects.bulk_create(
            HealthResult(
                operation=operation,
                cluster=cluster,
                node=node,
                check_name=name,
                status=result["status"],
                values=result.get("values", {}),
                threshold=result.get("threshold", {}),
                reason=result.get("reason", "")[:500],
                repair=result.get("repair") if result.get("repair") in actions() else "",
                latest=True,
            )
            for node, results in reports.items()
            for name, result in results.items()
        )


def evaluate_links(reports, limits, nic_gbps=0):
    """Judge each node's links against a reference pair speed: slow to every peer means its own link. With
    `nic_gbps` (the line rate of one GPU's NIC on the machine type, machine_types.json), an NCCL pair under
    `min_fabric_fraction` of it is slow even when every pair is: traffic off the GPU NICs (NCCL fell back to
    sockets over the system NIC) or links trained down."""
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
    # The reference is the median over nodes of each node's best pair: a bad node's pairs are many
    # (n-1 of them) but it is one node, so fewer than half the nodes bad still leave a true reference.
    best = [max((v for k, v in pairs.items() if node in k), default=0) for node in measured]
    median = statistics.median(best)
    backend = next(iter(measured.values()))["backend"]
    floor = limits["min_busbw_gbps"].get(backend, 0)
    fabric = round(limits["min_fabric_fraction"] * nic_gbps / 8, 1) if backend == "nccl" and nic_gbps else 0
    floor = max(floor, fabric)
    # With three or more nodes a slow pair stands out; with two, only the floor can tell.
    relative = len(measured) >= 3
    slow = {k for k, v in pairs.items() if v < floor or (relative and v < limits["slow_link_fraction"] * median)}
    # Under the GPU NIC's floor, the reason says so: a reference of equally slow pairs explains nothing.
    line = f", under {floor} GB/s: {limits['min_fabric_fraction']:.0%} of a {nic_gbps} Gbps GPU NIC" if fabric else ""
    # Every pair under it: NCCL's network setup or the fabric, not one node's link (no node to reboot).
    everywhere = bool(fabric) and len(pairs) >= 2 and all(v < fabric for v in pairs.values())
    for node, values in measured.items():
        result = reports[node]["interconnect"]
        result["threshold"] = {
            "reference_gbps": round(median, 3),
            "slow_link_fraction": limits["slow_link_fraction"],
            "min_gbps": floor,
            **({"nic_gbps": nic_gbps, "min_fabric_fraction": limits["min_fabric_fraction"]} if fabric else {}),
        }
        peers = sorted(values["pairs"])
        slow_peers = [p for p in peers if tuple(sorted((node, p))) in slow]
        reasons = []
        if slow_peers:
            shown = ", ".join(f"{p} {pairs[tuple(sorted((node, p)))]} GB/s" for p in slow_peers)
            if everywhere:
                result["status"] = WARN
                reasons.append(f"every pair is slow ({shown}{line}): NCCL's network or the fabric, not one node")
            elif len(slow_peers) == len(peers) and len(peers) >= 2:
                result["status"] = FAIL
                reasons.append(f"slow to every peer ({shown}; reference {median:.3f} GB/s{line}): its link")
            else:
                result["status"] = WARN
                reasons.append(f"slow link to {shown} (reference {median:.3f} GB/s{line})")
        if values["busbw_gbps"] < floor:
            # One slow link slows everyone's all-reduce: said after the pairs, which name the culprit.
            result["status"] = result["status"] if result["status"] == FAIL else WARN
            reasons.append(f"all-reduce bus bandwidth {values['busbw_gbps']} GB/s is below {floor}")
        if reasons:
            result["reason"] = "; ".join(reasons)


def scans_of(cluster):
    """Operations that scanned: scans, creates ending with their first scan, repairs that verified."""
    # EXISTS, not a join with DISTINCT: the join grew with every result ever kept (a year of daily
    # scans made the health fragment 7x slower, benchmarks/history_growth.py).
    scanned = HealthResult.objects.filter(operation=OuterRef("pk"))
    return cluster.operations.filter(Q(kind=OperationKind.SCAN) | Q(Exists(scanned))).order_by("-created")


def latest_per_check(cluster):
    """{node: {check: HealthResult}}: the newest result of every check on every node of the cluster."""
    return by_node(HealthResult.objects.filter(cluster=cluster, latest=True).select_related("operation"))


def by_node(results):
    """{node: {check: result}} of a set of results (one per node and check)."""
    grid = {}
    for result in results:
        grid.setdefault(result.node, {})[result.check_name] = result
    return grid


def grid_rows(grid, failing_only=False):
    """(checks, [(node, [result or None per check])]) for the node x check table, nodes in order;
    `failing_only` keeps the nodes with a failing or warning result."""
    checks = sorted({c for row in grid.values() for c in row})
    rows = [
        (node, [row.get(c) for c in checks])
        for node, row in sorted(grid.items())
        if not failing_only or any(r.status in (FAIL, WARN) for r in row.values())
    ]
    return checks, rows


def repairs_of(cluster, node=None):
    """The cluster's REPAIR operations, newest first; only `node`'s when given."""
    repairs = cluster.operations.filter(kind=OperationKind.REPAIR)
    return repairs.filter(params__node=node) if node else repairs


def latest_results(cluster):
    """(last finished scan, {node: {check: newest result}}) for the cluster's current nodes."""
    scan = scans_of(cluster).filter(status=OperationStatus.SUCCEEDED).first()
    if scan is None:
        return None, {}
    current = set(cluster.wanted_nodes().values_list("name", flat=True))
    return scan, {node: row for node, row in latest_per_check(cluster).items() if node in current}


def announce(ctx):
    """A finished scan's summary on the timeline."""
    message, failing = summary(ctx.operation)
    record_event(
        ctx.cluster, message, level=EventLevel.WARNING if failing else EventLevel.INFO, operation=ctx.operation
    )
