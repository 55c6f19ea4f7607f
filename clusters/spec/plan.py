"""What a spec costs per hour (from clusters/data/prices.json) and the project quota check."""

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..choices import ClusterStatus
from .catalog import machine_type_info
from .validator import pool_node_count

PRICES = Path(__file__).resolve().parent.parent / "data" / "prices.json"


@dataclass
class CostLine:
    item: str
    quantity: str
    per_hour: float | None  # None: no price in the table


@dataclass
class QuotaLine:
    resource: str
    in_use: int
    requested: int
    limit: int | None

    @property
    def ok(self):
        return self.limit is None or self.in_use + self.requested <= self.limit


@cache
def prices():
    return json.loads(PRICES.read_text())


def login_pool_id(spec):
    return spec.get("orchestrator_spec", {}).get("slurm_spec", {}).get("login_node_pool_id")


def machine_price(machine, model):
    table = prices()
    info = machine_type_info(machine)
    if info is None:
        return None
    spot = model in ("SPOT", "FLEX_START")
    fixed = table["machine_types"].get(machine)
    if fixed:
        return fixed["spot_per_hour"] if spot else fixed["on_demand_per_hour"]
    family = table["families"].get(machine.split("-")[0])
    if not family:
        return None
    price = info.vcpus * family["vcpu_per_hour"] + info.memory_gb * family["gb_per_hour"]
    return price * family["spot_factor"] if spot else price


def cost(spec):
    """(lines, total per hour) for the spec's machines, boot disks and storage."""
    table = prices()
    hours = table["hours_per_month"]
    lines = []
    for pool in spec.get("node_pools", []):
        count = pool_node_count(pool)
        machine = pool.get("machine_spec", {}).get("machine_type", "")
        model = pool.get("provisioning_model") or "ON_DEMAND"
        price = machine_price(machine, model)
        lines.append(
            CostLine(
                f"{pool.get('id')}: {machine} ({model.lower()})",
                f"{count} nodes",
                None if price is None else price * count,
            )
        )
        disk = pool.get("boot_disk") or {}
        disk_price = table["boot_disk_per_gb_month"].get(disk.get("boot_disk_type", "pd-balanced"))
        size = disk.get("boot_disk_size_gb") or 100
        if disk_price is not None and count:
            lines.append(
                CostLine(f"{pool.get('id')}: boot disks", f"{count} x {size} GB", disk_price * size * count / hours)
            )
    storage = (spec.get("console") or {}).get("storage") or {}
    home = storage.get("filestore_home")
    if home:
        per_gb = table["filestore_per_gb_month"].get(home.get("tier"))
        size = home.get("capacity_gb", 0)
        lines.append(
            CostLine(f"Filestore {home.get('tier')}", f"{size:,} GB", None if per_gb is None else per_gb * size / hours)
        )
    lustre = storage.get("lustre")
    if lustre:
        per_gb = table["lustre_per_gb_month"].get(str(lustre.get("performance_tier")))
        size = lustre.get("capacity_gb", 0)
        lines.append(
            CostLine(
                f"Managed Lustre {lustre.get('performance_tier')} MB/s/TiB",
                f"{size:,} GiB",
                None if per_gb is None else per_gb * size / hours,
            )
        )
    total = sum(line.per_hour for line in lines if line.per_hour is not None)
    return lines, total


def requested(spec):
    """(nodes, GPUs) the spec asks for. Login nodes count: on a cloud each is a VM like any other."""
    nodes = gpus = 0
    for pool in spec.get("node_pools", []):
        count = pool_node_count(pool)
        nodes += count
        machine = pool.get("machine_spec") if isinstance(pool.get("machine_spec"), dict) else {}
        accelerators = machine.get("accelerator_count")
        gpus += count * (accelerators if isinstance(accelerators, int) and not isinstance(accelerators, bool) else 0)
    return nodes, gpus


def quota(project, spec, exclude=None):
    """The project's node and GPU quota against what its live clusters hold and what `spec` asks for."""

    in_use_nodes = in_use_gpus = 0
    clusters = project.clusters.exclude(status__in=[ClusterStatus.DELETED, ClusterStatus.DRAFT])
    if exclude is not None:
        clusters = clusters.exclude(pk=exclude.pk)
    for other in clusters:
        n, g = requested(other.spec)
        in_use_nodes += n
        in_use_gpus += g
    nodes, gpus = requested(spec)
    return [
        QuotaLine("Nodes", in_use_nodes, nodes, project.node_quota),
        QuotaLine("GPUs", in_use_gpus, gpus, project.gpu_quota),
    ]
