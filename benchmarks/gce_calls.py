"""API calls and wall time of the gce backend against the fake Compute API (tests/fake_compute.py):
create, grow by a quarter, and delete clusters of 8, 64, 1,000 and 10,000 worker nodes in 1 and 4
partitions (10,000 in one: MAX_POOL_NODES, two bulkInserts of at most 5,000).

Target: calls grow with partitions, not nodes, on create (one bulkInsert per pool), and a 1,000-node
create plans and submits in under 10 s of console time. The fake answers at once, so the times are
the console's own work plus local HTTP. Usage: .venv/bin/python benchmarks/gce_calls.py
"""

import time

from _setup import bench_project, scratch_django

scratch_django()

from django.conf import settings  # noqa: E402

from clusters import services  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from clusters.operations import engine  # noqa: E402
from clusters.spec.reference import build_spec  # noqa: E402
from tests.fake_compute import FakeGoogleCloud  # noqa: E402


def spec_for(workers, partitions):
    spec = build_spec("a3-ultra", display_name="bench", zone="us-central1-b", nodes=1, backend="gce")
    main = spec["node_pools"].pop(1)
    spec["orchestrator_spec"]["slurm_spec"]["partitions"] = []
    per_pool = [workers // partitions + (1 if i < workers % partitions else 0) for i in range(partitions)]
    for i, count in enumerate(per_pool):
        pool = {**main, "id": f"gpu{i}", "scaling_spec": {"min_node_count": count, "max_node_count": count}}
        spec["node_pools"].append(pool)
        spec["orchestrator_spec"]["slurm_spec"]["partitions"].append({"id": pool["id"], "node_pool_ids": [pool["id"]]})
    return spec


def grown(spec):
    for pool in spec["node_pools"][1:]:
        n = pool["scaling_spec"]["min_node_count"]
        n = min(n + max(1, n // 4), 10_000)  # MAX_POOL_NODES
        if n == pool["scaling_spec"]["min_node_count"]:
            n -= max(1, n // 4)  # at the largest size: shrink instead
        pool["scaling_spec"] = {"min_node_count": n, "max_node_count": n}
    return spec


def measure(fake, action):
    fake.reset_calls()
    started = time.perf_counter()
    operation = action()
    engine.run(operation.pk)
    elapsed = time.perf_counter() - started
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED", operation.error
    calls = sum(fake.calls.values())
    return elapsed, calls, fake.calls["POST bulkInsert"]


def controller_conf(fake, cluster):
    """The slurm.conf in the controller's metadata (one value: 256 KB at most on Compute Engine)."""
    controller = next(r for k, r in fake.instances().items() if k.endswith("-ctl") and cluster.name in k)
    return next(i["value"] for i in controller["metadata"]["items"] if i["key"] == "slurm-conf")


def main():
    fake = FakeGoogleCloud().start()
    fake.configure(settings)
    user, project = bench_project("bench-proj")
    print("workers parts | create s  calls bulk |  grow s  calls | delete s  calls | slurm.conf bytes")
    for workers in (8, 64, 1000, 10_000):
        for partitions in (1, 4) if workers < 10_000 else (1,):
            name = f"b{workers}x{partitions}"
            spec = spec_for(workers, partitions)
            create = measure(
                fake, lambda n=name, s=spec: services.create_cluster(project=project, name=n, spec=s, user=user)
            )
            cluster = Cluster.objects.get(name=name, status="READY")
            grow = measure(fake, lambda c=cluster, s=spec: services.update_cluster(cluster=c, spec=grown(s)))
            cluster.refresh_from_db()
            conf = controller_conf(fake, cluster)
            delete = measure(fake, lambda c=cluster: services.delete_cluster(cluster=c, user=user))
            print(
                f"{workers:>7} {partitions:>5} | {create[0]:>8.2f} {create[1]:>6} {create[2]:>4} | "
                f"{grow[0]:>7.2f} {grow[1]:>6} | {delete[0]:>8.2f} {delete[1]:>6} | {len(conf.encode()):>10,}"
            )
    fake.stop()


if __name__ == "__main__":
    main()
