"""gce create to READY on the booting fake Compute API (tests/fake_vms.py): every instance boots its
real startup script (munge, slurmctld, slurmrestd and the agent on the controller, configless slurmds
on the workers), and the create ends with the first health scan (every check) on every node, as on a
real cluster. For 2, 4 and 8 workers: seconds to READY and where they went (instances made, the
controller's startup, nodes idle in Slurm, the scan), Compute API calls, and delete.

All VMs share this machine's cores, so the scan's per-node work (torch's import among it) grows with
the node count here and would not on real VMs. Needs root (namespaces). Usage:
.venv/bin/python benchmarks/gce_boot.py [2 4 8]
"""

import sys
import time

from _setup import WORK, bench_project, scratch_django

scratch_django(AUTO_REPAIR="false", GCE_NODE_PYTHON=sys.executable)

from django.conf import settings  # noqa: E402

from clusters import services  # noqa: E402
from clusters.models import Cluster, Operation  # noqa: E402
from clusters.operations import engine  # noqa: E402
from tests.conftest import gce_spec  # noqa: E402
from tests.fake_compute import FakeGoogleCloud  # noqa: E402

PHASES = [  # (label, the step whose end closes the phase)
    ("instances", "Create cpu nodes (bulkInsert)"),
    ("controller", "Wait for slurmctld to know every wanted node"),
    ("idle", "Wait for nodes to register idle"),
    ("scan", "First health scan: Compare nodes and record results"),
]


def phases(operation, started):
    """Seconds from the create's start to the end of each phase (from the operation's step log)."""
    ends = {entry["step"]: entry["at"] for entry in operation.log}
    out = []
    for label, step in PHASES:
        at = ends.get(step)
        out.append((label, (at_seconds(at) - started) if at else float("nan")))
    return out


def at_seconds(text):
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def main(sizes):
    fake = FakeGoogleCloud(boot=True, root=WORK / "cloud").start()
    fake.configure(settings)
    user, project = bench_project("bench-proj")
    print("workers | READY s | instances controller idle scan (s from start) | API calls | delete s")
    ready = {}
    try:
        for workers in sizes:
            spec = gce_spec(cpu=workers)
            spec["display_name"] = f"b{workers}"
            fake.reset_calls()
            started = time.time()
            operation = services.create_cluster(project=project, name=f"b{workers}", spec=spec, user=user)
            engine.run(operation.pk)
            elapsed = time.time() - started
            operation = Operation.objects.get(pk=operation.pk)
            assert operation.status == "SUCCEEDED", operation.error
            calls = sum(fake.calls.values())
            cluster = Cluster.objects.get(pk=operation.cluster_id)
            marks = " ".join(f"{seconds:>6.1f}" for _label, seconds in phases(operation, started))
            deleting = time.time()
            delete = services.delete_cluster(cluster=cluster, user=user)
            engine.run(delete.pk)
            print(f"{workers:>7} | {elapsed:>7.1f} | {marks:<40} | {calls:>9} | {time.time() - deleting:>8.1f}")
            ready[workers] = elapsed
    finally:
        fake.stop()
    if len(ready) > 1:
        low, high = min(ready), max(ready)
        print(f"READY time ratio {high}/{low} workers: {ready[high] / ready[low]:.2f}")


if __name__ == "__main__":
    main([int(n) for n in sys.argv[1:]] or [2, 4, 8])
