"""The gce backend against a real Google Cloud project: create a two-worker CPU cluster, wait for every
node, run the health scan and a two-node job when the console reaches the cluster, delete it, and check
that nothing the console made is left. Skipped unless TCC_GCE_LIVE_PROJECT names a project.

    TCC_GCE_LIVE_PROJECT=my-project TCC_GCE_LIVE_ZONE=us-central1-a \\
      GOOGLE_APPLICATION_CREDENTIALS=key.json .venv/bin/pytest tests/live -m live

The project needs the APIs, roles and quotas listed in docs/gce.md, and a node image baked with
`manage.py gce_image build` (TCC_GCE_LIVE_IMAGE, its family URL) or TCC_GCE_LIVE_NAT=1 for Cloud NAT.
With TCC_GCE_LIVE_REACH=1 (the console runs where it reaches the cluster's VPC: docs/gce.md; set
GCE_CONSOLE_RANGES and GCE_CONSOLE_NETWORK in the environment, the workers' subnet and network, which the
new VPC is peered with; or, from a machine outside Google Cloud such as a laptop,
GCE_CONTROLLER_ACCESS=external and GCE_CONSOLE_RANGES=<its public address>/32) the scan and the job run
too. It costs a few n2-standard-2 VM-minutes.
"""

import os
import time

import pytest

from clusters import services
from clusters.backends.gce.names import names
from clusters.choices import ClusterStatus
from clusters.models import Cluster

from ..conftest import gce_spec
from ..gce_fixtures import run

PROJECT = os.environ.get("TCC_GCE_LIVE_PROJECT", "")
ZONE = os.environ.get("TCC_GCE_LIVE_ZONE", "us-central1-a")
REACH = os.environ.get("TCC_GCE_LIVE_REACH") == "1"

pytestmark = [
    pytest.mark.live,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not PROJECT, reason="set TCC_GCE_LIVE_PROJECT (and credentials) to run against Google Cloud"),
]


@pytest.fixture
def live(settings, alpha):
    for name in (
        "GCE_API_ENDPOINT",
        "GCE_FILESTORE_ENDPOINT",
        "GCE_LUSTRE_ENDPOINT",
        "GCE_SECRET_MANAGER_ENDPOINT",
        "GCE_SERVICE_NETWORKING_ENDPOINT",
        "GCE_RESOURCE_MANAGER_ENDPOINT",
        "GCE_SERVICE_USAGE_ENDPOINT",
        "GCE_STORAGE_ENDPOINT",
        "GCE_IAM_ENDPOINT",
    ):
        setattr(settings, name, "")  # Google's own endpoints
    settings.GCE_ANONYMOUS = False
    settings.GCE_REACH_CLUSTERS = REACH
    settings.GCE_POLL_INTERVAL = 5
    if os.environ.get("TCC_GCE_LIVE_IMAGE"):
        settings.GCE_IMAGE = os.environ["TCC_GCE_LIVE_IMAGE"]
        settings.GCE_NODE_PYTHON = "/opt/tcc/venv/bin/python"
    alpha.gcp_project_id = PROJECT
    alpha.save()
    return alpha


def live_spec():
    spec = gce_spec(cpu=2)
    spec["display_name"] = "live"
    for pool in spec["node_pools"]:
        pool["zone"] = ZONE
    spec["console"]["storage"] = {}  # no Filestore: minutes and money this test does not need
    spec["console"]["network"].pop("private_services_range", None)
    spec["console"]["network"]["cloud_nat"] = os.environ.get("TCC_GCE_LIVE_NAT") == "1"
    return spec


def test_a_cluster_is_made_used_and_deleted_leaving_nothing(live, alice):
    from google.cloud import compute_v1

    name = f"live{int(time.time()) % 100000}"
    cluster = run(services.create_cluster(project=live, name=name, spec=live_spec(), user=alice))
    try:
        assert cluster.status == ClusterStatus.READY
        if REACH:  # the create's last step was the first health scan on every node
            assert "the first health scan passed" in cluster.events.first().message
            services.write_file(cluster, "live/two.sh", "#!/bin/bash\n#SBATCH -N 2\nsrun hostname\n")
            job = services.submit_batch(cluster, "live/two.sh")
            deadline = time.time() + 600
            state = ""
            while time.time() < deadline and state not in ("COMPLETED", "FAILED", "CANCELLED"):
                time.sleep(5)
                found = services.job_status(cluster, job)
                state = found.state if found else "gone"
            assert state == "COMPLETED"
    finally:
        run(services.delete_cluster(cluster=Cluster.objects.get(name=name), user=alice))
    prefix = names(live.slug, name).prefix
    label = f'labels.tcc-cluster = "{prefix}"'
    left = list(compute_v1.InstancesClient().list(request={"project": PROJECT, "zone": ZONE, "filter": label}))
    left += [n for n in compute_v1.NetworksClient().list(project=PROJECT) if n.name.startswith(prefix)]
    left += [f for f in compute_v1.FirewallsClient().list(project=PROJECT) if f.name.startswith(prefix)]
    assert left == []
