"""Reference architectures (clusters/data/reference_architectures.json) and the specs built from them."""

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .catalog import machine_type_info

DATA = Path(__file__).resolve().parent.parent / "data" / "reference_architectures.json"
REQUIRED = {
    "id",
    "name",
    "summary",
    "source",
    "machine_type",
    "partition",
    "default_nodes",
    "boot_disk",
    "login",
    "network",
    "storage",
    "slurm",
}


@dataclass(frozen=True)
class Architecture:
    id: str
    name: str
    summary: str
    source: str
    data: dict


@cache
def architectures():
    """{id: Architecture}, checked on load so a broken data file fails loudly at start, not mid-wizard."""

    items = {}
    for entry in json.loads(DATA.read_text())["architectures"]:
        missing = REQUIRED - set(entry)
        if missing:
            raise ValueError(f"reference architecture {entry.get('id')!r} lacks {sorted(missing)}")
        for machine in [
            entry["machine_type"],
            entry["login"]["machine_type"],
            *[p["machine_type"] for p in entry.get("extra_pools", [])],
        ]:
            if machine_type_info(machine) is None:
                raise ValueError(f"reference architecture {entry['id']!r} names unknown machine type {machine!r}")
        items[entry["id"]] = Architecture(entry["id"], entry["name"], entry["summary"], entry["source"], entry)
    return items


def build_spec(arch_id, *, display_name, zone, nodes, provisioning_model="ON_DEMAND", reservation="", backend="local"):
    """The full cluster spec for a reference architecture and the few values the user chose."""

    arch = architectures()[arch_id].data
    machine = machine_type_info(arch["machine_type"])
    machine_spec = {"machine_type": machine.name}
    if machine.accelerator_type:
        machine_spec.update(accelerator_type=machine.accelerator_type, accelerator_count=machine.accelerator_count)
    if provisioning_model == "RESERVATION":
        machine_spec["reservation_affinity"] = {
            "reservation_affinity_type": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        }
    main = {
        "id": arch["partition"],
        "machine_spec": machine_spec,
        "provisioning_model": provisioning_model,
        "scaling_spec": {"min_node_count": nodes, "max_node_count": nodes},
        "zone": zone,
        "enable_public_ips": False,
        "boot_disk": dict(arch["boot_disk"]),
    }
    login = {
        "id": "login",
        "machine_spec": {"machine_type": arch["login"]["machine_type"]},
        "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
        "zone": zone,
        "enable_public_ips": True,
        "boot_disk": dict(arch["login"]["boot_disk"]),
    }
    extra = [
        {
            "id": p["id"],
            "machine_spec": {"machine_type": p["machine_type"]},
            "provisioning_model": "ON_DEMAND",
            "scaling_spec": {"min_node_count": p["nodes"], "max_node_count": p["nodes"]},
            "zone": zone,
            "enable_public_ips": False,
        }
        for p in arch.get("extra_pools", [])
    ]
    region = zone.rsplit("-", 1)[0]
    storage = {k: v for k, v in arch["storage"].items() if k != "gcs_buckets"}
    storage["gcs_buckets"] = [
        {
            "bucket": f"{display_name}-{b['suffix']}",
            "mount_point": b["mount_point"],
            "mount_options": b["mount_options"],
        }
        for b in arch["storage"].get("gcs_buckets", [])
    ]
    network = {k: v for k, v in arch["network"].items() if k != "nic_layout"}
    return {
        "display_name": display_name,
        "network": {
            "network": f"{display_name}-net",
            "subnetwork": f"projects/-/regions/{region}/subnetworks/{display_name}-subnet",
        },
        "node_pools": [login, main, *extra],
        "orchestrator_spec": {
            "slurm_spec": {
                "partitions": [{"id": p["id"], "node_pool_ids": [p["id"]]} for p in [main, *extra]],
                "login_node_pool_id": "login",
                **arch["slurm"],
            }
        },
        "console": {"backend": backend, "network": {"create": True, **network}, "storage": storage},
    }
