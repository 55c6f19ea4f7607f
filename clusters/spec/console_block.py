"""The console's own extension block, `console` in a spec: backend, network to create, storage to create.

    "console": {
      "backend": "local",
      "network": {"create": true, "mtu": 8896, "subnet_range": "10.0.0.0/16",
                  "private_services_range": "10.100.0.0/20", "cloud_nat": false},
      "storage": {
        "filestore_home": {"tier": "HIGH_SCALE_SSD", "capacity_gb": 10240},
        "lustre": {"performance_tier": 500, "capacity_gb": 36000, "mount_point": "/lustre"},
        "gcs_buckets": [{"bucket": "my-ckpts", "mount_point": "/gcs-checkpoints",
                         "mount_options": ["implicit-dirs", "file-cache:max-size-mb:-1"]}]
      }
    }

The managed service ignores nothing silently, and neither does this block: unknown keys are errors.
"""

import ipaddress
import json
import re
from functools import cache
from pathlib import Path

from .catalog import machine_type_info

CONSOLE = {"backend", "network", "storage"}
NETWORK = {"create", "mtu", "subnet_range", "private_services_range", "cloud_nat"}
STORAGE = {"filestore_home", "lustre", "gcs_buckets"}
MTUS = (1460, 1500, 8896)
# GPUDirect-TCPX(O)'s receive-datapath manager (A3 High / Edge 8-GPU, A3 Mega) runs in Docker, whose
# bridges take 172.16.0.0/12 (Docker's default address pools): the node's own subnets must stay out of it.
DOCKER_FABRICS = ("tcpx", "tcpxo")  # machine_types.json `fabric`
DOCKER_BRIDGES = ipaddress.ip_network("172.16.0.0/12")
BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]\Z")
MOUNT_POINT = re.compile(r"/[A-Za-z0-9._/-]*\Z")
DATA = Path(__file__).resolve().parent.parent / "data"


@cache
def storage_tiers():
    return json.loads((DATA / "storage_tiers.json").read_text())


def validate_console_block(errors, value, spec, *, expect_object, expect_list, expect_int):
    block = expect_object(errors, value, "console", CONSOLE)
    network = expect_object(errors, block.get("network"), "console.network", NETWORK)
    storage = expect_object(errors, block.get("storage"), "console.storage", STORAGE)
    validate_network_block(errors, network, spec, expect_int)
    mounts = {}
    home = storage.get("filestore_home")
    if home is not None:
        validate_filestore(
            errors, expect_object(errors, home, "console.storage.filestore_home", {"tier", "capacity_gb"}), expect_int
        )
    lustre = storage.get("lustre")
    if lustre is not None:
        lustre = expect_object(
            errors, lustre, "console.storage.lustre", {"performance_tier", "capacity_gb", "mount_point"}
        )
        validate_lustre(errors, lustre, expect_int)
        add_mount(errors, mounts, lustre.get("mount_point", "/lustre"), "console.storage.lustre.mount_point")
    for i, bucket in enumerate(expect_list(errors, storage.get("gcs_buckets"), "console.storage.gcs_buckets")):
        path = f"console.storage.gcs_buckets[{i}]"
        bucket = expect_object(
            errors, bucket, path, {"bucket", "mount_point", "mount_options"}, required=("bucket", "mount_point")
        )
        name = bucket.get("bucket")
        if name and (not isinstance(name, str) or not BUCKET.match(name)):
            errors.add(
                f"{path}.bucket", "must be a bucket name: 3-63 lowercase letters, digits, dots, hyphens, underscores"
            )
        if bucket.get("mount_point"):
            add_mount(errors, mounts, bucket["mount_point"], f"{path}.mount_point")
        options = expect_list(errors, bucket.get("mount_options"), f"{path}.mount_options")
        for j, option in enumerate(options):
            if not isinstance(option, str) or not option or " " in option:
                errors.add(f"{path}.mount_options[{j}]", "must be one gcsfuse option without spaces")
    if (home is not None or lustre is not None) and network.get("create") and not network.get("private_services_range"):
        errors.add(
            "console.network.private_services_range",
            "is required to create Filestore or Managed Lustre (they connect through private services access)",
        )


def validate_network_block(errors, network, spec, expect_int):
    if not network:
        return
    create = network.get("create", False)
    if not isinstance(create, bool):
        errors.add("console.network.create", "must be true or false")
    nat = network.get("cloud_nat", False)
    if not isinstance(nat, bool):
        errors.add("console.network.cloud_nat", "must be true or false")
    elif nat and create is False:
        errors.add(
            "console.network.cloud_nat", "the console adds Cloud NAT only to a network it creates (create: true)"
        )
    mtu = network.get("mtu")
    if mtu is not None:
        mtu = expect_int(errors, mtu, "console.network.mtu")
        if mtu is not None and mtu not in MTUS:
            errors.add("console.network.mtu", f"must be one of {', '.join(map(str, MTUS))}")
    ranges = {}
    for key in ("subnet_range", "private_services_range"):
        if key in network:
            ranges[key] = parse_range(errors, network[key], f"console.network.{key}")
    if create and "subnet_range" not in network:
        errors.add("console.network.subnet_range", "is required when the console creates the network")
    psa = ranges.get("private_services_range")
    if psa is not None and not 16 <= psa.prefixlen <= 24:
        errors.add("console.network.private_services_range", "must be a /16 to /24 range")
    subnet = ranges.get("subnet_range")
    if subnet is not None and psa is not None and subnet.overlaps(psa):
        errors.add("console.network.private_services_range", f"overlaps the subnet range {subnet}")
    docker = [
        info.name
        for p in spec.get("node_pools") or []
        if isinstance(p, dict) and isinstance(p.get("machine_spec"), dict)
        and isinstance(p["machine_spec"].get("machine_type"), str)
        and (info := machine_type_info(p["machine_spec"]["machine_type"])) and info.fabric in DOCKER_FABRICS
    ]  # fmt: skip
    if subnet is not None and docker and subnet.overlaps(DOCKER_BRIDGES):
        errors.add("console.network.subnet_range", f"{docker[0]} nodes run Docker, whose bridges use "
                                                   f"{DOCKER_BRIDGES}: choose a range outside it")  # fmt: skip
    if not create and not (spec.get("network") or {}).get("network"):
        errors.add("network.network", "name an existing VPC network, or set console.network.create to true")


def parse_range(errors, value, path):
    try:
        network = ipaddress.ip_network(value, strict=True)
    except (TypeError, ValueError):
        errors.add(path, "must be a CIDR range such as 10.0.0.0/16")
        return None
    if network.version != 4 or not network.is_private:
        errors.add(path, "must be a private IPv4 range (RFC 1918)")
        return None
    return network


def validate_filestore(errors, home, expect_int):
    tiers = storage_tiers()["filestore"]
    tier = home.get("tier")
    if not isinstance(tier, str) or tier not in tiers:
        errors.add("console.storage.filestore_home.tier", f"must be one of: {', '.join(tiers)}")
        return
    size = expect_int(errors, home.get("capacity_gb"), "console.storage.filestore_home.capacity_gb", minimum=1)
    limits = tiers[tier]
    if size is not None and not limits["min_gb"] <= size <= limits["max_gb"]:
        errors.add(
            "console.storage.filestore_home.capacity_gb",
            f"{tier} holds {limits['min_gb']:,} to {limits['max_gb']:,} GB",
        )


def validate_lustre(errors, lustre, expect_int):
    tiers = storage_tiers()["lustre"]
    tier = lustre.get("performance_tier")
    tier = str(tier) if isinstance(tier, (int, str)) and not isinstance(tier, bool) else None
    if tier is None or tier not in tiers:
        errors.add("console.storage.lustre.performance_tier", f"must be one of {', '.join(tiers)} (MB/s per TiB)")
        return
    size = expect_int(errors, lustre.get("capacity_gb"), "console.storage.lustre.capacity_gb", minimum=1)
    if size is None:
        return
    limits = tiers[tier]
    if not limits["min_gb"] <= size <= limits["max_gb"]:
        errors.add(
            "console.storage.lustre.capacity_gb",
            f"the {tier} MB/s per TiB tier holds {limits['min_gb']:,} to {limits['max_gb']:,} GiB",
        )
        return
    step = next(step for upto, step in limits["steps"] if size <= upto)
    if size % step:
        errors.add("console.storage.lustre.capacity_gb", f"must be a multiple of {step:,} GiB at this size")


def add_mount(errors, mounts, mount_point, path):
    if not isinstance(mount_point, str) or not MOUNT_POINT.match(mount_point) or mount_point in ("/", "/home"):
        errors.add(path, "must be an absolute path other than / and /home")
    elif mount_point in mounts:
        errors.add(path, f"{mount_point} is already the mount point of {mounts[mount_point]}")
    else:
        mounts[mount_point] = path
