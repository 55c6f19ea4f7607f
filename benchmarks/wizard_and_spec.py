"""Spec and wizard figures: validating a 64-pool spec, a wizard step's live-check round trip, and the
time from pressing "Create" in review to the cluster page showing the provisioning progress.

Needs Redis (scripts/bootstrap.sh starts it); starts its own Celery worker on a scratch database.
Usage: .venv/bin/python benchmarks/wizard_and_spec.py
"""

import os
import statistics
import subprocess
import sys
import time

from _setup import ROOT, scratch_django

# Its own Redis database (14) of the Redis bootstrap.sh started, or BENCH_REDIS_URL.
REDIS = {"REDIS_URL": os.environ["BENCH_REDIS_URL"]} if os.environ.get("BENCH_REDIS_URL") else {"REDIS_DB": "14"}
ENV = scratch_django(**REDIS, LOCAL_MAX_NODES="1000")

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

from clusters import services, wizard  # noqa: E402
from clusters.backends import all_backends  # noqa: E402
from clusters.choices import Role  # noqa: E402
from clusters.models import Cluster, Project  # noqa: E402
from clusters.spec import validate_spec  # noqa: E402


def timed(fn, repeat):
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000, max(samples) * 1000


def big_spec(pools):
    spec = wizard.skeleton_spec("big")
    spec["node_pools"] = spec["node_pools"][:1] + [
        wizard.pool_spec(f"pool{i}", "a3-ultragpu-8g", 2, "us-central1-a") for i in range(pools)
    ]
    spec["orchestrator_spec"]["slurm_spec"]["partitions"] = [
        {"id": f"part{i}", "node_pool_ids": [f"pool{i}"]} for i in range(pools)
    ]
    return spec


def main():
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-password-1")
    project = Project.objects.create(slug="bench", name="Bench")
    project.members.add(user, through_defaults={"role": Role.ADMIN})
    spec = big_spec(64)
    median, worst = timed(lambda: validate_spec(spec, backends=all_backends()), 50)
    print(f"validate a 64-pool spec:                  median {median:7.2f} ms   max {worst:7.2f} ms")

    client = Client()
    client.force_login(user)
    draft = services.create_draft(project=project, name="steps", spec=big_spec(8), user=user)
    form = {"live": "1", "pools": [str(i) for i in wizard.compute_indices(draft.spec)]}
    for row in wizard.compute_rows(draft.spec):
        for field in ("id", "machine", "count", "model", "reservation", "disk_type", "disk_size", "partition"):
            form[f"pool-{row['index']}-{field}"] = str(row[field])
    url = "/clusters/bench/steps/wizard/compute/"
    median, worst = timed(lambda: client.post(url, form, HTTP_HX_REQUEST="true"), 50)
    print(f"wizard live check, compute step, 8 pools: median {median:7.2f} ms   max {worst:7.2f} ms")

    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool=solo", "-l", "WARNING"],
        cwd=ROOT,
        env={**os.environ, **ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)  # worker start-up is not part of the figure
        services.create_draft(project=project, name="quick", spec=wizard.skeleton_spec("quick"), user=user)
        started = time.perf_counter()
        response = client.post("/clusters/bench/quick/wizard/review/")
        page = client.get(response["Location"])
        assert page.status_code == 200
        while True:
            fragment = client.get("/clusters/bench/quick/operation/", HTTP_HX_REQUEST="true").content.decode()
            if 'data-status="RUNNING"' in fragment or 'data-status="SUCCEEDED"' in fragment:
                break
            time.sleep(0.01)
        shown = time.perf_counter() - started
        print(f"Create -> cluster page showing progress:    {shown * 1000:7.0f} ms")
        cluster = Cluster.objects.get(name="quick")
        while cluster.status != "READY":
            time.sleep(0.1)
            cluster.refresh_from_db()
        services.delete_cluster(cluster=cluster, user=user)
        while Cluster.objects.get(pk=cluster.pk).status != "DELETED":
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait()


if __name__ == "__main__":
    main()
