"""A gce cluster's machines: placement policies, instance templates, the controller and login nodes,
the workers (one bulkInsert per pool), waiting for them, resetting, recreating and deleting them."""

import time

from django.conf import settings

from ...choices import NodeRole, NodeState
from ...spec import pool_node_count
from ...spec.catalog import machine_type_info
from ...work import PermanentBackendError, TransientBackendError, heartbeat
from . import fabric, identity, network, slurm_conf
from .errors import map_api_error
from .names import OWNER_LABEL, is_gpu_pool, owner_and_name

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).


def create_placement(cloud, pool):
    from google.cloud import compute_v1

    name = cloud.n.placement(pool["id"])
    cloud.ensure(
        f"placement policy {name}",
        lambda: cloud.c.policies.get(project=cloud.project, region=cloud.region, resource_policy=name),
        lambda: cloud.c.policies.insert_unary(
            project=cloud.project,
            region=cloud.region,
            resource_policy_resource=compute_v1.ResourcePolicy(
                name=name,
                description=cloud.description,
                group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED"),
            ),
        ),
    )


CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def image_for(pool, role):
    """GPU compute pools boot GCE_GPU_IMAGE (an image with the NVIDIA driver and DCGM), or on an Arm machine
    type (A4X) GCE_GPU_ARM64_IMAGE; the rest GCE_IMAGE."""
    if role == "compute" and is_arm(pool):
        return settings.GCE_GPU_ARM64_IMAGE
    if role == "compute" and is_gpu_pool(pool):
        return settings.GCE_GPU_IMAGE or settings.GCE_IMAGE
    return settings.GCE_IMAGE


def is_arm(pool):
    info = machine_type_info(pool["machine_spec"]["machine_type"])
    return bool(info) and info.architecture == "ARM64"


# The spec's provisioning models as Compute's. RESERVATION is STANDARD with a reservation affinity, or
# RESERVATION_BOUND for machine types obtained only through future reservations (A4X, A4, A3 Ultra:
# clusters/data/machine_types.json `reservation_bound`), whose VMs end with their reservation.
# https://cloud.google.com/compute/docs/reference/rest/v1/instances (Scheduling.provisioningModel)
PROVISIONING_MODELS = {"ON_DEMAND": "STANDARD", "SPOT": "SPOT", "FLEX_START": "FLEX_START", "RESERVATION": "STANDARD"}


def provisioning_model(pool):
    model = pool.get("provisioning_model") or "ON_DEMAND"
    info = machine_type_info(pool["machine_spec"]["machine_type"])
    if model == "RESERVATION" and info and info.reservation_bound:
        return "RESERVATION_BOUND"
    return PROVISIONING_MODELS[model]


def scheduling_for(pool):
    """GPU machines cannot live-migrate, and Spot, Flex-start and reservation-bound VMs end rather than
    move or restart: all of them TERMINATE on host maintenance.
    https://cloud.google.com/compute/docs/instances/live-migration-process#limitations,
    https://cloud.google.com/compute/docs/instances/spot#limitations"""
    from google.cloud import compute_v1

    model = provisioning_model(pool)
    ends = model in ("SPOT", "FLEX_START", "RESERVATION_BOUND")
    scheduling = compute_v1.Scheduling(
        provisioning_model=model,
        on_host_maintenance="TERMINATE" if is_gpu_pool(pool) or ends else "MIGRATE",
        automatic_restart=model not in ("SPOT", "FLEX_START"),
    )
    if ends:
        scheduling.instance_termination_action = "DELETE"
    if model == "FLEX_START":
        # Flex-start VMs run for a bounded time; the cloud deletes them after it (then they are recreated).
        scheduling.max_run_duration = compute_v1.Duration(seconds=int(settings.GCE_FLEX_START_MAX_RUN_HOURS * 3600))
    return scheduling


def reservation_names(cloud, values):
    """The spec's reservations as the API names them: a name for one of this project's, or
    projects/P/reservations/N for one shared from project P; the service's JSON may give the full path
    projects/P/zones/Z/reservations/N (https://cloud.google.com/compute/docs/instances/reservations-consume)."""
    names = []
    for value in values:
        owner, name = owner_and_name(value, cloud.project)
        names.append(name if owner == cloud.project else f"projects/{owner}/reservations/{name}")
    return names


def reservation_affinity(cloud, pool):
    from google.cloud import compute_v1

    affinity = pool["machine_spec"].get("reservation_affinity")
    if not affinity:
        return None
    kind = affinity.get("reservation_affinity_type") or "SPECIFIC_RESERVATION"
    if kind != "SPECIFIC_RESERVATION":
        return compute_v1.ReservationAffinity(consume_reservation_type=kind)
    return compute_v1.ReservationAffinity(
        consume_reservation_type=kind,
        key=affinity.get("key") or "compute.googleapis.com/reservation-name",
        values=reservation_names(cloud, affinity.get("values") or []),
    )


def reservation_policies(cloud, affinity):
    """The placement policies of the specific reservation the pool consumes: VMs consuming it carry
    these and no other (https://cloud.google.com/compute/docs/instances/placement-policies-overview)."""
    project, name = owner_and_name(affinity.values[0], cloud.project)
    reservation = cloud.get(lambda: cloud.c.reservations.get(project=project, zone=cloud.zone, reservation=name))
    return list((reservation.resource_policies or {}).values()) if reservation else []


def disk_type(cloud, kind, in_template):
    """A template names the disk type; an instance takes its URL in the zone.
    https://cloud.google.com/compute/docs/reference/rest/v1/instances (AttachedDiskInitializeParams.diskType)"""
    return kind if in_template else f"zones/{cloud.zone}/diskTypes/{kind}"


def instance_properties(cloud, pool, role, in_template=True):
    from google.cloud import compute_v1

    machine = pool["machine_spec"]
    disk = pool.get("boot_disk") or {}
    properties = compute_v1.InstanceProperties(
        machine_type=machine["machine_type"],
        labels={**cloud.labels, "tcc-pool": pool["id"], "tcc-role": role},
        tags=compute_v1.Tags(items=[f"{cloud.n.prefix}-{role}", cloud.n.cluster_tag]),
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=image_for(pool, role),
                    disk_size_gb=int(disk.get("boot_disk_size_gb", 100)),
                    disk_type=disk_type(cloud, disk.get("boot_disk_type", "pd-balanced"), in_template),
                ),
            )
        ],
        network_interfaces=[
            compute_v1.NetworkInterface(
                network=cloud.network_url,
                subnetwork=cloud.subnetwork_url,
                nic_type="GVNIC",
                # An ephemeral external address (https://cloud.google.com/compute/docs/ip-addresses#ephemeraladdress):
                # the spec's enable_public_ips, and the controller when the console is outside Google Cloud.
                access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
                if pool.get("enable_public_ips")
                else [],
            ),
            # The GPU fabric of the machine type (GPUDirect-TCPXO NICs, or a gVNIC + 8 RDMA NICs).
            *(fabric.extra_interfaces(cloud, pool) if role == "compute" else []),
        ],
        scheduling=scheduling_for(pool),
        # The munge key read at boot and gcsfuse need Google APIs: the spec's service account (or the
        # project's default one), with the cloud-platform scope; IAM then decides what it may do.
        service_accounts=[compute_v1.ServiceAccount(email=identity.email(cloud), scopes=[CLOUD_PLATFORM])],
        metadata=compute_v1.Metadata(
            items=[
                compute_v1.Items(key="startup-script", value=slurm_conf.startup_script(cloud, pool, role)),
                compute_v1.Items(key="tcc-cluster", value=cloud.n.prefix),
                # Users log in with their Google identities: the same POSIX account (uid, gid) on every
                # VM, keys managed by OS Login. https://cloud.google.com/compute/docs/oslogin/set-up-oslogin
                compute_v1.Items(key="enable-oslogin", value="TRUE"),
                *(slurm_conf.hook_items(cloud) if role == "compute" else []),
            ]
        ),
    )
    affinity = reservation_affinity(cloud, pool)
    if affinity is not None:
        properties.reservation_affinity = affinity
    if role == "compute":
        if affinity is not None and affinity.consume_reservation_type == "SPECIFIC_RESERVATION":
            properties.resource_policies = reservation_policies(cloud, affinity)
        elif uses_own_placement(pool):
            properties.resource_policies = [cloud.n.placement(pool["id"])]
    return properties


# A compact placement policy with no maximum distance (the console's) takes these machine series, and
# at most 1,500 instances: https://cloud.google.com/compute/docs/instances/placement-policies-overview
# (compact placement policies' table, max distance "Unspecified": A2, A3, C2, C3, C4, C2D, C3D, G2, H3,
# N2 and N2D; 1,500). A4 and A4X VMs are placed densely only through their reservations.
COMPACT_SERIES = frozenset({"a2", "a3", "c2", "c2d", "c3", "c3d", "c4", "g2", "h3", "n2", "n2d"})
COMPACT_MAX_INSTANCES = 1500


def uses_own_placement(pool):
    """A compact placement policy of the console's own: GPU pools that consume no specific reservation
    (a reservation brings its placement, and its VMs may carry no other), of a machine series that
    takes one, and no larger (at their largest) than one policy may hold."""
    affinity = pool["machine_spec"].get("reservation_affinity") or {}
    specific = (affinity.get("reservation_affinity_type") or "SPECIFIC_RESERVATION") == "SPECIFIC_RESERVATION"
    series = pool["machine_spec"]["machine_type"].split("-", 1)[0]
    scaling = pool.get("scaling_spec") or {}
    largest = max(pool_node_count(pool), int(scaling.get("max_node_count") or 0))
    return (
        is_gpu_pool(pool)
        and not (affinity and specific)
        and series in COMPACT_SERIES
        and largest <= COMPACT_MAX_INSTANCES
    )


def create_template(cloud, pool):
    from google.cloud import compute_v1

    name = cloud.n.template(pool["id"])
    cloud.ensure(
        f"instance template {name}",
        lambda: cloud.c.templates.get(project=cloud.project, instance_template=name),
        lambda: cloud.c.templates.insert_unary(
            project=cloud.project,
            instance_template_resource=compute_v1.InstanceTemplate(
                name=name, description=cloud.description, properties=instance_properties(cloud, pool, "compute")
            ),
        ),
    )


def create_head_nodes(cloud):
    from google.cloud import compute_v1

    controller_pool = {
        "id": "ctl",
        "machine_spec": {"machine_type": settings.GCE_CONTROLLER_MACHINE_TYPE},
        "boot_disk": {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 100},
        "enable_public_ips": network.external_access(),  # the console reaches it there (network.py)
    }
    heads = [(cloud.n.controller, controller_pool, "controller", "ctl")]
    login_id = cloud.login_pool["id"]
    for i in range(pool_node_count(cloud.login_pool)):
        heads.append((cloud.n.instance(f"{login_id}-{i}"), cloud.login_pool, "login", f"{login_id}-{i}"))
    for name, pool, role, node in heads:
        properties = instance_properties(cloud, pool, role, in_template=False)
        instance = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{cloud.zone}/machineTypes/{properties.machine_type}",
            labels={**properties.labels, "tcc-node": node},
            tags=properties.tags,
            disks=properties.disks,
            network_interfaces=properties.network_interfaces,
            scheduling=properties.scheduling,
            service_accounts=properties.service_accounts,
            metadata=compute_v1.Metadata(
                items=[
                    *properties.metadata.items,
                    *slurm_conf.slurm_items(cloud),
                    *([slurm_conf.agent_item(cloud)] if role == "controller" else []),
                ]
            ),
            description=cloud.description,
        )
        cloud.ensure(
            f"instance {name}",
            lambda n=name: cloud.c.instances.get(project=cloud.project, zone=cloud.zone, instance=n),
            lambda i=instance: cloud.c.instances.insert_unary(
                project=cloud.project, zone=cloud.zone, instance_resource=i
            ),
        )


def reset_instance(cloud, node):
    """Reset a running instance; start one that has stopped (a reset needs a running machine); make
    one the cloud deleted (a Spot or Flex-start VM taken back) again from its pool's template."""
    from google.api_core import exceptions

    name = cloud.n.instance(node)
    instance = cloud.get(lambda: cloud.c.instances.get(project=cloud.project, zone=cloud.zone, instance=name))
    if instance is None:
        recreate_instance(cloud, node)
        return
    stopped = instance is not None and instance.status != "RUNNING"
    action = cloud.c.instances.start_unary if stopped else cloud.c.instances.reset_unary
    try:
        operation = action(project=cloud.project, zone=cloud.zone, instance=name)
    except exceptions.NotFound:
        raise PermanentBackendError(f"cannot reboot {node}: instance {name} does not exist") from None
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, f"resetting {name}") from None
    cloud.wait(operation, f"resetting {name}")
    wait_running(cloud)


def stop_instance(cloud, node):
    """Power the node's instance off (a rehearsal of a dead machine); its jobs die with it."""
    from google.api_core import exceptions

    name = cloud.n.instance(node)
    try:
        operation = cloud.c.instances.stop_unary(project=cloud.project, zone=cloud.zone, instance=name)
    except exceptions.NotFound:
        raise PermanentBackendError(f"cannot stop {node}: instance {name} does not exist") from None
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, f"stopping {name}") from None
    cloud.wait(operation, f"stopping {name}")


def recreate_instance(cloud, node):
    """A fresh boot disk from the pool's template: delete the instance, bulkInsert it again."""
    found = cloud.cluster.nodes.select_related("node_pool").get(name=node)
    pool = next(p for p in cloud.compute_pools if p["id"] == found.node_pool.pool_id)
    delete_each(cloud, [i for i in list_instances(cloud, pool["id"]) if i.name == cloud.n.instance(node)])
    create_workers(cloud, pool)
    wait_running(cloud)


def list_instances(cloud, pool_id=None):
    from google.api_core import exceptions

    expression = f'labels.{OWNER_LABEL} = "{cloud.n.prefix}"'
    if pool_id:
        expression += f' AND labels.tcc-pool = "{pool_id}"'
    try:
        from google.cloud import compute_v1

        request = compute_v1.ListInstancesRequest(project=cloud.project, zone=cloud.zone, filter=expression)
        return list(cloud.c.instances.list(request=request))
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, "listing instances") from None


def wanted_workers(cloud, pool_id):
    return list(
        cloud.cluster.nodes.filter(node_pool__pool_id=pool_id, state__in=NodeState.wanted()).values_list(
            "name", flat=True
        )
    )


# "You can create up to 5,000 VMs with each call."
# https://cloud.google.com/compute/docs/instances/multiple/about-bulk-creation#limitations
BULK_INSERT_MAX = 5000


def create_workers(cloud, pool):
    """bulkInsert every missing node of the pool, up to BULK_INSERT_MAX a call (one call for any pool
    but the largest); a partial success is topped up, not redone."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    wanted = {cloud.n.instance(node): node for node in wanted_workers(cloud, pool["id"])}
    missing = sorted(set(wanted) - {i.name for i in list_instances(cloud, pool["id"])})
    template = f"projects/{cloud.project}/global/instanceTemplates/{cloud.n.template(pool['id'])}"
    for start in range(0, len(missing), BULK_INSERT_MAX):
        chunk = missing[start : start + BULK_INSERT_MAX]
        request = compute_v1.BulkInsertInstanceResource(
            count=len(chunk),
            min_count=len(chunk),
            source_instance_template=template,
            per_instance_properties={
                name: compute_v1.BulkInsertInstanceResourcePerInstanceProperties(name=name) for name in chunk
            },
        )
        try:
            operation = cloud.c.instances.bulk_insert_unary(
                project=cloud.project, zone=cloud.zone, bulk_insert_instance_resource_resource=request
            )
            cloud.wait(operation, f"bulkInsert of {len(chunk)} {pool['id']} nodes")
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, f"bulkInsert of {pool['id']} nodes") from None
        except TransientBackendError as exc:
            still = sorted(set(wanted) - {i.name for i in list_instances(cloud, pool["id"])})
            created = len(missing) - len(still)
            raise type(exc)(  # a CapacityError stays one: the stockout is waited out
                f"{exc} ({created} of {len(missing)} {pool['id']} nodes created; the rest will be retried)"
            ) from None


def delete_removed_workers(cloud):
    leaving = set(cloud.cluster.nodes.filter(state=NodeState.DELETING).values_list("name", flat=True))
    doomed = [
        i
        for i in list_instances(cloud)
        if i.labels.get("tcc-node") in leaving or i.name in {cloud.n.instance(n) for n in leaving}
    ]
    delete_each(cloud, doomed)


def delete_each(cloud, instances):
    """Send every delete first, then watch the list shrink: one list call per poll, not one wait per node."""
    from google.api_core import exceptions

    operations = {}
    for instance in instances:
        if not cloud.owned(instance):
            continue
        try:
            operations[instance.name] = cloud.c.instances.delete_unary(
                project=cloud.project, zone=cloud.zone, instance=instance.name
            )
        except exceptions.NotFound:
            continue
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, f"deleting {instance.name}") from None
    deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
    remaining = set(operations)
    while remaining:
        remaining &= {i.name for i in list_instances(cloud)}
        if not remaining:
            return
        if time.monotonic() > deadline:
            for name in sorted(remaining)[:3]:
                cloud.wait(operations[name], f"deleting {name}")  # raises the operation's own error
            raise TransientBackendError(f"{len(remaining)} instances are still being deleted")
        heartbeat(f"{len(remaining)} instances still being deleted")
        time.sleep(settings.GCE_POLL_INTERVAL)


def wait_running(cloud):
    wanted = {
        cloud.n.instance(node.name)
        for node in cloud.cluster.wanted_nodes().select_related("node_pool")
        if node.node_pool.role == NodeRole.COMPUTE
    }
    deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
    while True:
        running = {i.name for i in list_instances(cloud) if i.status == "RUNNING"}
        missing = wanted - running
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TransientBackendError(
                f"{len(missing)} instances are not running yet: {', '.join(sorted(missing)[:5])}"
            )
        heartbeat(f"{len(wanted) - len(missing)}/{len(wanted)} instances running")
        time.sleep(settings.GCE_POLL_INTERVAL)


STARTUP_MARK = "tcc-startup: "  # startup.sh's own lines on the serial console: "done", or "FAILED: <what>"


def startup_outcome(cloud, name):
    """The last tcc-startup line on the cluster instance's serial console ("done", "FAILED: ..."), or ""."""
    return serial_outcome(cloud.c, cloud.project, cloud.zone, name)


def serial_outcome(clients, project, zone, name):
    """The last tcc-startup line on an instance's serial console ("done", "FAILED: ..."), or ""."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    request = compute_v1.GetSerialPortOutputInstanceRequest(project=project, zone=zone, instance=name, port=1)
    try:
        output = clients.instances.get_serial_port_output(request=request)
    except exceptions.NotFound:
        return ""
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, f"reading {name}'s serial console") from None
    marks = [line.split(STARTUP_MARK, 1)[1].strip() for line in output.contents.splitlines() if STARTUP_MARK in line]
    return marks[-1] if marks else ""


# Serial consoles read per check of the nodes still waiting: a few calls, however large the pool.
STARTUP_CHECKS = 20


def failed_startups(cloud, nodes):
    """{node: "<instance>: startup script FAILED: <what>"} for the waiting compute nodes whose startup
    failed (the node that never registers: no NVIDIA driver on the image, a mount that failed), read
    from up to STARTUP_CHECKS of their serial consoles."""
    found = {}
    for node in nodes[:STARTUP_CHECKS]:
        name = cloud.n.instance(node)
        outcome = startup_outcome(cloud, name)
        if outcome.startswith("FAILED"):
            found[node] = f"{name}: startup script {outcome} (from its serial console)"
    return found


def wait_started(cloud):
    """Wait until the controller's and login nodes' startup scripts ran to the end (their last
    serial-console line says so); the first one that failed ends the operation with its failing line.
    Compute nodes are judged by Slurm instead: a node whose startup failed never registers. Then keep
    the controller's internal address: the console reaches its slurmrestd and agent there."""
    wait_done(cloud)
    controller = cloud.get(
        lambda: cloud.c.instances.get(project=cloud.project, zone=cloud.zone, instance=cloud.n.controller)
    )
    address = controller_address(controller)
    if address and (cloud.cluster.backend_state or {}).get("controller_ip") != address:
        cloud.backend.save_state(cloud.cluster, controller_ip=address)


def controller_address(controller):
    """Where the console reaches the controller: its internal address, or with GCE_CONTROLLER_ACCESS=external
    its external one (its first NIC's access config's natIP); "" while it has none."""
    nics = controller.network_interfaces if controller else []
    if not nics:
        return ""
    if network.external_access():
        return next((config.nat_i_p for config in nics[0].access_configs if config.nat_i_p), "")
    return nics[0].network_i_p


def wait_done(cloud):
    pending = set(slurm_conf.head_names(cloud))
    deadline = time.monotonic() + settings.GCE_STARTUP_TIMEOUT
    while pending:
        for name in sorted(pending):
            outcome = startup_outcome(cloud, name)
            if outcome.startswith("FAILED"):
                raise PermanentBackendError(f"{name}: startup script {outcome} (from its serial console)")
            if outcome == "done":
                pending.discard(name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TransientBackendError(f"startup not finished after {settings.GCE_STARTUP_TIMEOUT:.0f} s on "
                                        f"{', '.join(sorted(pending))}")  # fmt: skip
        heartbeat(f"waiting for the startup script on {', '.join(sorted(pending))}")
        time.sleep(settings.GCE_POLL_INTERVAL)


def delete_instances(cloud):
    delete_each(cloud, list_instances(cloud))


def delete_templates(cloud):
    for pool in cloud.compute_pools:
        name = cloud.n.template(pool["id"])
        cloud.remove(
            f"instance template {name}",
            lambda n=name: cloud.c.templates.get(project=cloud.project, instance_template=n),
            lambda n=name: cloud.c.templates.delete_unary(project=cloud.project, instance_template=n),
        )
        if is_gpu_pool(pool):
            policy = cloud.n.placement(pool["id"])
            cloud.remove(
                f"placement policy {policy}",
                lambda p=policy: cloud.c.policies.get(project=cloud.project, region=cloud.region, resource_policy=p),
                lambda p=policy: cloud.c.policies.delete_unary(
                    project=cloud.project, region=cloud.region, resource_policy=p
                ),
            )
