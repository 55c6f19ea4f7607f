"""Before a gce create: is the Google Cloud project ready for this spec? (`manage.py preflight`)

Four checks, each a Finding(status, check, detail) with status "ok", "fail" or "warn":
- the APIs the spec needs are enabled (Service Usage API, services in state ENABLED);
- the region's quotas cover what the spec asks for: CPUS for general-purpose machines (the console's
  controller included), and the GPU quota of each accelerator (the region's `..._GPUS` metric naming
  the model, `PREEMPTIBLE_...` for Spot), with what is already in use;
- each reservation a pool names exists in its zone and has room for the pool's nodes;
- the console's workers will have a route to the controller (a new VPC needs GCE_CONSOLE_NETWORK, or
  GCE_CONTROLLER_ACCESS=external).
"""

from django.conf import settings

from ...spec import pool_node_count
from ...spec.catalog import machine_type_info
from ..base import Finding
from .identity import makes_account
from .names import gpu_count, owner_and_name
from .network import external_access, reach_problem

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).

FIXED_APIS = {"compute.googleapis.com": "Compute Engine", "secretmanager.googleapis.com": "Secret Manager (munge key)"}


def run(clients, gcp_project, spec):
    findings = check_apis(clients, gcp_project, spec)
    findings += check_quotas(clients, gcp_project, spec)
    findings += check_reservations(clients, gcp_project, spec)
    findings += check_reach(spec)
    return findings


def check_reach(spec):
    """Will the console's workers have a route to the controller? A new VPC is reached through its peering
    with GCE_CONSOLE_NETWORK; without one, only a network the workers are already in is."""
    if not settings.GCE_REACH_CLUSTERS:
        return [Finding("ok", "console reach", "not needed: GCE_REACH_CLUSTERS is off (provisioning only)")]
    if problem := reach_problem((spec.get("console") or {}).get("network") or {}):
        return [Finding("fail", "console reach", problem)]
    if external_access():
        how = "at the controller's external address, admitted from GCE_CONSOLE_RANGES only (no endpoints)"
        return [Finding("ok", "console reach", how)]
    how = (
        f"peered with {settings.GCE_CONSOLE_NETWORK}"
        if settings.GCE_CONSOLE_NETWORK
        else "an existing network the workers are in"
    )
    return [Finding("ok", "console reach", how)]


def needed_apis(spec):
    storage = (spec.get("console") or {}).get("storage") or {}
    apis = dict(FIXED_APIS)
    if storage.get("filestore_home"):
        apis["file.googleapis.com"] = "Filestore (/home)"
    if storage.get("lustre"):
        apis["lustre.googleapis.com"] = "Managed Lustre"
    if storage.get("filestore_home") or storage.get("lustre"):
        apis["servicenetworking.googleapis.com"] = "Service Networking (private services access)"
    if makes_account(spec):
        apis["iam.googleapis.com"] = "IAM (the cluster's own service account)"
    return apis


def check_apis(clients, gcp_project, spec):
    url = clients.rest_url("serviceusage")
    enabled, token = set(), None
    session = clients.session()
    while True:
        params = {"filter": "state:ENABLED", "pageSize": 200, **({"pageToken": token} if token else {})}
        answer = session.get(f"{url}/v1/projects/{gcp_project}/services", params=params)
        if not answer.ok:
            why = f"cannot list the enabled APIs ({answer.status_code}): {answer.text[:200]}"
            return [Finding("fail", "APIs", why)]
        body = answer.json()
        enabled |= {service["name"].rsplit("/", 1)[-1] for service in body.get("services", [])}
        token = body.get("nextPageToken")
        if not token:
            break
    return [
        Finding("ok", f"API {api}", f"{what}: enabled")
        if api in enabled
        else Finding("fail", f"API {api}", f"{what}: not enabled; gcloud services enable {api}")
        for api, what in needed_apis(spec).items()
    ]


def gpu_token(accelerator):
    """The model's part of its quota metric: NVIDIA_H200_141GB -> H200, NVIDIA_H100_MEGA_80GB -> H100_MEGA."""
    parts = accelerator.removeprefix("NVIDIA_").split("_")
    return "_".join(p for p in parts if not (p.endswith("GB") and p[:-2].isdigit()))


# vCPUs count against their machine family's regional quota: N1 and E2 against CPUS, the others
# against <FAMILY>_CPUS. https://cloud.google.com/compute/resource-usage#cpu_quota
FAMILY_CPU_QUOTAS = {"n2": "N2_CPUS", "n2d": "N2D_CPUS", "c2": "C2_CPUS", "c2d": "C2D_CPUS", "c3": "C3_CPUS",
                     "c3d": "C3D_CPUS", "c4": "C4_CPUS", "n4": "N4_CPUS", "m1": "M1_CPUS", "m3": "M3_CPUS"}  # fmt: skip


def cpu_metric(machine_type):
    return FAMILY_CPU_QUOTAS.get(machine_type.split("-", 1)[0], "CPUS")


# External IPv4 addresses in use, per region: every VM's ephemeral one counts
# (https://cloud.google.com/compute/resource-usage#external_ip_addresses).
ADDRESSES = "IN_USE_ADDRESSES"


def wanted_by_region(spec):
    """{region: {"N2_CPUS": n, ("GPUS", accelerator, spot): n, "IN_USE_ADDRESSES": n}} for the spec's pools
    and the controller (its external address with GCE_CONTROLLER_ACCESS=external)."""
    wanted = {}
    for pool in spec["node_pools"]:
        region = pool["zone"].rsplit("-", 1)[0]
        nodes = pool_node_count(pool)
        machine = pool["machine_spec"]
        info = machine_type_info(machine["machine_type"])
        need = wanted.setdefault(region, {})
        accelerator = machine.get("accelerator_type") or (info.accelerator_type if info else "")
        count = gpu_count(pool)
        if accelerator and count:
            key = ("GPUS", accelerator, pool.get("provisioning_model") == "SPOT")
            need[key] = need.get(key, 0) + nodes * count
        elif info:
            metric = cpu_metric(info.name)
            need[metric] = need.get(metric, 0) + nodes * info.vcpus
        if pool.get("enable_public_ips"):
            need[ADDRESSES] = need.get(ADDRESSES, 0) + nodes
    controller = machine_type_info(settings.GCE_CONTROLLER_MACHINE_TYPE)
    if wanted and controller:
        first, metric = next(iter(wanted)), cpu_metric(controller.name)
        wanted[first][metric] = wanted[first].get(metric, 0) + controller.vcpus
        if external_access():
            wanted[first][ADDRESSES] = wanted[first].get(ADDRESSES, 0) + 1
    return wanted


def check_quotas(clients, gcp_project, spec):
    from google.api_core import exceptions

    findings = []
    for region, need in wanted_by_region(spec).items():
        try:
            quotas = {q.metric: q for q in clients.regions.get(project=gcp_project, region=region).quotas}
        except exceptions.GoogleAPICallError as exc:
            findings.append(Finding("fail", f"quotas in {region}", f"cannot read them: {exc.message}"))
            continue
        for key, amount in need.items():
            if isinstance(key, str):
                metric, label = key, "external addresses" if key == ADDRESSES else "vCPUs"
            else:
                _gpus, accelerator, spot = key
                token = gpu_token(accelerator)
                found = sorted(
                    m for m in quotas if m.endswith("_GPUS") and token in m and m.startswith("PREEMPTIBLE_") == spot
                )
                if not found:
                    why = "no such GPU quota listed for the region; check the Quotas page"
                    findings.append(Finding("warn", f"{accelerator} quota in {region}", why))
                    continue
                metric, label = found[0], accelerator
            quota = quotas.get(metric)
            if quota is None:
                findings.append(Finding("warn", f"{metric} in {region}", "not listed for the region"))
                continue
            free = quota.limit - quota.usage
            status = "ok" if free >= amount else "fail"
            why = f"{label}: the spec needs {amount:g}, {free:g} free (limit {quota.limit:g}, in use {quota.usage:g})"
            findings.append(Finding(status, f"{metric} in {region}", why))
    return findings


def check_reservations(clients, gcp_project, spec):
    from google.api_core import exceptions

    findings = []
    for pool in spec["node_pools"]:
        affinity = pool["machine_spec"].get("reservation_affinity") or {}
        nodes = pool_node_count(pool)
        for value in affinity.get("values", []):
            owner, name = owner_and_name(value, gcp_project)  # a shared one lives in its owner's project
            try:
                found = clients.reservations.get(project=owner, zone=pool["zone"], reservation=name)
            except exceptions.NotFound:
                where = pool["zone"] if owner == gcp_project else f"project {owner}, {pool['zone']}"
                findings.append(Finding("fail", f"reservation {name}", f"not found in {where}"))
                continue
            except exceptions.GoogleAPICallError as exc:
                findings.append(Finding("fail", f"reservation {name}", f"cannot read it: {exc.message}"))
                continue
            held = found.specific_reservation
            free = held.count - held.in_use_count
            machine = held.instance_properties.machine_type
            status = "ok" if free >= nodes and machine in ("", pool["machine_spec"]["machine_type"]) else "fail"
            detail = f"{free} of {held.count} {machine or 'machines'} free for {pool['id']}'s {nodes} nodes"
            if machine and machine != pool["machine_spec"]["machine_type"]:
                detail += f"; it holds {machine}, the pool asks for {pool['machine_spec']['machine_type']}"
            findings.append(Finding(status, f"reservation {name}", detail))
    return findings
