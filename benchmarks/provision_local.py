"""Time from a create request to every node idle in Slurm, on the local backend, for N = 2, 4, 8 nodes.

Runs the whole path in one process: the REST request, the operation (Celery in eager mode, so the
worker's code runs inline), the real munged/slurmctld/slurmd start-up and Slurm's registration. It then
deletes each cluster and times that too. Usage: .venv/bin/python benchmarks/provision_local.py [N ...]
"""

import json
import sys
import time

from _setup import ROOT, bench_project, scratch_django

scratch_django(CELERY_TASK_ALWAYS_EAGER="true")

from rest_framework.test import APIClient  # noqa: E402

from clusters.backends import get_backend  # noqa: E402
from clusters.models import Cluster, Operation  # noqa: E402


def spec_with(nodes):
    spec = json.loads((ROOT / "examples" / "cluster-local-cpu.json").read_text())
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": nodes, "max_node_count": nodes}
    return spec


def main(sizes):
    user, _project = bench_project()
    client = APIClient()
    client.force_authenticate(user)
    print(
        f"{'nodes':>5}  {'create→idle (s)':>15}  {'slurmctld (s)':>13}  {'slurmd starts (s)':>17}  {'delete (s)':>10}"
    )
    for n in sizes:
        name = f"bench{n}"
        started = time.monotonic()
        response = client.post(
            "/api/v1/projects/bench/clusters/", {"cluster_id": name, "spec": spec_with(n)}, format="json"
        )
        assert response.status_code == 202, response.content
        cluster = Cluster.objects.get(name=name)
        backend = get_backend("local")
        while sum(s.state == "idle" for s in backend.node_statuses(cluster)) < n:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        operation = Operation.objects.get(uuid=response.json()["id"])
        assert operation.status == "SUCCEEDED", operation.error
        steps = {e["step"]: float(e["message"].rsplit("done in ", 1)[1].split()[0]) for e in operation.log}
        ctld = steps.get("Start slurmctld", 0.0)
        slurmds = sum(v for k, v in steps.items() if k.startswith("Start slurmd"))
        started = time.monotonic()
        client.delete(f"/api/v1/projects/bench/clusters/{name}/")
        deleted = time.monotonic() - started
        print(f"{n:>5}  {elapsed:>15.2f}  {ctld:>13.2f}  {slurmds:>17.2f}  {deleted:>10.2f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [2, 4, 8])
