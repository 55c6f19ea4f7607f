"""End to end on real parts: a Celery worker on Redis provisions a real local Slurm cluster.

One cluster story per test keeps the daemons few: create, run a 2-node job, grow, shrink, delete.
"""

from pathlib import Path

import pytest
from django.conf import settings

from clusters import processes
from clusters.backends import get_backend
from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster

from .conftest import example_spec, synced, wait_until
from .factories import finished, idle_nodes, slurmd_pids

pytestmark = pytest.mark.django_db(transaction=True)

CLUSTERS = "/api/v1/projects/alpha/clusters/"


def apply(api, spec):
    response = api.patch(f"{CLUSTERS}demo/", {"spec": spec}, format="json")
    assert response.status_code == 202, response.content
    operation = finished(response.json()["id"])
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return Cluster.objects.get(name="demo")


def test_it_provisions_runs_a_two_node_job_resizes_and_deletes(celery_worker, slurm, alice_api, client, alice):
    response = alice_api.post(CLUSTERS, {"cluster_id": "demo", "spec": example_spec(cpu=2)}, format="json")
    assert response.status_code == 202
    operation = finished(response.json()["id"])
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert operation.progress == 100
    cluster = Cluster.objects.get(name="demo")
    assert cluster.status == ClusterStatus.READY
    assert idle_nodes(cluster) == ["cpu-0", "cpu-1"]

    # A two-node batch job runs one task on each node; with no --output, its output lands in the
    # cluster's home (where the console submits from), never in the console's own checkout.
    paths = get_backend("local").paths(cluster)
    script = paths.jobs / "hello.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 2\nsrun bash -c 'echo $SLURMD_NODENAME'\n")
    job_id = get_backend("local").submit_batch(cluster, script.name)

    def completed():
        jobs = {j.job_id: j for j in get_backend("local").jobs(cluster)}
        return job_id in jobs and jobs[job_id].state == "COMPLETED" and jobs[job_id]

    job = wait_until(completed, timeout=60, message=f"job {job_id} to complete")
    assert job.exit_code == 0
    assert job.node_count == 2
    assert sorted((paths.jobs / f"slurm-{job_id}.out").read_text().split()) == ["cpu-0", "cpu-1"]
    assert not list(Path(settings.BASE_DIR).glob("slurm-*.out"))

    # After a sync, the page's node fragment shows Slurm's state and the jobs fragment the job.
    assert synced(cluster) == ""
    client.force_login(alice)
    nodes_html = client.get("/clusters/alpha/demo/nodes/").content.decode()
    assert nodes_html.count(">idle<") == 2
    assert str(job_id) in client.get("/clusters/alpha/demo/jobs/").content.decode()

    # Job history outlives the controller: with slurmctld stopped the console still lists the job.
    processes.stop(processes.find_pids("slurmctld", str(paths.conf)))
    assert "Slurm is not answering" in synced(cluster)
    response = alice_api.get(f"{CLUSTERS}demo/jobs/")
    assert "Slurm is not answering" in response["Warning"]
    assert next(j for j in response.json()["results"] if j["job_id"] == job_id)["state"] == "COMPLETED"
    assert "Slurm not answering since" in client.get("/clusters/alpha/demo/jobs/").content.decode()

    cluster = apply(alice_api, example_spec(cpu=3))  # also starts slurmctld again
    assert idle_nodes(cluster) == ["cpu-0", "cpu-1", "cpu-2"]
    assert len(slurmd_pids(cluster, "cpu-0")) == 1

    cluster = apply(alice_api, example_spec(cpu=1))
    assert idle_nodes(cluster) == ["cpu-0"]
    assert slurmd_pids(cluster, "cpu-1") == slurmd_pids(cluster, "cpu-2") == []
    assert list(cluster.nodes.values_list("name", flat=True).order_by("name")) == ["cpu-0", "login-0"]

    response = alice_api.delete(f"{CLUSTERS}demo/")
    operation = finished(response.json()["id"])
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert Cluster.objects.get(name="demo").status == ClusterStatus.DELETED
    assert not paths.root.exists()
    conf = str(paths.conf)
    assert processes.find_pids("slurmd", conf) == processes.find_pids("slurmctld", conf) == []
    assert processes.find_pids("slurmrestd", conf) == []
    assert processes.find_pids("munged", str(paths.munge_socket)) == []


def test_it_replays_the_services_create_example_on_the_compatible_paths(celery_worker, slurm, alice_api):
    from .factories import BASE, create

    operation = create(alice_api).json()
    assert "done" not in operation

    def done():
        body = alice_api.get(f"/v1beta1/{operation['name']}").json()
        return body if body.get("done") else None

    body = wait_until(done, timeout=120, message="the create operation")
    assert "error" not in body, body
    assert body["response"]["state"] == "RUNNING"
    assert body["response"]["node_pools"][1]["machine_spec"]["machine_type"] == "a3-ultragpu-8g"
    assert body["response"]["console"] == {"backend": "local"}  # the example has no console block: it says where
    cluster = Cluster.objects.get(name="a3u")
    assert idle_nodes(cluster) == ["a3u-0", "a3u-1"]

    deletion = alice_api.delete(f"{BASE}/modelDevelopmentClusters/a3u").json()
    body = wait_until(
        lambda: (b := alice_api.get(f"/v1beta1/{deletion['name']}").json()).get("done") and b,
        timeout=60,
        message="the delete operation",
    )
    assert body["response"] == {"@type": "type.googleapis.com/google.protobuf.Empty"}
    assert alice_api.get(f"{BASE}/modelDevelopmentClusters/a3u").status_code == 404
