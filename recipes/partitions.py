"""What a cluster's partition offers a job: its node count, GPUs per node and accelerator."""

from clusters import services as clusters
from clusters.choices import NodeRole


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
