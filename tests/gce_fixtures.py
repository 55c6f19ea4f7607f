"""What the gce provisioning tests share (the fake Compute API itself is conftest's `fake` fixture): the
A3 Ultra spec they build, and helpers that create a cluster and read what the fake received."""

from clusters import services
from clusters.backends.gce.names import names
from clusters.choices import OperationStatus
from clusters.models import Cluster
from clusters.operations import engine
from clusters.spec.reference import build_spec


def gce_spec(nodes=4, pools=1):
    spec = build_spec("a3-ultra", display_name="ultra", zone="us-central1-b", nodes=nodes, backend="gce")
    main = spec["node_pools"][1]
    for i in range(1, pools):
        extra = {**main, "id": f"{main['id']}{i}"}
        spec["node_pools"].append(extra)
        spec["orchestrator_spec"]["slurm_spec"]["partitions"].append(
            {"id": extra["id"], "node_pool_ids": [extra["id"]]}
        )
    return spec


def create(alpha, alice, spec, name="ultra"):
    return services.create_cluster(project=alpha, name=name, spec=spec, user=alice)


def built(alpha, alice, spec, name="ultra"):
    """Create the cluster and run its operation to success; returns the cluster's name prefix."""
    operation = create(alpha, alice, spec, name=name)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return names("alpha", name).prefix


def run(operation):
    """Run an operation to success; returns its cluster as it is now."""
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return Cluster.objects.get(pk=operation.cluster_id)


def template_of(fake, prefix, pool="a3ultra"):
    return fake.resources[f"/compute/v1/projects/tcc-test/global/instanceTemplates/{prefix}-tpl-{pool}"]


def run_task(operation, settings, retries=0):
    from clusters.operations.tasks import run_operation_task

    settings.OPERATION_MAX_RETRIES = retries
    run_operation_task.apply(args=[operation.pk])
    operation.refresh_from_db()
    return operation
