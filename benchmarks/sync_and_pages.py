"""Reads don't write: what the Slurm sync costs, and what pages cost once they read only the database.

1. Slurm client calls per cluster per sync interval on a REAL local cluster (2 nodes), with 0, 1 and
   50 browser tabs polling the cluster page's fragments (nodes, jobs, runs, events) in that interval.
   Every sinfo/squeue/scontrol/sbatch the console starts is counted.
2. One cluster with 1,000 nodes and 10,000 jobs in the database (and one with 10 and 100 to compare):
   SQL queries and median server time of the cluster page, its nodes and jobs fragments, and the
   nodes and jobs APIs.
3. The sync's own cost at that size: the first sync (everything new) and one where nothing changed.

Usage: .venv/bin/python benchmarks/sync_and_pages.py
"""

import statistics
import subprocess
import sys
import time
from pathlib import Path

from _setup import scratch_django

scratch_django(AUTO_REPAIR="false", HEALTH_SCAN_BEFORE_READY="false")

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from clusters import services, tasks  # noqa: E402
from clusters.backends import get_backend  # noqa: E402
from clusters.choices import ClusterStatus, NodeRole, NodeState, OperationStatus, Role  # noqa: E402
from clusters.models import Cluster, Node, Operation, Project, SlurmJob  # noqa: E402
from clusters.operations import engine  # noqa: E402
from clusters.services import sync  # noqa: E402
from clusters.slurm.states import JobStatus, NodeStatus  # noqa: E402
from tests.conftest import example_spec  # noqa: E402

SLURM_CLIENTS = {"sinfo", "squeue", "scontrol", "sbatch", "scancel", "srun", "sacct"}
calls = []
real_run = subprocess.run


def counting_run(command, *args, **kwargs):
    program = [Path(str(part)).name for part in command if Path(str(part)).name in SLURM_CLIENTS]
    if program:
        calls.append(program[0])
    return real_run(command, *args, **kwargs)


subprocess.run = counting_run


def tabs_poll(client, slug, name, tabs):
    for _ in range(tabs):
        for suffix in ("nodes/", "jobs/", "runs/", "events/"):
            response = client.get(f"/clusters/{slug}/{name}/{suffix}", HTTP_HX_REQUEST="true")
            assert response.status_code in (200, 286), (suffix, response.status_code)


def slurm_calls_per_interval(user, project):
    operation = services.create_cluster(project=project, name="live", spec=example_spec(cpu=2), user=user)
    engine.run(operation.pk)
    cluster = Cluster.objects.get(name="live")
    assert cluster.status == ClusterStatus.READY, cluster.status_message
    client = Client()
    client.force_login(user)
    print("1. Slurm client calls per cluster per sync interval (a real 2-node local cluster)")
    try:
        for tabs in (0, 1, 50):
            calls.clear()
            tasks.sync_cluster(cluster.pk)  # the one sync beat sends per interval
            tabs_poll(client, project.slug, cluster.name, tabs)
            print(f"   {tabs:2d} tabs polling 4 fragments: {len(calls)} Slurm calls ({', '.join(sorted(calls))})")
    finally:
        operation = services.delete_cluster(cluster=cluster, user=user)
        engine.run(operation.pk)


def fill(cluster, nodes, jobs):
    pool = cluster.node_pools.get(role=NodeRole.COMPUTE)
    cluster.nodes.filter(node_pool=pool).delete()
    Node.objects.bulk_create(
        [
            Node(cluster=cluster, node_pool=pool, name=f"cpu-{i}", index=i, state=NodeState.READY, slurm_state="idle")
            for i in range(nodes)
        ],
        batch_size=2000,
    )
    rows = [
        SlurmJob(cluster=cluster, job_id=j, name=f"train-{j}", user=f"u{j % 7}", partition="cpu",
                 state="RUNNING" if j > jobs - 200 else "COMPLETED", node_count=1)
        for j in range(1, jobs + 1)
    ]  # fmt: skip
    SlurmJob.objects.bulk_create(rows, batch_size=2000)


def measure(client, url, repeat=15, fragment=False):
    queries = []

    def record(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    headers = {"HTTP_HX_REQUEST": "true"} if fragment else {}
    with connection.execute_wrapper(record):
        response = client.get(url, **headers)
    assert response.status_code in (200, 286), (url, response.status_code)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(url, **headers)
        samples.append((time.perf_counter() - started) * 1000)
    return len(queries), statistics.median(samples)


def pages_at_size(user, project):
    print("\n2. Pages and GET endpoints, reading the database only")
    client = Client()
    client.force_login(user)
    sizes = {"small": (10, 100), "large": (1000, 10000)}
    urls = {
        "cluster page": ("/clusters/bench/{c}/", False),
        "nodes fragment": ("/clusters/bench/{c}/nodes/", True),
        "jobs fragment": ("/clusters/bench/{c}/jobs/", True),
        "jobs fragment, filtered": ("/clusters/bench/{c}/jobs/?state=running&user=u3&page=2", True),
        "nodes API": ("/api/v1/projects/bench/clusters/{c}/nodes/", False),
        "jobs API (cursor page)": ("/api/v1/projects/bench/clusters/{c}/jobs/", False),
    }
    found = {}
    for size, (nodes, jobs) in sizes.items():
        services.create_cluster(project=project, name=size, spec=example_spec(cpu=2), user=user)
        Operation.objects.update(status=OperationStatus.SUCCEEDED)
        Cluster.objects.filter(name=size).update(status=ClusterStatus.READY)
        cluster = Cluster.objects.get(name=size)
        fill(cluster, nodes, jobs)
        tasks_sync_skip(cluster)
        for name, (url, fragment) in urls.items():
            found[(size, name)] = measure(client, url.format(c=size), fragment=fragment)
    print(f"   {'':26s} {'10 nodes, 100 jobs':>22s}   {'1,000 nodes, 10,000 jobs':>26s}")
    for name in urls:
        (q1, ms1), (q2, ms2) = found[("small", name)], found[("large", name)]
        print(f"   {name:26s} {q1:3d} queries {ms1:7.1f} ms   {q2:3d} queries {ms2:7.1f} ms")
    return Cluster.objects.get(name="large")


def tasks_sync_skip(cluster):
    """Mark the cluster synced now without Slurm (its rows were written by fill())."""
    from django.utils import timezone

    from clusters.models import SlurmSync

    SlurmSync.objects.update_or_create(cluster=cluster, defaults={"synced": timezone.now()})


class BigSlurm:
    """What a 1,000-node Slurm with 10,000 jobs in memory would report: the first `ended` jobs COMPLETED,
    the rest RUNNING (in their `reason` when `relabel` is set, so every row differs from the last sync)."""

    def __init__(self, cluster):
        self.cluster, self.ended, self.relabel = cluster, 0, ""

    def node_statuses(self, cluster):
        return [NodeStatus(name=f"cpu-{i}", state="idle") for i in range(1000)]

    def jobs(self, cluster):
        return [
            JobStatus(job_id=j, name=f"train-{j}", user=f"u{j % 7}", partition="cpu", nodes=f"cpu-{j % 1000}",
                      node_count=1, state="COMPLETED" if j - 20001 < self.ended else "RUNNING", reason=self.relabel,
                      exit_code=0 if j - 20001 < self.ended else None)
            for j in range(20001, 30001)
        ]  # fmt: skip


def sync_at_size(cluster):
    print("\n3. One sync of 1,000 nodes and 10,000 jobs in Slurm's queue")
    real = get_backend(cluster.backend)
    big = BigSlurm(cluster)
    sync.get_backend = lambda name: big
    try:
        rounds = [
            ("first (10,000 new jobs)", 0, ""),
            ("nothing changed", 0, ""),
            ("1,000 jobs ended", 1000, ""),
            ("all 10,000 jobs changed", 1000, "Priority"),
        ]
        for label, ended, relabel in rounds:
            big.ended, big.relabel = ended, relabel
            queries = []

            def record(execute, sql, params, many, context, queries=queries):
                queries.append(sql)
                return execute(sql, params, many, context)

            started = time.perf_counter()
            with connection.execute_wrapper(record):
                assert services.sync_cluster(cluster) == ""
            ms = (time.perf_counter() - started) * 1000
            state = cluster.slurm_sync
            state.refresh_from_db()
            print(
                f"   {label:26s} {ms:7.0f} ms, {len(queries)} queries, "
                f"{state.nodes_written} nodes and {state.jobs_written} jobs written"
            )
    finally:
        sync.get_backend = lambda name: real


def main():
    """--sync-only: only part 3 (no local Slurm cluster), on the database DATABASE_URL names."""
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-password-1")
    project = Project.objects.create(slug="bench", name="Bench")
    project.members.add(user, through_defaults={"role": Role.ADMIN})
    print(f"database: {connection.vendor}")
    if "--sync-only" in sys.argv:
        services.create_cluster(project=project, name="big", spec=example_spec(cpu=2), user=user)
        Operation.objects.update(status=OperationStatus.SUCCEEDED)
        Cluster.objects.filter(name="big").update(status=ClusterStatus.READY)
        cluster = Cluster.objects.get(name="big")
        fill(cluster, 1000, 0)
        sync_at_size(cluster)
        return
    slurm_calls_per_interval(user, project)
    large = pages_at_size(user, project)
    sync_at_size(large)


if __name__ == "__main__":
    main()
