"""One contract, two backends: the same tests run against `local` (real Slurm) and `gce` (fake API).

Operations run in-process through the service layer (the Celery path is tested elsewhere), so
what differs between the backends is only how a test looks at what exists.
"""

import pytest
from django.conf import settings

from clusters import processes, services
from clusters.backends import get_backend
from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster, Operation
from clusters.operations import engine

from .conftest import example_spec, stop_local_clusters
from .fake_compute import FakeGoogleCloud

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def fake_cloud():
    fake = FakeGoogleCloud().start()
    yield fake
    fake.stop()


class LocalHarness:
    name = "local"

    def spec(self, cpu):
        return example_spec(cpu=cpu)

    def leftovers(self, cluster):
        paths = get_backend("local").paths(cluster)
        found = [
            f"{name} process"
            for name in ("slurmd", "slurmctld", "slurmrestd")
            for _ in processes.find_pids(name, str(paths.conf))
        ]
        found += ["munged process" for _ in processes.find_pids("munged", str(paths.munge_socket))]
        return found + ([str(paths.root)] if paths.root.exists() else [])

    def instances(self, cluster):
        """What runs for each compute node: its slurmd processes."""
        conf = str(get_backend("local").paths(cluster).conf)
        return {node.name: processes.find_pids("slurmd", conf, node.name) for node in cluster.compute_nodes()}


class GceHarness:
    name = "gce"

    def __init__(self, fake):
        self.fake = fake

    def spec(self, cpu):
        spec = example_spec(cpu=cpu)
        spec["console"] = {
            "backend": "gce",
            "network": {
                "create": True,
                "mtu": 1460,
                "subnet_range": "10.0.0.0/16",
                "private_services_range": "10.100.0.0/20",
            },
            "storage": {"filestore_home": {"tier": "ZONAL", "capacity_gb": 1024}},
        }
        return spec

    def leftovers(self, cluster):
        from clusters.backends.gce.names import names

        prefix = names(cluster.project.slug, cluster.name).prefix
        return [
            key
            for key, resource in self.fake.resources.items()
            if prefix in str(resource.get("labels", "")) + str(resource.get("description", ""))
        ]

    def instances(self, cluster):
        from clusters.backends.gce.names import names

        prefix = names(cluster.project.slug, cluster.name).prefix
        found = {}
        for node in cluster.compute_nodes():
            found[node.name] = [k for k in self.fake.instances() if k.endswith(f"/instances/{prefix}-{node.name}")]
        return found


@pytest.fixture(params=[pytest.param("local", marks=pytest.mark.slurm), "gce"])
def harness(request, settings, alpha):
    if request.param == "local":
        yield LocalHarness()
        stop_local_clusters()
    else:
        fake = request.getfixturevalue("fake_cloud")
        fake.configure(settings)
        alpha.gcp_project_id = "tcc-test"
        alpha.save()
        yield GceHarness(fake)


def run(operation):
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return Cluster.objects.get(pk=operation.cluster_id)


def create(harness, alpha, alice, cpu=2):
    return run(
        services.create_cluster(project=alpha, name=f"contract-{harness.name}", spec=harness.spec(cpu), user=alice)
    )


def running_nodes(cluster):
    return sorted(s.name for s in get_backend(cluster.backend).node_statuses(cluster) if s.state in ("idle", "running"))


def test_it_creates_every_wanted_node(harness, alpha, alice):
    cluster = create(harness, alpha, alice, cpu=2)
    assert cluster.status == ClusterStatus.READY
    assert running_nodes(cluster) == ["cpu-0", "cpu-1"]
    assert one_instance_each(harness, cluster, ["cpu-0", "cpu-1"])


def test_a_rerun_of_every_step_creates_nothing_twice(harness, alpha, alice):
    cluster = create(harness, alpha, alice, cpu=2)
    before = sorted(harness.leftovers(cluster))
    for step in get_backend(cluster.backend).apply_steps(cluster):
        step.run(None)
    assert sorted(harness.leftovers(cluster)) == before
    assert one_instance_each(harness, cluster, ["cpu-0", "cpu-1"])


def one_instance_each(harness, cluster, nodes):
    """Every one of `nodes` (and no other compute node) runs as exactly one instance (slurmd or VM)."""
    found = harness.instances(cluster)
    return sorted(found) == nodes and all(len(instances) == 1 for instances in found.values())


def test_it_grows_and_shrinks_a_pool(harness, alpha, alice):
    cluster = create(harness, alpha, alice, cpu=1)
    cluster = run(services.update_cluster(cluster=cluster, spec=harness.spec(3)))
    assert running_nodes(cluster) == ["cpu-0", "cpu-1", "cpu-2"]
    cluster = run(services.update_cluster(cluster=cluster, spec=harness.spec(1)))
    assert running_nodes(cluster) == ["cpu-0"]


def test_delete_removes_everything_it_created(harness, alpha, alice):
    cluster = create(harness, alpha, alice, cpu=2)
    assert harness.leftovers(cluster)
    cluster = run(services.delete_cluster(cluster=cluster, user=alice))
    assert cluster.status == ClusterStatus.DELETED
    assert harness.leftovers(cluster) == []
    assert Operation.objects.filter(cluster=cluster, kind="DELETE").get().progress == 100


def test_every_step_has_a_name_a_user_can_read(harness, alpha, alice):
    operation = services.create_cluster(project=alpha, name=f"names-{harness.name}", spec=harness.spec(1), user=alice)
    backend = get_backend(operation.cluster.backend)
    for step in [*backend.apply_steps(operation.cluster), *backend.delete_steps(operation.cluster)]:
        assert step.name[0].isupper() and len(step.name) < 120
    assert settings.CLUSTER_BACKENDS[backend.name]
