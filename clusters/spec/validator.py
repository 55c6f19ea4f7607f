"""The one validator for cluster specs (the managed service's cluster JSON plus the console's block).

It serves the REST API, the compatible v1beta1 surface, the browser forms and the admin. Errors are
collected, never raised one at a time, and each names its field path (`node_pools[1].scaling_spec`).
"""

import re

from console.errors import FieldErrors

from .catalog import REGIONS, machine_type_info, machine_type_names
from .console_block import validate_console_block

# The service's accelerator types: those the catalog's machine types come with (clusters/data/).
ACCELERATOR_TYPES = tuple(
    dict.fromkeys(t.accelerator_type for t in map(machine_type_info, machine_type_names()) if t.accelerator_type)
)
PROVISIONING_MODELS = ("ON_DEMAND", "SPOT", "RESERVATION", "FLEX_START")
BOOT_DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced", "hyperdisk-extreme")
# \Z, not $: `$` also matches before a trailing newline, so "demo\n" would pass as an id.
DISPLAY_NAME = re.compile(r"[a-z][a-z0-9]{0,9}\Z")
RESOURCE_ID = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?\Z")
# RESOURCE_ID in words: every id the console takes (clusters, pools, partitions, models, endpoints) says this.
ID_RULE = "must be 1-63 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen"
ZONE = re.compile(r"(?P<region>[a-z]+-[a-z]+[0-9]+)-[a-z]\Z")
# Bounds that keep every number inside what the database and the clouds hold. Node counts per pool:
# the console's own sanity bound (the project quota is the real limit); boot disks: Compute Engine's
# largest persistent disk, 64 TiB (https://cloud.google.com/compute/docs/disks#pdspecs).
MAX_POOL_NODES = 10_000
MAX_BOOT_DISK_GB = 65_536
INT_MAX = 2**31 - 1

TOP_LEVEL = {
    "display_name",
    "network",
    "node_pools",
    "orchestrator_spec",
    "runtime_spec",
    "description",
    "labels",
    "console",
}
NODE_POOL = {
    "id",
    "machine_spec",
    "provisioning_model",
    "scaling_spec",
    "zone",
    "enable_public_ips",
    "boot_disk",
    "lustres",
    "filestores",
    "startup_script",
}
MACHINE_SPEC = {"machine_type", "accelerator_type", "accelerator_count", "reservation_affinity"}
SLURM_SPEC = {
    "partitions",
    "login_node_pool_id",
    "home_directory_storage",
    "accounting",
    "scheduling",
    "prolog_bash_scripts",
    "epilog_bash_scripts",
}


class SpecError(FieldErrors):
    """A spec that cannot be accepted; `errors` maps field paths in the spec to messages, with the
    request's own fields (the cluster id) beside them. /api/v1 nests the spec's under "spec"."""

    REQUEST_FIELDS = ("cluster_id",)

    def body(self):
        errors = dict(self.errors)
        body = {key: errors.pop(key) for key in self.REQUEST_FIELDS if key in errors}
        if errors:
            body["spec"] = errors
        return body


def snake_case(key):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def int_string(value):
    return isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19


# Map fields: their keys are the user's (label keys), not field names, and keep their spelling.
MAP_FIELDS = {"labels"}


def normalize(value, key=None):
    """Proto-JSON accepts camelCase field names and int64 strings; the console keeps the docs'
    snake_case and numbers."""
    if key in MAP_FIELDS and isinstance(value, dict):
        return dict(value)
    if isinstance(value, dict):
        return {snake_case(k): normalize(v, snake_case(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if key in INT_FIELDS and int_string(value):
        return int(value)
    return value


class Errors:
    def __init__(self):
        self.by_path = {}

    def add(self, path, message):
        self.by_path.setdefault(path or "spec", []).append(message)

    def __bool__(self):
        return bool(self.by_path)


def join(path, key):
    return f"{path}.{key}" if path else key


def expect_object(errors, value, path, allowed, required=()):
    """Check `value` is an object with only known keys; returns it (or {} when it is not)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        errors.add(path, "must be an object")
        return {}
    for key in sorted(set(value) - allowed):
        errors.add(join(path, key), "unknown field")
    for key in required:
        if value.get(key) in (None, "", []):
            errors.add(join(path, key), "is required")
    return value


def expect_list(errors, value, path):
    if value is None:
        return []
    if not isinstance(value, list):
        errors.add(path, "must be a list")
        return []
    return value


def expect_int(errors, value, path, minimum=0, maximum=INT_MAX):
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(path, "must be an integer")
        return None
    if value < minimum:
        errors.add(path, f"must be at least {minimum}")
        return None
    if value > maximum:
        errors.add(path, f"must be at most {maximum:,}")
        return None
    return value


def expect_str(errors, value, path):
    """`value` when it is a string, else None with an error (None itself is left to `required`)."""
    if value is None or isinstance(value, str):
        return value
    errors.add(path, "must be a string")
    return None


def validate_spec(data, *, backends):
    """Return the normalised spec, or raise SpecError with every problem found.

    `backends` maps backend names to backend objects; the chosen one adds its own limits.
    """
    errors = Errors()
    if not isinstance(data, dict):
        raise SpecError({"spec": ["must be a JSON object"]})
    spec = normalize(data)
    expect_object(errors, spec, "", TOP_LEVEL, required=("display_name", "node_pools", "orchestrator_spec"))

    name = spec.get("display_name")
    if name and (not isinstance(name, str) or not DISPLAY_NAME.match(name)):
        errors.add("display_name", "must be 1-10 lowercase letters or digits, starting with a letter (e.g. 'llama01')")

    validate_labels(errors, spec.get("labels"), spec.get("description"))
    pools = validate_node_pools(errors, spec.get("node_pools"))
    validate_network(errors, spec.get("network"))
    validate_runtime(errors, spec.get("runtime_spec"))
    validate_slurm(errors, spec.get("orchestrator_spec"), pools)
    validate_console_block(
        errors, spec.get("console"), spec, expect_object=expect_object, expect_list=expect_list, expect_int=expect_int
    )
    console = spec.get("console") if isinstance(spec.get("console"), dict) else {}
    backend_name = console.get("backend") or next(iter(backends))
    backend = backends.get(backend_name) if isinstance(backend_name, str) else None
    if not isinstance(backend_name, str):
        errors.add("console.backend", f"must be a backend name: one of {', '.join(backends)}")
    elif backend is None:
        errors.add("console.backend", f"unknown backend '{backend_name}'; choose one of: {', '.join(backends)}")
    elif not errors:
        for path, message in backend.validate_spec(spec):
            errors.add(path, message)
    if errors:
        raise SpecError(errors.by_path)
    return spec


# Labels as Compute Engine takes them (the gce backend puts them on every resource that has labels): at
# most 64, keys of 1-63 lowercase letters, digits, - or _ starting with a letter, values of 0-63 of those.
# https://cloud.google.com/compute/docs/labeling-resources#requirements
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}\Z")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}\Z")
MAX_LABELS = 64
# Keys the console's own labels use (ownership: a user's label must not pose as it).
RESERVED_LABELS = ("tcc-cluster", "tcc-pool", "tcc-role", "tcc-node", "managed-by")
MAX_DESCRIPTION = 2048


def validate_labels(errors, labels, description):
    if description is not None and (not isinstance(description, str) or len(description) > MAX_DESCRIPTION):
        errors.add("description", f"must be text of at most {MAX_DESCRIPTION} characters")
    if labels is None:
        return
    if not isinstance(labels, dict):
        errors.add("labels", "must be an object of label keys to values")
        return
    if len(labels) > MAX_LABELS - len(RESERVED_LABELS):
        errors.add(
            "labels",
            f"at most {MAX_LABELS - len(RESERVED_LABELS)} labels (Compute Engine's 64, less the console's own)",
        )
    for key, value in labels.items():
        if not LABEL_KEY.match(key):
            errors.add(f"labels.{key}", "keys are 1-63 lowercase letters, digits, - or _, starting with a letter")
        elif key in RESERVED_LABELS:
            errors.add(f"labels.{key}", "is the console's own label")
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            errors.add(f"labels.{key}", "values are 0-63 lowercase letters, digits, - or _")


# A user-managed service account (name@project.iam.gserviceaccount.com) or a project's Compute Engine
# default one (number-compute@developer.gserviceaccount.com).
SERVICE_ACCOUNT = re.compile(
    r"([a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam|[0-9]{6,20}-compute@developer)"
    r"\.gserviceaccount\.com\Z"
)


def validate_runtime(errors, value):
    """runtime_spec: {service_account} the VMs run as (immutable, like every field but node counts)."""
    runtime = expect_object(errors, value, "runtime_spec", {"service_account"})
    account = expect_str(errors, runtime.get("service_account"), "runtime_spec.service_account")
    if account is not None and not SERVICE_ACCOUNT.match(account):
        errors.add(
            "runtime_spec.service_account",
            "must be a service account email, e.g. trainer@my-project.iam.gserviceaccount.com",
        )


def validate_node_pools(errors, value):
    """Check node_pools[]; returns {pool id: pool} for the pools whose id is valid."""
    pools = {}
    items = expect_list(errors, value, "node_pools")
    if value is not None and not items and isinstance(value, list):
        errors.add("node_pools", "needs at least a login pool and one compute pool")
    zones = set()
    for i, pool in enumerate(items):
        path = f"node_pools[{i}]"
        pool = expect_object(errors, pool, path, NODE_POOL, required=("id", "machine_spec", "scaling_spec", "zone"))
        pool_id = pool.get("id")
        if pool_id is not None:
            if not isinstance(pool_id, str) or not RESOURCE_ID.match(pool_id):
                errors.add(f"{path}.id", ID_RULE)
            elif pool_id in pools:
                errors.add(f"{path}.id", f"duplicate node pool id '{pool_id}'")
            else:
                pools[pool_id] = pool
        validate_machine_spec(errors, pool.get("machine_spec"), f"{path}.machine_spec", pool.get("provisioning_model"))
        if "enable_public_ips" in pool and not isinstance(pool["enable_public_ips"], bool):
            errors.add(f"{path}.enable_public_ips", "must be true or false")
        validate_scaling(errors, pool.get("scaling_spec"), f"{path}.scaling_spec")
        zone = expect_str(errors, pool.get("zone"), f"{path}.zone")
        if zone:
            match = ZONE.match(zone)
            if not match:
                errors.add(f"{path}.zone", "must be a zone such as 'us-central1-a'")
            elif match["region"] not in REGIONS:
                errors.add(
                    f"{path}.zone", f"region '{match['region']}' is not offered; use one of: {', '.join(REGIONS)}"
                )
            else:
                zones.add(zone)
        model = expect_str(errors, pool.get("provisioning_model"), f"{path}.provisioning_model")
        if model is not None and model not in PROVISIONING_MODELS:
            errors.add(f"{path}.provisioning_model", f"must be one of: {', '.join(PROVISIONING_MODELS)}")
        validate_boot_disk(errors, pool.get("boot_disk"), f"{path}.boot_disk", pool.get("machine_spec"))
        for key in ("lustres", "filestores"):
            for j, item in enumerate(expect_list(errors, pool.get(key), f"{path}.{key}")):
                if not isinstance(item, str) or not item:
                    errors.add(f"{path}.{key}[{j}]", "must be an instance resource name")
        script = pool.get("startup_script")
        if script is not None and not isinstance(script, str):
            errors.add(f"{path}.startup_script", "must be a string")
    if len(zones) > 1:
        errors.add("node_pools", f"all node pools must be in one zone; found {', '.join(sorted(zones))}")
    return pools


def validate_machine_spec(errors, value, path, provisioning_model):
    spec = expect_object(errors, value, path, MACHINE_SPEC, required=("machine_type",))
    machine_type = expect_str(errors, spec.get("machine_type"), f"{path}.machine_type")
    if not machine_type:
        return
    info = machine_type_info(machine_type)
    if info is None:
        errors.add(f"{path}.machine_type", f"unknown machine type '{machine_type}'")
        return
    accelerator = expect_str(errors, spec.get("accelerator_type"), f"{path}.accelerator_type")
    count = spec.get("accelerator_count")
    if accelerator is not None and accelerator not in ACCELERATOR_TYPES:
        errors.add(f"{path}.accelerator_type", f"must be one of: {', '.join(ACCELERATOR_TYPES)}")
    elif info.accelerator_type and accelerator and accelerator != info.accelerator_type:
        errors.add(f"{path}.accelerator_type", f"{machine_type} comes with {info.accelerator_type}, not {accelerator}")
    elif not info.accelerator_type and accelerator:
        errors.add(f"{path}.accelerator_type", f"{machine_type} has no accelerators")
    if count is not None:
        count = expect_int(errors, count, f"{path}.accelerator_count")
        if count is not None and count != info.accelerator_count:
            errors.add(f"{path}.accelerator_count", f"{machine_type} has exactly {info.accelerator_count} accelerators")
    affinity = spec.get("reservation_affinity")
    if provisioning_model == "RESERVATION" and not affinity:
        errors.add(f"{path}.reservation_affinity", "is required when provisioning_model is RESERVATION")
    if affinity is not None:
        affinity = expect_object(
            errors, affinity, f"{path}.reservation_affinity", {"reservation_affinity_type", "key", "values"}
        )
        kind = expect_str(
            errors, affinity.get("reservation_affinity_type"), f"{path}.reservation_affinity.reservation_affinity_type"
        )
        expect_str(errors, affinity.get("key"), f"{path}.reservation_affinity.key")
        values = expect_list(errors, affinity.get("values"), f"{path}.reservation_affinity.values")
        for j, item in enumerate(values):
            if not isinstance(item, str) or not item:
                errors.add(f"{path}.reservation_affinity.values[{j}]", "must be a reservation name")
        if kind == "SPECIFIC_RESERVATION" and not values:
            errors.add(f"{path}.reservation_affinity.values", "name the reservation to use")


def validate_scaling(errors, value, path):
    scaling = expect_object(errors, value, path, {"min_node_count", "max_node_count"}, required=())
    low, high = scaling.get("min_node_count"), scaling.get("max_node_count")
    if low is None and high is None:
        if value is not None:
            errors.add(path, "set min_node_count and max_node_count")
        return
    low = expect_int(errors, low if low is not None else high, f"{path}.min_node_count", maximum=MAX_POOL_NODES)
    high = expect_int(errors, high if high is not None else low, f"{path}.max_node_count", maximum=MAX_POOL_NODES)
    if low is not None and high is not None and low != high:
        errors.add(path, "min_node_count must equal max_node_count (clusters do not autoscale)")


def validate_boot_disk(errors, value, path, machine_spec):
    name = machine_spec.get("machine_type") if isinstance(machine_spec, dict) else None
    machine = machine_type_info(name) if isinstance(name, str) else None
    if value is None:
        if machine and machine.hyperdisk_only:
            errors.add(f"{path}.boot_disk_type", f"{machine.name} boots from Hyperdisk only: set hyperdisk-balanced")
        return
    disk = expect_object(errors, value, path, {"boot_disk_type", "boot_disk_size_gb"})
    kind = expect_str(errors, disk.get("boot_disk_type"), f"{path}.boot_disk_type")
    if kind is not None and kind not in BOOT_DISK_TYPES:
        errors.add(f"{path}.boot_disk_type", f"must be one of: {', '.join(BOOT_DISK_TYPES)}")
    elif machine and machine.hyperdisk_only and not (kind or "pd-balanced").startswith("hyperdisk-"):
        # https://cloud.google.com/compute/docs/accelerator-optimized-machines#supported_disk_types
        errors.add(f"{path}.boot_disk_type", f"{machine.name} takes Hyperdisk only (hyperdisk-balanced, ...), not "
                                             f"{kind or 'the default pd-balanced'}")  # fmt: skip
    size = disk.get("boot_disk_size_gb")
    if size is not None:
        expect_int(errors, size, f"{path}.boot_disk_size_gb", minimum=10, maximum=MAX_BOOT_DISK_GB)


def validate_network(errors, value):
    if value is None:
        return
    network = expect_object(errors, value, "network", {"network", "subnetwork"})
    for key in ("network", "subnetwork"):
        if key in network and not isinstance(network[key], str):
            errors.add(f"network.{key}", "must be a resource name")


def validate_slurm(errors, value, pools):
    orchestrator = expect_object(errors, value, "orchestrator_spec", {"slurm_spec"}, required=("slurm_spec",))
    if "slurm_spec" not in orchestrator:
        return
    path = "orchestrator_spec.slurm_spec"
    slurm = expect_object(errors, orchestrator["slurm_spec"], path, SLURM_SPEC, required=("partitions",))
    login = slurm.get("login_node_pool_id")
    if not login:
        errors.add(f"{path}.login_node_pool_id", "is required")
    elif not isinstance(login, str):
        errors.add(f"{path}.login_node_pool_id", "must be a node pool id")
        login = None
    elif login not in pools:
        errors.add(f"{path}.login_node_pool_id", f"no node pool has id '{login}'")
    elif pool_node_count(pools[login]) < 1:
        errors.add(f"{path}.login_node_pool_id", "the login pool needs at least one node")
    seen, used = set(), set()
    for i, partition in enumerate(expect_list(errors, slurm.get("partitions"), f"{path}.partitions")):
        ppath = f"{path}.partitions[{i}]"
        partition = expect_object(errors, partition, ppath, {"id", "node_pool_ids"}, required=("id", "node_pool_ids"))
        pid = partition.get("id")
        if pid is not None:
            if not isinstance(pid, str) or not RESOURCE_ID.match(pid):
                errors.add(f"{ppath}.id", ID_RULE)
            elif pid in seen:
                errors.add(f"{ppath}.id", f"duplicate partition id '{pid}'")
            else:
                seen.add(pid)
        for j, pool_id in enumerate(expect_list(errors, partition.get("node_pool_ids"), f"{ppath}.node_pool_ids")):
            if not isinstance(pool_id, str):
                errors.add(f"{ppath}.node_pool_ids[{j}]", "must be a node pool id")
            elif pool_id not in pools:
                errors.add(f"{ppath}.node_pool_ids[{j}]", f"no node pool has id '{pool_id}'")
            elif pool_id == login:
                errors.add(f"{ppath}.node_pool_ids[{j}]", "the login pool cannot be in a partition")
            else:
                used.add(pool_id)
    for pool_id in pools:
        if pool_id != login and pool_id not in used:
            errors.add("node_pools", f"node pool '{pool_id}' is neither the login pool nor in any partition")
    for key in ("prolog_bash_scripts", "epilog_bash_scripts"):
        for j, script in enumerate(expect_list(errors, slurm.get(key), f"{path}.{key}")):
            if not isinstance(script, str):
                errors.add(f"{path}.{key}[{j}]", "must be a string")
    home = slurm.get("home_directory_storage")
    if home is not None and not isinstance(home, str):
        errors.add(f"{path}.home_directory_storage", "must be a Filestore or Lustre instance name")
    validate_accounting(errors, slurm.get("accounting"), f"{path}.accounting")
    validate_scheduling(errors, slurm.get("scheduling"), f"{path}.scheduling")


ENFORCE = {"associations", "limits", "nojobs", "nosteps", "qos", "safe", "wckeys", "all"}
PRIORITY_TYPES = ("priority/basic", "priority/multifactor")
PREEMPT_TYPES = ("preempt/none", "preempt/partition_prio", "preempt/qos")
PREEMPT_MODES = ("OFF", "CANCEL", "REQUEUE", "SUSPEND", "GANG")
WEIGHTS = (
    "priority_weight_age",
    "priority_weight_assoc",
    "priority_weight_fairshare",
    "priority_weight_job_size",
    "priority_weight_partition",
    "priority_weight_qos",
    "priority_weight_tres",
)
# Integer fields: proto-JSON sends int64 values as strings ("2"); normalize() stores numbers.
INT_FIELDS = {
    "min_node_count",
    "max_node_count",
    "accelerator_count",
    "boot_disk_size_gb",
    "mtu",
    "capacity_gb",
    *WEIGHTS,
}


def validate_accounting(errors, value, path):
    accounting = expect_object(errors, value, path, {"accounting_storage_enforce"})
    enforce = accounting.get("accounting_storage_enforce")
    if enforce is None:
        return
    words = enforce.split(",") if isinstance(enforce, str) else [None]
    bad = [w for w in words if w not in ENFORCE]
    if bad:
        errors.add(f"{path}.accounting_storage_enforce", f"comma-separated values from: {', '.join(sorted(ENFORCE))}")


def validate_scheduling(errors, value, path):
    scheduling = expect_object(
        errors, value, path, {"priority_type", "preempt_type", "preempt_mode", "preempt_exempt_time", *WEIGHTS}
    )
    for key, choices in (("priority_type", PRIORITY_TYPES), ("preempt_type", PREEMPT_TYPES)):
        if key in scheduling and scheduling[key] not in choices:
            errors.add(f"{path}.{key}", f"must be one of: {', '.join(choices)}")
    mode = scheduling.get("preempt_mode")
    if mode is not None and (not isinstance(mode, str) or any(m not in PREEMPT_MODES for m in mode.split(","))):
        errors.add(f"{path}.preempt_mode", f"comma-separated values from: {', '.join(PREEMPT_MODES)}")
    for key in WEIGHTS:
        if key in scheduling:
            expect_int(errors, scheduling[key], f"{path}.{key}")
    exempt = scheduling.get("preempt_exempt_time")
    if exempt is not None and (not isinstance(exempt, str) or not re.fullmatch(r"(\d+-)?\d{1,2}(:\d{2}){0,2}", exempt)):
        errors.add(f"{path}.preempt_exempt_time", "must be a Slurm time such as 00:10:00 or 1-00:00:00")


def pool_node_count(pool):
    """The pool's node count; 0 where the spec does not say (or says it with the wrong type)."""
    scaling = pool.get("scaling_spec") if isinstance(pool, dict) else None
    if not isinstance(scaling, dict):
        return 0
    count = scaling.get("min_node_count", scaling.get("max_node_count", 0))
    try:
        return int(count)
    except (TypeError, ValueError):
        return 0
