"""A cluster's rows: its pools, partitions and nodes as the spec describes them, grown and shrunk."""

from .choices import NodeRole, NodeState
from .models import Node, NodePool, Partition
from .spec import pool_node_count


def build_topology(cluster, spec):
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    login = slurm["login_node_pool_id"]
    pools = {}
    for item in spec["node_pools"]:
        machine = item["machine_spec"]
        pool = NodePool.objects.create(
            cluster=cluster,
            pool_id=item["id"],
            role=NodeRole.LOGIN if item["id"] == login else NodeRole.COMPUTE,
            machine_type=machine["machine_type"],
            accelerator_type=machine.get("accelerator_type", ""),
            accelerator_count=machine.get("accelerator_count", 0) or 0,
            node_count=pool_node_count(item),
            zone=item.get("zone", ""),
            provisioning_model=item.get("provisioning_model", "ON_DEMAND"),
        )
        pools[pool.pool_id] = pool
        add_nodes(pool, range(pool.node_count))
    for i, item in enumerate(slurm["partitions"]):
        partition = Partition.objects.create(cluster=cluster, name=item["id"], is_default=i == 0)
        partition.node_pools.set([pools[p] for p in item["node_pool_ids"]])


def node_name(pool, index):
    return f"{pool.pool_id}-{index}"


def add_nodes(pool, indices, **fields):
    Node.objects.bulk_create(
        Node(cluster=pool.cluster, node_pool=pool, name=node_name(pool, i), index=i, **fields) for i in indices
    )


def resize_pools(cluster, spec):
    """Add Node rows for grown pools and mark the highest-numbered ones of shrunk pools for removal."""
    counts = {p["id"]: pool_node_count(p) for p in spec["node_pools"]}
    changes = []
    for pool in cluster.node_pools.all():
        wanted = counts[pool.pool_id]
        current = list(pool.nodes.filter(state__in=NodeState.wanted()).order_by("index"))
        if wanted > len(current):
            start = max([n.index for n in pool.nodes.all()], default=-1) + 1
            add_nodes(pool, range(start, start + wanted - len(current)))
        elif wanted < len(current):
            Node.objects.filter(pk__in=[n.pk for n in current[wanted:]]).update(state=NodeState.DELETING)
        if wanted != len(current):
            changes.append(f"{pool.pool_id} {len(current)} → {wanted} nodes")
        pool.node_count = wanted
        pool.save(update_fields=["node_count"])
    return ", ".join(changes)


def settle_nodes(cluster):
    """After a create, resize or replacement: removed nodes go, the wanted ones are READY."""
    cluster.nodes.filter(state=NodeState.DELETING).delete()
    cluster.wanted_nodes().update(state=NodeState.READY)
