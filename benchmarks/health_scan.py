"""Health figures on real local Slurm clusters: scan wall time for 2, 4 and 8 nodes (target: flat,
within 1.5x from 2 to 8), the interconnect check alone (all-reduce + pairwise rounds: n-1 rounds up to
16 nodes), create -> READY including the first scan, a resize whose new node is held until its own
first scan passes, and time to repair a killed node (-> idle again,
-> a requeued job running).

All nodes share this machine's cores, so per-node CPU work adds up as nodes are added: the speed
check's kernel competes with itself, and every node of an interconnect scan imports torch (about
2.6 s of CPU each here). On real clusters each node has its own cores; the scan itself (one Slurm
step across all nodes in parallel) is what should stay flat.
Usage: .venv/bin/python benchmarks/health_scan.py
"""

import json
import shutil
import time
from pathlib import Path

from _setup import ROOT, WORK, bench_project, scratch_django

scratch_django(AUTO_REPAIR="false")


from clusters import services  # noqa: E402
from clusters.backends import get_backend  # noqa: E402
from clusters.health import COLLECTIVE, load_checks, repair  # noqa: E402
from clusters.health.scans import start_scan  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from clusters.operations import engine  # noqa: E402
from clusters.slurm import batch  # noqa: E402


def make_cluster(project, user, nodes):
    spec = json.loads((ROOT / "examples" / "cluster-local-cpu.json").read_text())
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": nodes, "max_node_count": nodes}
    started = time.perf_counter()
    operation = services.create_cluster(project=project, name=f"h{nodes}", spec=spec, user=user)
    engine.run(operation.pk)
    cluster = Cluster.objects.get(pk=operation.cluster_id)
    assert cluster.status == "READY", cluster.status_message
    return cluster, time.perf_counter() - started


def timed_scan(cluster, checks):
    operation = start_scan(cluster=cluster, checks=checks)
    started = time.perf_counter()
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED", operation.error
    return time.perf_counter() - started


def main():
    user, project = bench_project()
    print(
        "nodes | scan, all checks (s) | per-node checks (s) | correctness+disk (s) | interconnect only (s)"
        " | create -> READY (s)"
    )
    try:
        for nodes in (2, 4, 8):
            cluster, ready = make_cluster(project, user, nodes)
            full = timed_scan(cluster, None)
            own = timed_scan(cluster, [c for c in load_checks() if c not in COLLECTIVE])
            light = timed_scan(cluster, ["correctness", "disk"])
            links = timed_scan(cluster, ["interconnect"])
            print(f"{nodes:>5} | {full:>20.2f} | {own:>19.2f} | {light:>20.2f} | {links:>21.2f} | {ready:>18.2f}")
            if nodes != 2:
                engine.run(services.delete_cluster(cluster=cluster, user=user).pk)
        cluster = Cluster.objects.get(name="h2")
        spec = json.loads(json.dumps(cluster.spec))
        spec["node_pools"][1]["scaling_spec"] = {"min_node_count": 3, "max_node_count": 3}
        started = time.perf_counter()
        engine.run(services.update_cluster(cluster=cluster, spec=spec, user=user).pk)
        grown = time.perf_counter() - started
        cluster.refresh_from_db()
        assert cluster.status == "READY", cluster.status_message
        print(f"resize 2 -> 3 nodes (new node held, scanned, then in service): {grown:6.1f} s")
        backend = get_backend("local")
        job = backend.submit_batch(cluster, write_job(cluster))
        while (status := backend.job_status(cluster, job)) is None or status.state != "RUNNING":
            time.sleep(0.2)
        killed = time.perf_counter()
        backend.kill_node(cluster, "cpu-1")
        operation = None
        while operation is None:
            time.sleep(0.5)
            cluster.refresh_from_db()
            operation = repair.watch(cluster)
        detected = time.perf_counter() - killed
        engine.run(operation.pk)
        idle = time.perf_counter() - killed
        while backend.job_status(cluster, job).state != "RUNNING":
            time.sleep(0.2)
        running = time.perf_counter() - killed
        print(f"slurmd killed -> detected (Slurm marks it down): {detected:6.1f} s")
        print(f"slurmd killed -> node repaired and idle:        {idle:6.1f} s")
        print(f"slurmd killed -> requeued job running again:    {running:6.1f} s")
        backend.cancel_job(cluster, job)
        engine.run(services.delete_cluster(cluster=cluster, user=user).pk)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def write_job(cluster):
    folder = Path(get_backend("local").shared_dir(cluster))
    script = folder / "bench-requeue.sbatch"
    script.write_text(
        batch.render({"nodes": 2, "requeue": True, "output": f"{folder}/bench-%j.out"}, body=["srun sleep 600"])
    )
    return script.name  # relative to the home, as submit_batch takes it


if __name__ == "__main__":
    main()
