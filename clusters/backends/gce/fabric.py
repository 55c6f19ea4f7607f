"""The GPU fabric of each reference architecture: the extra VPCs and NICs its machine type needs.

    a3-highgpu-8g, a3-edge... 1 system gVNIC + 4 GPU NICs (GPUDirect-TCPX), one VPC each: 5 NICs
    a3-megagpu-8g             1 system gVNIC + 8 GPU NICs (GPUDirect-TCPXO), one VPC each: 9 NICs
    a3-ultragpu-8g, a4-...    2 gVNIC VPCs + 1 RDMA (RoCE) VPC with 8 subnets, 8 MRDMA NICs: 10 NICs
    a4x-highgpu-4g            2 gVNIC VPCs + the RDMA VPC, 4 MRDMA NICs (one per GPU): 6 NICs

Their subnets take addresses from 100.64.0.0/10 (RFC 6598 shared space, valid for VPC subnets:
https://cloud.google.com/vpc/docs/subnets#valid-ranges), never from 172.16.0.0/12: A3 Mega's TCPXO
receive-datapath manager runs in Docker, whose default bridge is 172.17.0.0/16. The RDMA VPC takes no
firewall rules (https://cloud.google.com/vpc/docs/rdma-network-profiles).

Source: Cluster Toolkit's examples/machine-learning/a3-highgpu-8g, a3-megagpu-8g, a3-ultragpu-8g, a4-highgpu-8g and
a4x-highgpu-4g
(clusters/data/reference_architectures.json). The console builds these only on the VPCs it creates
(`console.network.create`); on an existing VPC a node gets the one NIC of that VPC.
"""

from dataclasses import dataclass, field

from ...spec.catalog import machine_type_info
from .names import rdma_profile

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).

TCPXO_MTU = 8244
RDMA_MTU = 8896
GPU_NICS = {"tcpx": 4, "tcpxo": 8}  # GPUDirect-TCPX(O): one GPU NIC per VPC


@dataclass
class Net:
    name: str
    mtu: int
    subnets: list  # [(name, CIDR)]
    nic_type: str = "GVNIC"
    profile: str = ""  # a network profile (RDMA VPCs are created from the zone's vpc-roce profile)
    internal_firewall: str = field(default="")


def needs(pool):
    """In words, the extra networks the pool's machine type needs ("" for none)."""
    layout = layout_of(pool)
    if layout in GPU_NICS:
        return f"{GPU_NICS[layout]} GPU VPCs for GPUDirect-{layout.upper()}, one NIC each"
    if layout == "rdma":
        count = rdma_nics(pool)
        return f"a second gVNIC VPC and an RDMA (RoCE) VPC with {count} subnets for its {count} MRDMA NICs"
    return ""


def rdma_nics(pool):
    """MRDMA NICs of an RDMA machine type: one per GPU (8 on A3 Ultra and A4, 4 on A4X)."""
    info = machine_type_info(pool["machine_spec"]["machine_type"])
    return info.accelerator_count if info else 8


def layout_of(pool):
    """The machine type's GPU fabric (clusters/data/machine_types.json `fabric`), "" for none."""
    info = machine_type_info(pool["machine_spec"]["machine_type"])
    return info.fabric if info else ""


def nets(cloud, layout):
    """The extra VPCs of `layout` for this cluster, in NIC order after nic0 (the cluster's own VPC). The
    RDMA VPC has a subnet per MRDMA NIC of the cluster's largest RDMA machine type."""
    prefix = cloud.n.prefix
    if layout in GPU_NICS:
        found = [
            Net(f"{prefix}-gpu{i}", TCPXO_MTU, [(f"{prefix}-gpu{i}-sub", f"100.{64 + i}.0.0/16")])
            for i in range(GPU_NICS[layout])
        ]
    elif layout == "rdma":
        profile = rdma_profile(cloud.project, cloud.zone)
        found = [
            Net(f"{prefix}-net2", RDMA_MTU, [(f"{prefix}-net2-sub", "100.72.0.0/16")]),
            Net(
                f"{prefix}-rdma",
                RDMA_MTU,
                [(f"{prefix}-rdma-sub{i}", f"100.{80 + i}.0.0/16") for i in range(rdma_subnets(cloud))],
                nic_type="MRDMA",
                profile=profile,
            ),
        ]
    else:
        return []
    for net in found:
        net.internal_firewall = "" if net.profile else f"{net.name}-internal"
    return found


def rdma_subnets(cloud):
    return max((rdma_nics(pool) for pool in cloud.compute_pools if layout_of(pool) == "rdma"), default=8)


def cluster_nets(cloud):
    """Every extra VPC the cluster's compute pools need (each layout once); none on an existing VPC."""
    if not cloud.network_block.get("create"):
        return []
    layouts = sorted({layout_of(pool) for pool in cloud.compute_pools} - {""})
    return [net for layout in layouts for net in nets(cloud, layout)]


def extra_interfaces(cloud, pool):
    """NICs 1..n of a compute node of `pool` (nic0 is the cluster's VPC)."""
    from google.cloud import compute_v1

    if not cloud.network_block.get("create"):
        return []
    found = []
    for net in nets(cloud, layout_of(pool)):
        subnets = net.subnets[: rdma_nics(pool)] if net.nic_type == "MRDMA" else net.subnets
        for subnet, _cidr in subnets:
            found.append(
                compute_v1.NetworkInterface(
                    network=f"projects/{cloud.project}/global/networks/{net.name}",
                    subnetwork=f"projects/{cloud.project}/regions/{cloud.region}/subnetworks/{subnet}",
                    nic_type=net.nic_type,
                )
            )
    return found


def create_fabric(cloud):
    """The extra VPCs, their subnets and a firewall rule admitting the cluster's own VMs on each (but the
    RDMA VPC, which takes none)."""
    from google.cloud import compute_v1

    for net in cluster_nets(cloud):
        network = compute_v1.Network(
            name=net.name, auto_create_subnetworks=False, mtu=net.mtu, description=cloud.description
        )
        if net.profile:
            network.network_profile = net.profile
        cloud.ensure(
            f"network {net.name}",
            lambda n=net: cloud.c.networks.get(project=cloud.project, network=n.name),
            lambda r=network: cloud.c.networks.insert_unary(project=cloud.project, network_resource=r),
        )
        url = f"projects/{cloud.project}/global/networks/{net.name}"
        for subnet, cidr in net.subnets:
            resource = compute_v1.Subnetwork(
                name=subnet, network=url, ip_cidr_range=cidr, description=cloud.description
            )
            cloud.ensure(
                f"subnetwork {subnet}",
                lambda s=subnet: cloud.c.subnetworks.get(project=cloud.project, region=cloud.region, subnetwork=s),
                lambda r=resource: cloud.c.subnetworks.insert_unary(
                    project=cloud.project, region=cloud.region, subnetwork_resource=r
                ),
            )
        if not net.internal_firewall:
            continue
        rule = compute_v1.Firewall(
            name=net.internal_firewall,
            network=url,
            source_tags=[cloud.n.cluster_tag],
            target_tags=[cloud.n.cluster_tag],
            allowed=[compute_v1.Allowed(I_p_protocol="all")],
            description=cloud.description,
        )
        cloud.ensure(
            f"firewall rule {rule.name}",
            lambda r=rule: cloud.c.firewalls.get(project=cloud.project, firewall=r.name),
            lambda r=rule: cloud.c.firewalls.insert_unary(project=cloud.project, firewall_resource=r),
        )


def delete_fabric(cloud):
    for net in reversed(cluster_nets(cloud)):
        if net.internal_firewall:
            cloud.remove(
                f"firewall rule {net.internal_firewall}",
                lambda n=net: cloud.c.firewalls.get(project=cloud.project, firewall=n.internal_firewall),
                lambda n=net: cloud.c.firewalls.delete_unary(project=cloud.project, firewall=n.internal_firewall),
            )
        for subnet, _cidr in net.subnets:
            cloud.remove(
                f"subnetwork {subnet}",
                lambda s=subnet: cloud.c.subnetworks.get(project=cloud.project, region=cloud.region, subnetwork=s),
                lambda s=subnet: cloud.c.subnetworks.delete_unary(
                    project=cloud.project, region=cloud.region, subnetwork=s
                ),
            )
        cloud.remove(
            f"network {net.name}",
            lambda n=net: cloud.c.networks.get(project=cloud.project, network=n.name),
            lambda n=net: cloud.c.networks.delete_unary(project=cloud.project, network=n.name),
        )
