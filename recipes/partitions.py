"""What a cluster's partition offers a job: its node count, GPUs per node and accelerator, and the
node a job there can count on."""

from clusters import services as clusters
from clusters.choices import NodeRole
from clusters.spec.catalog import machine_fabric


def partition_shape(cluster, partition_name):
    """(node count, GPUs per node, accelerator type or "") of a partition, or None when the cluster has
    no such partition."""
    partition = cluster.partitions.filter(name=partition_name).prefetch_related("node_pools").first()
    if partition is None:
        return None
    pools = [p for p in partition.node_pools.all() if p.role == NodeRole.COMPUTE]
    nodes = sum(p.node_count for p in pools)
    # What a node really has on its backend (local nodes run on CPU whatever the machine type says).
    gpus = min((clusters.gpus_per_node(cluster, p) for p in pools), default=0)
    accelerator = next((p.accelerator_type for p in pools if p.accelerator_type), "") if gpus else ""
    return nodes, gpus, accelerator


def default_partition(cluster):
    """The name of the cluster's default partition, or "" when it has none."""
    return cluster.partitions.filter(is_default=True).values_list("name", flat=True).first() or ""


def smallest_node(cluster, partition_name):
    """The NodeShape (cpus, memory_mb, gpus) of the partition's smallest compute node: what a job there
    can count on whichever node Slurm picks; None when the partition has no compute pool."""
    shapes = [shape for pool, shape in clusters.node_shapes(cluster)
              if shape and partition_name in {p.name for p in pool.partitions.all()}]  # fmt: skip
    return min(shapes, key=lambda shape: (shape.gpus, shape.cpus, shape.memory_mb), default=None)


def gpu_network(cluster, partition_name):
    """The GPU network of a GPU partition's machine type (rdma, tcpxo, tcpx; machine_types.json's
    `fabric`), or "" (pools of two networks: NCCL's own defaults). Callers ask it of partitions whose
    nodes have GPUs on this backend (partition_shape)."""
    pools = cluster.node_pools.filter(role=NodeRole.COMPUTE, partitions__name=partition_name)
    fabrics = {machine_fabric(machine_type) for machine_type in pools.values_list("machine_type", flat=True)}
    return fabrics.pop() if len(fabrics) == 1 else ""
