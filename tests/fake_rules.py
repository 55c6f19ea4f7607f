"""What the real Compute Engine API refuses, as rules the fake (tests/fake_compute.py) enforces.

Each rule names the documentation page it comes from and answers as Google does: an HTTP error
with `{"error": {"code", "message", "errors": [{"message", "domain", "reason"}]}}`. Where the page
gives the error text we use it; elsewhere the message is ours, in Google's form ("Invalid value for
field '<path>': '<value>'. <why>"), with the reason Google uses for that class of error (`invalid`,
`badRequest`, `resourceInUseByAnotherResource`).

A rule sees one request (`Request`): what it does (`insert`, `bulkInsert`, `setMetadata`, `delete`),
the collection, the body, and the instance properties it carries (an instance's own body, a
template's `properties`, a bulkInsert's `instanceProperties` or its source template's).
"""

import json
import re
from dataclasses import dataclass, field

# Machine families whose machine types come with GPUs (no guestAccelerators in the request).
# https://cloud.google.com/compute/docs/accelerator-optimized-machines
GPU_FAMILIES = ("a2", "a3", "a4", "a4x", "g2")

# Machine series that take Hyperdisk only (no Persistent Disk, boot disks included).
# https://cloud.google.com/compute/docs/accelerator-optimized-machines#supported_disk_types (A4X, A4,
# A3 Ultra) and https://cloud.google.com/compute/docs/disks/hyperdisks#machine-type-support (C4, N4).
HYPERDISK_ONLY = ("a4x-", "a4-", "a3-ultragpu-", "c4-", "c4a-", "c4d-", "n4-")

# https://cloud.google.com/vpc/docs/mtu: "The MTU of a VPC network can be any value from 1300 to 8896 bytes."
MTU_RANGE = (1300, 8896)

# https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#limitations:
# 256 KB for each value, 512 KB for all of an instance's metadata together.
METADATA_VALUE_BYTES = 256 * 1024
METADATA_TOTAL_BYTES = 512 * 1024

# https://cloud.google.com/compute/docs/instances/multiple/about-bulk-creation#limitations
# ("Number of VMs. You can create up to 5,000 VMs with each call.")
BULK_INSERT_MAX = 5000

RESERVATION_TYPES = ("ANY_RESERVATION", "SPECIFIC_RESERVATION", "NO_RESERVATION")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
# A reservation in SPECIFIC affinity: its name, or projects/P/reservations/N for one shared from P.
# https://cloud.google.com/compute/docs/instances/reservations-consume#consuming_a_specific_shared_reservation
RESERVATION_VALUE = re.compile(r"(projects/[a-z][-a-z0-9]*/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")
# A disk type in an instance: a full or partial URL. In an instance template: the type's name alone.
# https://cloud.google.com/compute/docs/reference/rest/v1/instances (AttachedDiskInitializeParams.diskType:
# "you can provide either the full or partial URL ... Note that for InstanceTemplate, this is the name
# of the disk type, not URL.")
DISK_TYPE_URL = re.compile(
    r"(https://[^/]+/compute/v1/)?(projects/[^/]+/)?zones/(?P<zone>[^/]+)/diskTypes/[a-z0-9-]+\Z"
)
DISK_TYPE_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")


@dataclass
class Request:
    verb: str  # insert, bulkInsert, setMetadata, delete
    collection: str  # instances, instanceTemplates, networks, firewalls, subnetworks
    body: dict
    project: str
    zone: str = ""
    properties: dict = field(default_factory=dict)  # the instance properties it carries
    at: str = "resource"  # where those properties sit in the request, for Google's field paths
    resources: dict = field(default_factory=dict)  # the fake's resources (read only)
    name: str = ""  # the resource a delete names
    account_seen: object = None  # email -> whether IAM knows that service account (and sees it yet)


@dataclass
class Refusal:
    status: int
    reason: str
    message: str


@dataclass
class Rule:
    name: str
    source: str
    applies: tuple  # ((verb, collection), ...)
    check: object  # Request -> Refusal | None


RULES = []


def rule(source, *applies):
    def register(check):
        RULES.append(Rule(check.__name__, source, applies, check))
        return check

    return register


def refuse(request, path, value, why, reason="invalid"):
    return Refusal(400, reason, f"Invalid value for field '{path}': '{value}'. {why}")


def machine_type(properties):
    return (properties.get("machineType") or "").rsplit("/", 1)[-1]


def family(properties):
    return machine_type(properties).split("-", 1)[0]


def boot_disks(properties):
    return [(i, d) for i, d in enumerate(properties.get("disks") or []) if d.get("initializeParams")]


INSTANCE_REQUESTS = (("insert", "instances"), ("insert", "instanceTemplates"), ("bulkInsert", "instances"))


@rule("https://cloud.google.com/compute/docs/reference/rest/v1/instances", ("insert", "instances"),
      ("bulkInsert", "instances"))  # fmt: skip
def disk_type_is_a_url_in_instances(request):
    if request.collection == "instances" and request.at.endswith("instanceProperties"):
        return disk_type_is_a_name_in_templates(request)  # instanceProperties take names, as templates do
    for i, disk in boot_disks(request.properties):
        value = disk["initializeParams"].get("diskType")
        if value is None:
            continue
        match = DISK_TYPE_URL.match(value)
        if not match:
            return refuse(request, f"{request.at}.disks[{i}].initializeParams.diskType", value,
                          "The URL is malformed.")  # fmt: skip
        if request.zone and match["zone"] != request.zone:
            return refuse(request, f"{request.at}.disks[{i}].initializeParams.diskType", value,
                          f"Disk type must be in zone {request.zone}.")  # fmt: skip
    return None


@rule("https://cloud.google.com/compute/docs/reference/rest/v1/instanceTemplates", ("insert", "instanceTemplates"))
def disk_type_is_a_name_in_templates(request):
    for i, disk in boot_disks(request.properties):
        value = disk["initializeParams"].get("diskType")
        if value is not None and not DISK_TYPE_NAME.match(value):
            return refuse(request, f"{request.at}.disks[{i}].initializeParams.diskType", value,
                          "Must be the name of a disk type, not a URL.")  # fmt: skip
    return None


@rule("https://cloud.google.com/compute/docs/accelerator-optimized-machines#supported_disk_types", *INSTANCE_REQUESTS)
def hyperdisk_only_machine_types_boot_from_hyperdisk(request):
    machine = machine_type(request.properties)
    if not machine.startswith(HYPERDISK_ONLY):
        return None
    for i, disk in boot_disks(request.properties):
        kind = (disk["initializeParams"].get("diskType") or "pd-standard").rsplit("/", 1)[-1]
        if not kind.startswith("hyperdisk-"):
            return refuse(request, f"{request.at}.disks[{i}].initializeParams.diskType", kind,
                          f"Machine type {machine} supports only Hyperdisk disk types.")  # fmt: skip
    return None


# Machine series with Arm CPUs: they boot Arm64 images only, and the others x86 images only.
# https://cloud.google.com/compute/docs/instances/arm-on-compute (N4A, C4A, A4X and Tau T2A "support public
# Arm-based OS images"; custom images are made from those).
ARM_SERIES = ("a4x", "c4a", "n4a", "t2a")


def image_architecture(resources, url):
    """ARM64 or X86_64: an image the fake holds says (its own or its family's newest); a public one by its
    name, as Google names them (ubuntu-...-arm64-..., debian-12-arm64)."""
    path = "/compute/v1/" + url.split("/compute/v1/", 1)[-1]
    if "/images/family/" in path:
        project, name = path.split("/projects/", 1)[1].split("/", 1)[0], path.rsplit("/", 1)[-1]
        found = [r for k, r in resources.items() if f"/projects/{project}/global/images/" in k
                 and r.get("family") == name]  # fmt: skip
        stored = found[-1] if found else None
    else:
        stored = resources.get(path)
    if stored and stored.get("architecture"):
        return stored["architecture"]
    return "ARM64" if "arm64" in url else "X86_64"


@rule("https://cloud.google.com/compute/docs/instances/arm-on-compute", *INSTANCE_REQUESTS)
def a_vm_boots_an_image_of_its_machines_architecture(request):
    machine = machine_type(request.properties)
    wanted = "ARM64" if family(request.properties) in ARM_SERIES else "X86_64"
    for i, disk in boot_disks(request.properties):
        image = disk["initializeParams"].get("sourceImage") or ""
        if image and image_architecture(request.resources, image) != wanted:
            return refuse(request, f"{request.at}.disks[{i}].initializeParams.sourceImage", image,
                          f"The image's architecture is not {wanted}, the architecture of machine type "
                          f"{machine}.")  # fmt: skip
    return None


@rule("https://cloud.google.com/compute/docs/access/create-enable-service-accounts-for-instances", *INSTANCE_REQUESTS)
def a_vms_service_account_exists(request):
    """A VM runs as an existing service account the caller may act as; a new one is not seen at once
    (https://cloud.google.com/iam/docs/service-accounts-create: "you might need to wait for 60 seconds or
    more before you use the service account"). The Compute default account always exists."""
    for account in request.properties.get("serviceAccounts") or []:
        email = account.get("email", "")
        if email.endswith(".iam.gserviceaccount.com") and request.account_seen and not request.account_seen(email):
            why = "Ask a project owner to grant you the iam.serviceAccountUser role on the service account"
            return Refusal(
                400,
                "badRequest",
                f"The user does not have access to service account '{email}'.  User: 'console'.  {why}",
            )
    return None


@rule("https://cloud.google.com/compute/docs/reference/rest/v1/instances", *INSTANCE_REQUESTS)
def one_one_to_one_nat_access_config_per_interface(request):
    """networkInterfaces[].accessConfigs: 'Currently, only one access config, ONE_TO_ONE_NAT, is supported.'"""
    for i, nic in enumerate(request.properties.get("networkInterfaces") or []):
        configs = nic.get("accessConfigs") or []
        path = f"{request.at}.networkInterfaces[{i}].accessConfigs"
        if len(configs) > 1:
            return refuse(request, path, len(configs), "Only one access config is supported per network interface.")
        for j, config in enumerate(configs):
            if config.get("type", "ONE_TO_ONE_NAT") != "ONE_TO_ONE_NAT":
                return refuse(request, f"{path}[{j}].type", config["type"], "Only ONE_TO_ONE_NAT is supported.")
    return None


@rule("https://cloud.google.com/compute/docs/instances/live-migration-process#limitations", *INSTANCE_REQUESTS)
def gpu_machines_terminate_on_host_maintenance(request):
    properties = request.properties
    if family(properties) not in GPU_FAMILIES and not properties.get("guestAccelerators"):
        return None
    scheduling = properties.get("scheduling") or {}
    if scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        return Refusal(400, "badRequest", "Instances with guest accelerators do not support live migration.")
    return None


@rule("https://cloud.google.com/compute/docs/instances/spot#limitations", *INSTANCE_REQUESTS)
def spot_and_flex_start_vms_terminate_and_do_not_restart(request):
    scheduling = request.properties.get("scheduling") or {}
    model = scheduling.get("provisioningModel", "STANDARD")
    if model not in ("SPOT", "FLEX_START") and not scheduling.get("preemptible"):
        return None
    if scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        return refuse(request, f"{request.at}.scheduling.onHostMaintenance", scheduling.get("onHostMaintenance",
                      "MIGRATE"), f"{model} instances must terminate on host maintenance.")  # fmt: skip
    if scheduling.get("automaticRestart", True):
        return refuse(request, f"{request.at}.scheduling.automaticRestart", "true",
                      f"{model} instances cannot be automatically restarted.")  # fmt: skip
    return None


@rule("https://cloud.google.com/compute/docs/instances/reservations-consume", *INSTANCE_REQUESTS)
def reservation_affinity_names_reservations(request):
    affinity = request.properties.get("reservationAffinity")
    if not affinity:
        return None
    kind = affinity.get("consumeReservationType", "")
    path = f"{request.at}.reservationAffinity"
    if kind not in RESERVATION_TYPES:
        return refuse(
            request, f"{path}.consumeReservationType", kind, f"Must be one of {', '.join(RESERVATION_TYPES)}."
        )
    if kind != "SPECIFIC_RESERVATION":
        if affinity.get("values"):
            return refuse(request, f"{path}.values", affinity["values"], f"Values are not allowed with {kind}.")
        return None
    if affinity.get("key") != RESERVATION_KEY:
        return refuse(request, f"{path}.key", affinity.get("key", ""), f"Must be {RESERVATION_KEY}.")
    values = affinity.get("values") or []
    if not values:
        return refuse(request, f"{path}.values", "", "A specific reservation must be named.")
    for j, value in enumerate(values):
        if not RESERVATION_VALUE.match(value):
            why = "Must be a reservation name, or projects/PROJECT/reservations/NAME for a shared one."
            return refuse(request, f"{path}.values[{j}]", value, why)
    return None


@rule("https://cloud.google.com/compute/docs/instances/reservations-with-provisioning-model", *INSTANCE_REQUESTS)
def reservation_bound_vms_consume_a_specific_reservation(request):
    scheduling = request.properties.get("scheduling") or {}
    if scheduling.get("provisioningModel") != "RESERVATION_BOUND":
        return None
    affinity = request.properties.get("reservationAffinity") or {}
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return refuse(request, f"{request.at}.scheduling.provisioningModel", "RESERVATION_BOUND",
                      "RESERVATION_BOUND instances must consume a specific reservation.")  # fmt: skip
    if scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        return refuse(request, f"{request.at}.scheduling.onHostMaintenance", scheduling.get("onHostMaintenance",
                      "MIGRATE"), "RESERVATION_BOUND instances must terminate on host maintenance.")  # fmt: skip
    return None


@rule("https://cloud.google.com/compute/docs/instances/placement-policies-overview#restrictions-compact-policies",
      *INSTANCE_REQUESTS)  # fmt: skip
def a_reservation_with_its_own_placement_takes_no_other(request):
    """VMs that consume a reservation made with a compact placement policy carry that policy, no other."""
    affinity = request.properties.get("reservationAffinity") or {}
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return None
    policies = [p.rsplit("/", 1)[-1] for p in request.properties.get("resourcePolicies") or []]
    for value in affinity.get("values") or []:
        reservation = find_reservation(request, value)
        if reservation is None:
            continue
        own = [p.rsplit("/", 1)[-1] for p in (reservation.get("resourcePolicies") or {}).values()]
        if own and policies and policies != own:
            return refuse(request, f"{request.at}.resourcePolicies", ",".join(policies),
                          f"Reservation {value} uses placement policy {','.join(own)}; "
                          "instances consuming it cannot specify another.")  # fmt: skip
    return None


# https://cloud.google.com/compute/docs/instances/placement-policies-overview (compact placement policies'
# table, max distance "Unspecified": these machine series, at most 1,500 instances a policy).
COMPACT_SERIES = ("a2", "a3", "c2", "c2d", "c3", "c3d", "c4", "g2", "h3", "n2", "n2d")
COMPACT_MAX_INSTANCES = 1500


@rule("https://cloud.google.com/compute/docs/instances/placement-policies-overview#compact-placement-policy",
      *INSTANCE_REQUESTS)  # fmt: skip
def compact_placement_takes_its_machine_series_and_size(request):
    """A compact placement policy (no maximum distance) takes only its machine series and at most
    1,500 instances; a bulkInsert from a template carries the template's policies."""
    properties = request.properties
    template = request.body.get("sourceInstanceTemplate", "") if request.verb == "bulkInsert" else ""
    if template:
        properties = (request.resources.get("/compute/v1/" + template.split("/compute/v1/", 1)[-1].lstrip("/"))
                      or {}).get("properties") or properties  # fmt: skip
    for policy in properties.get("resourcePolicies") or []:
        name = policy.rsplit("/", 1)[-1]
        found = next((r for k, r in request.resources.items() if k.endswith(f"/resourcePolicies/{name}")), None)
        placement = (found or {}).get("groupPlacementPolicy") or {}
        if placement.get("collocation") != "COLLOCATED" or placement.get("maxDistance"):
            continue
        if family(properties) not in COMPACT_SERIES:
            return refuse(request, f"{request.at}.resourcePolicies", name,
                          f"Compact placement policies are not supported for machine type "
                          f"{machine_type(properties)}.")  # fmt: skip
        if request.verb == "insert" and request.collection == "instanceTemplates":
            continue
        new = int(request.body.get("count") or 1) if request.verb == "bulkInsert" else 1
        held = sum(
            1 for key, instance in request.resources.items() if "/instances/" in key
            and name in [p.rsplit("/", 1)[-1] for p in instance.get("resourcePolicies") or []]
        )  # fmt: skip
        if held + new > COMPACT_MAX_INSTANCES:
            return refuse(request, f"{request.at}.resourcePolicies", name,
                          f"A compact placement policy holds at most {COMPACT_MAX_INSTANCES} instances; it holds "
                          f"{held} and this request adds {new}.")  # fmt: skip
    return None


def find_reservation(request, value):
    name = value.rsplit("/", 1)[-1]
    for key, resource in request.resources.items():
        if key.endswith(f"/reservations/{name}") and "/zones/" in key:
            return resource
    return None


@rule("https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#limitations", *INSTANCE_REQUESTS,
      ("setMetadata", "instances"))  # fmt: skip
def metadata_fits_its_limits(request):
    metadata = request.body if request.verb == "setMetadata" else request.properties.get("metadata") or {}
    items = metadata.get("items") or []
    total = 0
    for item in items:
        size = len((item.get("key") or "").encode()) + len((item.get("value") or "").encode())
        total += size
        if len((item.get("value") or "").encode()) > METADATA_VALUE_BYTES:
            return Refusal(
                400,
                "invalid",
                f"Invalid value for field 'resource.metadata': metadata value for key "
                f"'{item.get('key')}' exceeds the limit of {METADATA_VALUE_BYTES} bytes.",
            )
    if total > METADATA_TOTAL_BYTES:
        return Refusal(
            400,
            "invalid",
            f"Invalid value for field 'resource.metadata': the metadata's total size "
            f"{total} bytes exceeds the limit of {METADATA_TOTAL_BYTES} bytes.",
        )
    return None


MACHINE_TYPE_URL = re.compile(
    r"(https://[^/]+/compute/v1/)?(projects/[^/]+/)?zones/(?P<zone>[^/]+)/machineTypes/[a-z0-9-]+\Z"
)


@rule("https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert", ("insert", "instances"))
def machine_type_is_a_url_in_the_instances_zone(request):
    """An instance names its machine type by (partial) URL in its own zone; a template names it alone."""
    value = request.body.get("machineType", "")
    match = MACHINE_TYPE_URL.match(value)
    if not match:
        return refuse(request, "resource.machineType", value, "The URL is malformed.")
    if match["zone"] != request.zone:
        return refuse(request, "resource.machineType", value, f"Machine type must be in zone {request.zone}.")
    return None


LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}\Z")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}\Z")


@rule("https://cloud.google.com/compute/docs/labeling-resources#requirements", *INSTANCE_REQUESTS)
def labels_are_lowercase_and_short(request):
    labels = request.properties.get("labels") or {}
    if len(labels) > 64:
        return refuse(request, f"{request.at}.labels", len(labels), "At most 64 labels.")
    for key, value in labels.items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(str(value)):
            why = "Label keys and values are lowercase letters, digits, - and _, up to 63 characters."
            return refuse(request, f"{request.at}.labels.{key}", value, why)
    return None


@rule("https://cloud.google.com/compute/docs/instances/multiple/about-bulk-creation#limitations",
      ("bulkInsert", "instances"))  # fmt: skip
def bulk_insert_stays_within_its_count(request):
    count = int(request.body.get("count") or 0)
    names = request.body.get("perInstanceProperties") or {}
    minimum = int(request.body.get("minCount") or count)
    if not 1 <= count <= BULK_INSERT_MAX:
        return refuse(request, "resource.count", count, f"Must be between 1 and {BULK_INSERT_MAX}.")
    if len(names) > count:
        return refuse(request, "resource.perInstanceProperties", len(names), "More instances named than count.")
    if minimum > count:
        return refuse(request, "resource.minCount", minimum, "Must not be greater than count.")
    return None


@rule("https://cloud.google.com/vpc/docs/mtu", ("insert", "networks"))
def network_mtu_in_range(request):
    mtu = request.body.get("mtu")
    if mtu is not None and not MTU_RANGE[0] <= int(mtu) <= MTU_RANGE[1]:
        return refuse(request, "resource.mtu", mtu, f"Must be between {MTU_RANGE[0]} and {MTU_RANGE[1]}.")
    return None


@rule("https://cloud.google.com/vpc/docs/rdma-network-profiles", ("insert", "firewalls"))
def rdma_networks_take_no_firewall_rules(request):
    network = find_network(request, request.body.get("network", ""))
    if network and "vpc-roce" in (network.get("networkProfile") or ""):
        return refuse(request, "resource.network", request.body["network"],
                      "Firewall rules are not supported on networks with an RDMA (RoCE) network profile.")  # fmt: skip
    return None


def find_network(request, url):
    name = url.rsplit("/", 1)[-1]
    return request.resources.get(f"/compute/v1/projects/{request.project}/global/networks/{name}")


@rule("https://cloud.google.com/vpc/docs/create-modify-vpc-networks#deleting_a_network", ("delete", "networks"),
      ("delete", "subnetworks"))  # fmt: skip
def a_network_in_use_is_not_deleted(request):
    """Firewall rules, subnets, addresses and instances that use a network (or a subnet's instances) first."""
    kind = "network" if request.collection == "networks" else "subnetwork"
    mine = f"projects/{request.project}/{'global' if kind == 'network' else ''}"
    target = f"{request.collection}/{request.name}"
    for key, resource in request.resources.items():
        if not key.startswith("/compute/v1/") or key.endswith(target):
            continue
        uses = [resource.get(kind, "")]
        uses += [nic.get(kind, "") for nic in resource.get("networkInterfaces") or []]
        if any(u.endswith(f"/{target}") for u in uses if u):
            user = key.removeprefix("/compute/v1/")
            where = f"{mine.rstrip('/')}/{target}" if kind == "network" else target
            return Refusal(400, "resourceInUseByAnotherResource",
                           f"The {kind} resource '{where}' is already being used by '{user}'")  # fmt: skip
    return None


@rule("https://cloud.google.com/compute/docs/images/create-custom", ("insert", "images"))
def an_image_comes_from_a_disk_no_running_vm_uses(request):
    """Stop the VM first (or force it, which the console never does)."""
    source = request.body.get("sourceDisk") or ""
    if "/zones/" not in source or request.body.get("forceCreate"):
        return None
    zone, disk = source.split("/zones/", 1)[1].split("/")[0], source.rsplit("/", 1)[-1]
    user = f"projects/{request.project}/zones/{zone}/instances/{disk}"
    if (request.resources.get(f"/compute/v1/{user}") or {}).get("status") == "RUNNING":
        return Refusal(400, "resourceInUseByAnotherResource",
                       f"The disk resource 'projects/{request.project}/zones/{zone}/disks/{disk}' is already being "
                       f"used by '{user}'")  # fmt: skip
    return None


def refusal_for(request):
    """The first rule that refuses the request, as (HTTP status, Google's error body), or None."""
    for item in RULES:
        if (request.verb, request.collection) in item.applies:
            found = item.check(request)
            if found:
                return found.status, error_body(found.status, found.message, found.reason)
    return None


def error_body(status, message, reason):
    return {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


def table():
    """The rules as the fake enforces them: name, what they apply to, the page they come from."""
    return [{"rule": r.name, "applies": [" ".join(a) for a in r.applies], "source": r.source} for r in RULES]


if __name__ == "__main__":  # python -m tests.fake_rules: the table
    print(json.dumps(table(), indent=1))
