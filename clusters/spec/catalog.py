"""Machine types and regions the spec may name, read from clusters/data/machine_types.json."""

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
ACCELERATORS = DATA / "accelerators.json"  # per GPU: memory, dense peaks, host link (with sources)

# The regions the managed service offers (its public "Create cluster" page; see shared reference).
REGIONS = (
    "us-central1",
    "us-east1",
    "us-east4",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west4",
    "asia-southeast1",
    "europe-west1",
    "europe-west4",
    "europe-north1",
)


# Zones of each region (Compute Engine "Regions and zones" page, read 2026-12-02).
ZONES = {
    "us-central1": ("a", "b", "c", "f"),
    "us-east1": ("b", "c", "d"),
    "us-east4": ("a", "b", "c"),
    "us-east5": ("a", "b", "c"),
    "us-south1": ("a", "b", "c"),
    "us-west1": ("a", "b", "c"),
    "us-west4": ("a", "b", "c"),
    "asia-southeast1": ("a", "b", "c"),
    "europe-west1": ("b", "c", "d"),
    "europe-west4": ("a", "b", "c"),
    "europe-north1": ("a", "b", "c"),
}


def machine_type_names():
    """Every machine type the console knows, GPU types first, for pickers."""
    data = _catalog()
    names = list(data["fixed"])
    for family, shape in data["families"].items():
        for kind in ("standard", "highmem", "highcpu"):
            if kind in shape:
                names += [f"{family}-{kind}-{n}" for n in shape["vcpus"]]
    return names


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: int
    accelerator_type: str = ""
    accelerator_count: int = 0
    hyperdisk_only: bool = False  # boots from Hyperdisk only
    reservation_bound: bool = False  # reserved as RESERVATION_BOUND VMs
    fabric: str = ""  # the GPU network beside the system NIC: tcpx, tcpxo or rdma
    gpu_nic_gbps: int = 0  # line rate of the NIC each GPU sends through to other nodes; 0: not recorded
    architecture: str = "X86_64"  # the CPU's (ARM64 for A4X): a boot image must be of the same


@cache
def _catalog():
    return json.loads((DATA / "machine_types.json").read_text())


def machine_type_info(name):
    """The machine type's shape, or None when it is not one the console knows."""
    data = _catalog()
    if name in data["fixed"]:
        return MachineType(name=name, **data["fixed"][name])
    match = re.fullmatch(r"(?P<family>[a-z0-9]+)-(?P<kind>standard|highmem|highcpu)-(?P<vcpus>\d+)", name)
    if not match:
        return None
    family = data["families"].get(match["family"])
    vcpus = int(match["vcpus"])
    if not family or match["kind"] not in family or vcpus not in family["vcpus"]:
        return None
    return MachineType(name=name, vcpus=vcpus, memory_gb=vcpus * family[match["kind"]])


@cache
def accelerator_info(accelerator_type):
    """The GPU's figures ({"name", "memory_gb", "bf16_tflops", "host_to_device_gbps", ...}) or None."""
    return json.loads(ACCELERATORS.read_text()).get(accelerator_type) if accelerator_type else None


def machine_fabric(name):
    """The machine type's GPU network (rdma, tcpxo, tcpx), or "" for none or a type the console does not know."""
    info = machine_type_info(name)
    return info.fabric if info else ""


@cache
def nccl_networks():
    """How jobs set NCCL up on each GPU network, and the images that bring its plugin (nccl.json)."""
    return json.loads((DATA / "nccl.json").read_text())
