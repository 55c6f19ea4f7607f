"""Does a year of history slow the pages down? 20 clusters with a year of synthetic history (events
hourly, 50 Slurm jobs a day, a daily scan of 4 nodes x 7 checks), measured against the same 20
clusters with none: SQL queries and server time of the dashboard, a cluster page and its polled
fragments; then again after the retention prune (clusters/retention.py).

Usage: .venv/bin/python benchmarks/history_growth.py
"""

import statistics
import time
from datetime import timedelta

from _setup import scratch_django

scratch_django(AUTO_REPAIR="false", HEALTH_SCAN_BEFORE_READY="false")

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from clusters import retention, services  # noqa: E402
from clusters.choices import ClusterStatus, OperationKind, OperationStatus, Role  # noqa: E402
from clusters.models import Cluster, ClusterEvent, HealthResult, Operation, Project, SlurmJob  # noqa: E402
from tests.conftest import example_spec  # noqa: E402

CLUSTERS, DAYS = 20, 365
CHECKS = ("disk", "gpu_inventory", "ecc", "dcgm", "correctness", "speed", "interconnect")
PAGES = {
    "dashboard": "/",
    "cluster page": "/clusters/bench/c0/",
    "events fragment": "/clusters/bench/c0/events/",
    "health fragment": "/clusters/bench/c0/health/",
    "jobs API (page 1)": "/api/v1/projects/bench/clusters/c0/jobs/",
}


def measure(client, repeat=15):
    figures = {}
    for name, url in PAGES.items():
        queries = []

        def record(execute, sql, params, many, context, queries=queries):
            queries.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(record):
            response = client.get(url, HTTP_HX_REQUEST="true" if "fragment" in name else "")
        assert response.status_code in (200, 286), (url, response.status_code)
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            client.get(url, HTTP_HX_REQUEST="true" if "fragment" in name else "")
            samples.append((time.perf_counter() - started) * 1000)
        figures[name] = (len(queries), statistics.median(samples))
    return figures


def job(cluster, j, now):
    ended = now - timedelta(minutes=j * 29)
    return SlurmJob(
        cluster=cluster, job_id=j, name=f"job{j}", state="COMPLETED", user="bench", seen=ended, end_time=ended
    )


def scan(cluster, days_ago, now):
    when = now - timedelta(days=days_ago)
    return Operation(
        cluster=cluster, kind=OperationKind.SCAN, status=OperationStatus.SUCCEEDED, created=when, finished=when
    )


def add_history(cluster, now, days=DAYS, first_day=0):
    ClusterEvent.objects.bulk_create(
        [
            ClusterEvent(cluster=cluster, message=f"hour {h}", created=now - timedelta(hours=h))
            for h in range(first_day * 24, (first_day + days) * 24)
        ],
        batch_size=2000,
    )
    SlurmJob.objects.bulk_create(
        [job(cluster, j, now) for j in range(first_day * 50 + 1, (first_day + days) * 50 + 1)], batch_size=2000
    )
    scans = Operation.objects.bulk_create([scan(cluster, d, now) for d in range(first_day, first_day + days)])
    results = [
        HealthResult(operation=scan, cluster=cluster, node=f"cpu-{n}", check_name=check, status="pass",
                     created=scan.created, latest=(d == 0))
        for d, scan in enumerate(scans, start=first_day) for n in range(4) for check in CHECKS
    ]  # fmt: skip
    HealthResult.objects.bulk_create(results, batch_size=2000)


def report(title, figures, baseline):
    print(title)
    for name, (queries, ms) in figures.items():
        base_queries, base_ms = baseline[name]
        print(
            f"  {name:20s} {queries:3d} queries ({queries / max(base_queries, 1):4.2f}x)   "
            f"median {ms:7.2f} ms ({ms / base_ms:4.2f}x)"
        )


def main():
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-password-1")
    project = Project.objects.create(slug="bench", name="Bench")
    project.members.add(user, through_defaults={"role": Role.ADMIN})
    for i in range(CLUSTERS):
        services.create_cluster(project=project, name=f"c{i}", spec=example_spec(cpu=4), user=user)
    Operation.objects.update(status=OperationStatus.SUCCEEDED, finished=timezone.now())
    Cluster.objects.update(status=ClusterStatus.READY)
    client = Client()
    client.force_login(user)
    empty = measure(client)
    report("20 clusters, no history (the baseline)", empty, empty)

    now = timezone.now()
    for cluster in Cluster.objects.all():
        add_history(cluster, now, days=7)
    week = measure(client)
    report("20 clusters, a week of history (full pages: 100 events, 200 jobs, a week of scans)", week, empty)
    started = time.perf_counter()
    for cluster in Cluster.objects.all():
        add_history(cluster, now, days=DAYS - 7, first_day=7)
    print(
        f"\nadded a year of history in {time.perf_counter() - started:.0f} s: {ClusterEvent.objects.count():,} events, "
        f"{SlurmJob.objects.count():,} jobs, {Operation.objects.count():,} operations, "
        f"{HealthResult.objects.count():,} health results"
    )
    year = measure(client)
    report("20 clusters, a year of history, not pruned (against empty)", year, empty)
    report("20 clusters, a year of history, not pruned (against a week)", year, week)
    started = time.perf_counter()
    counts = retention.prune()
    print(f"\nprune: {counts} in {time.perf_counter() - started:.1f} s")
    pruned = measure(client)
    report("20 clusters, a year of history, after the prune (against empty)", pruned, empty)
    report("20 clusters, a year of history, after the prune (against a week)", pruned, week)


if __name__ == "__main__":
    main()
