"""The step-by-step wizard: each step reads its form into the draft's spec and claims its errors.

A draft cluster's spec is the wizard's only state, so reload, back/forward and a second tab see the
same thing. Form field names are the ids of the error spans beside them, so an error routed to a
field key lands next to that field.
"""

import copy
import re

from .spec.catalog import machine_type_info

STEPS = [
    ("basics", "Basics"),
    ("compute", "Compute"),
    ("login", "Login node"),
    ("network", "Network"),
    ("storage", "Storage"),
    ("slurm", "Slurm"),
    ("review", "Review"),
]
STEP_NAMES = [s for s, _ in STEPS]
SLURM = "orchestrator_spec.slurm_spec"


def skeleton_spec(display_name, zone="us-central1-a", backend="local"):
    """A small valid starting point: a login node and a two-node CPU partition."""
    return {
        "display_name": display_name,
        "network": {"network": f"{display_name}-net", "subnetwork": f"{display_name}-subnet"},
        "node_pools": [
            pool_spec("login", "n2-standard-4", 1, zone, public_ips=True),
            pool_spec("cpu", "n2-standard-8", 2, zone),
        ],
        "orchestrator_spec": {
            "slurm_spec": {"partitions": [{"id": "cpu", "node_pool_ids": ["cpu"]}], "login_node_pool_id": "login"}
        },
        "console": {"backend": backend, "network": {"create": True, "mtu": 1460, "subnet_range": "10.0.0.0/16"}},
    }


def pool_spec(pool_id, machine_type, count, zone, public_ips=False):
    return {
        "id": pool_id,
        "machine_spec": machine_spec(machine_type),
        "provisioning_model": "ON_DEMAND",
        "scaling_spec": {"min_node_count": count, "max_node_count": count},
        "zone": zone,
        "enable_public_ips": public_ips,
        "boot_disk": {"boot_disk_type": "pd-balanced", "boot_disk_size_gb": 100},
    }


def machine_spec(machine_type, reservation=""):
    """A machine_spec whose accelerators follow from the machine type, as the service requires."""
    spec = {"machine_type": machine_type}
    info = machine_type_info(machine_type)
    if info and info.accelerator_type:
        spec.update(accelerator_type=info.accelerator_type, accelerator_count=info.accelerator_count)
    if reservation:
        spec["reservation_affinity"] = {
            "reservation_affinity_type": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        }
    return spec


def number(value):
    """An int when the text is one, else the text itself so the validator can name the field."""
    value = (value or "").strip()
    return int(value) if value.isdigit() else value


def login_index(spec):
    login = spec.get("orchestrator_spec", {}).get("slurm_spec", {}).get("login_node_pool_id")
    return next((i for i, p in enumerate(spec.get("node_pools", [])) if p.get("id") == login), None)


def compute_indices(spec):
    login = login_index(spec)
    return [i for i in range(len(spec.get("node_pools", []))) if i != login]


def zone_of(spec):
    return next((p.get("zone") for p in spec.get("node_pools", []) if p.get("zone")), "us-central1-a")


# -- reading each step's form into the spec ----------------------------------------------------


def read_basics(spec, form):
    spec["display_name"] = form.get("display_name", "").strip()
    zone = form.get("zone", "").strip()
    for pool in spec.setdefault("node_pools", []):
        pool["zone"] = zone
    spec.setdefault("console", {})["backend"] = form.get("backend", "local")
    return spec


def read_compute(spec, form):
    pools = spec.get("node_pools", [])
    login = login_index(spec)
    rows = []
    for i in [int(x) for x in form.getlist("pools") if x.isdigit()]:
        old = pools[i] if i < len(pools) else {}
        model = form.get(f"pool-{i}-model", "ON_DEMAND")
        reservation = form.get(f"pool-{i}-reservation", "").strip() if model == "RESERVATION" else ""
        pool = {
            **old,
            "id": form.get(f"pool-{i}-id", "").strip(),
            "machine_spec": machine_spec(form.get(f"pool-{i}-machine", ""), reservation),
            "provisioning_model": model,
            "scaling_spec": {
                "min_node_count": number(form.get(f"pool-{i}-count")),
                "max_node_count": number(form.get(f"pool-{i}-count")),
            },
            "zone": zone_of(spec),
            "boot_disk": {
                "boot_disk_type": form.get(f"pool-{i}-disk_type", "pd-balanced"),
                "boot_disk_size_gb": number(form.get(f"pool-{i}-disk_size")),
            },
        }
        rows.append((pool, form.get(f"pool-{i}-partition", "").strip() or pool["id"]))
    action = form.get("action", "")
    if action == "add":
        taken = {p["id"] for p, _ in rows}
        new_id = next(f"pool{n}" for n in range(1, 100) if f"pool{n}" not in taken)
        rows.append((pool_spec(new_id, "n2-standard-8", 1, zone_of(spec)), new_id))
    elif action.startswith("remove-"):
        position = int(action.split("-")[1])
        rows = [r for k, r in enumerate(rows) if k != position]
    elif action.startswith("up-"):
        position = int(action.split("-")[1])
        if 0 < position < len(rows):
            rows[position - 1], rows[position] = rows[position], rows[position - 1]
    partitions = {}
    for pool, partition in rows:
        partitions.setdefault(partition, []).append(pool["id"])
    login_pool = [pools[login]] if login is not None else []
    spec["node_pools"] = login_pool + [pool for pool, _ in rows]
    spec.setdefault("orchestrator_spec", {}).setdefault("slurm_spec", {})["partitions"] = [
        {"id": name, "node_pool_ids": ids} for name, ids in partitions.items()
    ]
    return spec


def read_login(spec, form):
    index = login_index(spec)
    if index is None:
        spec.setdefault("node_pools", []).insert(0, pool_spec("login", "n2-standard-4", 1, zone_of(spec), True))
        spec.setdefault("orchestrator_spec", {}).setdefault("slurm_spec", {})["login_node_pool_id"] = "login"
        index = 0
    pool = spec["node_pools"][index]
    count = number(form.get("login-count"))
    pool.update(
        machine_spec=machine_spec(form.get("login-machine", "")),
        scaling_spec={"min_node_count": count, "max_node_count": count},
        enable_public_ips=form.get("login-public_ips") == "on",
        boot_disk={
            "boot_disk_type": form.get("login-disk_type", "pd-balanced"),
            "boot_disk_size_gb": number(form.get("login-disk_size")),
        },
    )
    return spec


def read_network(spec, form):
    create = form.get("net-mode", "create") == "create"
    spec["network"] = {
        "network": form.get("net-network", "").strip(),
        "subnetwork": form.get("net-subnetwork", "").strip(),
    }
    network = {"create": create}
    if create:
        network.update(mtu=number(form.get("net-mtu")), subnet_range=form.get("net-subnet_range", "").strip())
        if form.get("net-private_services_range", "").strip():
            network["private_services_range"] = form.get("net-private_services_range", "").strip()
    spec.setdefault("console", {})["network"] = network
    return spec


def read_storage(spec, form):
    storage = {}
    slurm = spec.setdefault("orchestrator_spec", {}).setdefault("slurm_spec", {})
    mode = form.get("home-mode", "none")
    slurm.pop("home_directory_storage", None)
    if mode == "create":
        storage["filestore_home"] = {
            "tier": form.get("home-tier", ""),
            "capacity_gb": number(form.get("home-capacity_gb")),
        }
    elif mode == "existing":
        slurm["home_directory_storage"] = form.get("home-existing", "").strip()
    if form.get("lustre-enabled") == "on":
        storage["lustre"] = {
            "performance_tier": number(form.get("lustre-performance_tier")),
            "capacity_gb": number(form.get("lustre-capacity_gb")),
            "mount_point": form.get("lustre-mount_point", "/lustre").strip(),
        }
    buckets = []
    for j in [int(x) for x in form.getlist("buckets") if x.isdigit()]:
        options = [o.strip() for o in form.get(f"gcs-{j}-mount_options", "").split(",") if o.strip()]
        buckets.append(
            {
                "bucket": form.get(f"gcs-{j}-bucket", "").strip(),
                "mount_point": form.get(f"gcs-{j}-mount_point", "").strip(),
                "mount_options": options,
            }
        )
    action = form.get("action", "")
    if action == "add-bucket":
        buckets.append({"bucket": "", "mount_point": f"/gcs-{len(buckets) + 1}", "mount_options": ["implicit-dirs"]})
    elif action.startswith("remove-bucket-"):
        position = int(action.rsplit("-", 1)[1])
        buckets = [b for k, b in enumerate(buckets) if k != position]
    if buckets:
        storage["gcs_buckets"] = buckets
    spec.setdefault("console", {})["storage"] = storage
    return spec


def read_slurm(spec, form):
    slurm = spec.setdefault("orchestrator_spec", {}).setdefault("slurm_spec", {})
    enforce = form.get("slurm-accounting_storage_enforce", "").strip()
    slurm["accounting"] = {"accounting_storage_enforce": enforce} if enforce else {}
    scheduling = {}
    for key in ("priority_type", "preempt_type", "preempt_mode", "preempt_exempt_time"):
        value = form.get(f"slurm-{key}", "").strip()
        if value:
            scheduling[key] = value
    for key in (
        "priority_weight_age",
        "priority_weight_fairshare",
        "priority_weight_job_size",
        "priority_weight_partition",
        "priority_weight_qos",
    ):
        value = form.get(f"slurm-{key}", "").strip()
        if value:
            scheduling[key] = number(value)
    slurm["scheduling"] = scheduling
    for key in ("prolog", "epilog"):
        text = form.get(f"slurm-{key}", "").replace("\r\n", "\n").strip()
        slurm[f"{key}_bash_scripts"] = [text] if text else []
    return spec


READERS = {
    "basics": read_basics,
    "compute": read_compute,
    "login": read_login,
    "network": read_network,
    "storage": read_storage,
    "slurm": read_slurm,
}


def apply_form(step, spec, form):
    return READERS[step](copy.deepcopy(spec), form)


# -- routing validator errors to steps and fields ---------------------------------------------

POOL = re.compile(r"^node_pools\[(\d+)\](?:\.(\w+))?")


def route(path, spec):
    """(step, field key) for an error path; the key is None when no single field owns it."""
    if path == "cluster_id":
        return "basics", "cluster_id"
    if path == "display_name":
        return "basics", "display_name"
    if path == "console.backend":
        return "basics", "backend"
    match = POOL.match(path)
    if match:
        index, part = int(match[1]), match[2]
        if part == "zone":
            return "basics", "zone"
        prefix = "login" if index == login_index(spec) else f"pool-{index}"
        step = "login" if index == login_index(spec) else "compute"
        field = {
            "id": "id",
            "machine_spec": "reservation" if "reservation" in path else "machine",
            "scaling_spec": "count",
            "provisioning_model": "model",
            "boot_disk": "disk_size" if path.endswith("size_gb") else "disk_type",
        }.get(part)
        if step == "login" and field in ("id", "model", "reservation"):
            field = None
        return step, f"{prefix}-{field}" if field else None
    if path.startswith(("network", "console.network")):
        return "network", "net-" + path.rsplit(".", 1)[1]
    if path.startswith("console.storage.filestore_home"):
        return "storage", "home-" + path.rsplit(".", 1)[1]
    if path.startswith("console.storage.lustre"):
        return "storage", "lustre-" + path.rsplit(".", 1)[1]
    bucket = re.match(r"^console\.storage\.gcs_buckets\[(\d+)\]\.(\w+)", path)
    if bucket:
        return "storage", f"gcs-{bucket[1]}-{bucket[2]}"
    if path.startswith("console.storage"):
        return "storage", None
    if path == f"{SLURM}.home_directory_storage":
        return "storage", "home-existing"
    slurm = re.match(rf"^{re.escape(SLURM)}\.(accounting|scheduling)\.(\w+)", path)
    if slurm:
        return "slurm", f"slurm-{slurm[2]}"
    if re.match(rf"^{re.escape(SLURM)}\.(prolog|epilog)", path):
        return "slurm", "slurm-" + ("prolog" if "prolog" in path else "epilog")
    if path.startswith(f"{SLURM}.login_node_pool_id"):
        return "login", None
    if path.startswith(f"{SLURM}.partitions") or path == "node_pools":
        return "compute", None
    return "review", None


def errors_by_step(errors, spec):
    """{step: {"fields": {key: [messages]}, "other": [(path, message)]}} for every error."""
    result = {name: {"fields": {}, "other": []} for name in STEP_NAMES}
    for path, messages in errors.items():
        step, key = route(path, spec)
        for message in messages:
            if key:
                messages_here = result[step]["fields"].setdefault(key, [])
                if message not in messages_here:  # min and max node count share one field
                    messages_here.append(message)
            else:
                result[step]["other"].append((path, message))
    return result


def step_field_keys(step, spec):
    """Every field key the step's form shows, so a live check can clear the spans that are fine now."""
    if step == "basics":
        return ["cluster_id", "display_name", "zone", "backend"]
    if step == "compute":
        return [
            f"pool-{i}-{f}"
            for i in compute_indices(spec)
            for f in ("id", "machine", "count", "model", "reservation", "disk_type", "disk_size")
        ]
    if step == "login":
        return ["login-machine", "login-count", "login-disk_type", "login-disk_size"]
    if step == "network":
        return ["net-network", "net-subnetwork", "net-mtu", "net-subnet_range", "net-private_services_range"]
    if step == "storage":
        buckets = (spec.get("console") or {}).get("storage", {}).get("gcs_buckets", [])
        keys = [
            "home-tier",
            "home-capacity_gb",
            "home-existing",
            "lustre-performance_tier",
            "lustre-capacity_gb",
            "lustre-mount_point",
        ]
        return keys + [f"gcs-{j}-{f}" for j in range(len(buckets)) for f in ("bucket", "mount_point", "mount_options")]
    if step == "slurm":
        return [
            "slurm-accounting_storage_enforce",
            "slurm-priority_type",
            "slurm-preempt_type",
            "slurm-preempt_mode",
            "slurm-preempt_exempt_time",
            "slurm-priority_weight_age",
            "slurm-priority_weight_fairshare",
            "slurm-priority_weight_job_size",
            "slurm-priority_weight_partition",
            "slurm-priority_weight_qos",
            "slurm-prolog",
            "slurm-epilog",
        ]
    return []


def compute_rows(spec):
    """The compute step's rows: one per compute pool, with its partition."""
    partition_of = {}
    for partition in spec.get("orchestrator_spec", {}).get("slurm_spec", {}).get("partitions", []):
        for pool_id in partition.get("node_pool_ids", []):
            partition_of.setdefault(pool_id, partition.get("id", ""))
    rows = []
    for i in compute_indices(spec):
        pool = spec["node_pools"][i]
        machine = pool.get("machine_spec", {})
        affinity = machine.get("reservation_affinity") or {}
        rows.append(
            {
                "index": i,
                "id": pool.get("id", ""),
                "machine": machine.get("machine_type", ""),
                "accelerators": f"{machine['accelerator_count']} x {machine['accelerator_type']}"
                if machine.get("accelerator_type")
                else "none",
                "count": pool.get("scaling_spec", {}).get("min_node_count", ""),
                "model": pool.get("provisioning_model", "ON_DEMAND"),
                "reservation": (affinity.get("values") or [""])[0],
                "disk_type": pool.get("boot_disk", {}).get("boot_disk_type", "pd-balanced"),
                "disk_size": pool.get("boot_disk", {}).get("boot_disk_size_gb", 100),
                "partition": partition_of.get(pool.get("id"), ""),
            }
        )
    return rows
