"""A gce cluster's network: VPC and subnetwork (when the spec asks for new ones), firewall rules and
private services access for Filestore and Managed Lustre; and their removal."""

import time

from django.conf import settings

from ...work import PermanentBackendError, TransientBackendError, heartbeat
from .cloud import wait_operation
from .errors import map_api_error
from .names import owner_and_name

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).


def create_network(cloud):
    from google.cloud import compute_v1

    cloud.ensure(
        f"network {cloud.n.network}",
        lambda: cloud.c.networks.get(project=cloud.project, network=cloud.n.network),
        lambda: cloud.c.networks.insert_unary(
            project=cloud.project,
            network_resource=compute_v1.Network(
                name=cloud.n.network,
                auto_create_subnetworks=False,
                mtu=int(cloud.network_block.get("mtu", 1460)),
                description=cloud.description,
            ),
        ),
    )


def create_subnetwork(cloud):
    from google.cloud import compute_v1

    cloud.ensure(
        f"subnetwork {cloud.n.subnetwork}",
        lambda: cloud.c.subnetworks.get(project=cloud.project, region=cloud.region, subnetwork=cloud.n.subnetwork),
        lambda: cloud.c.subnetworks.insert_unary(
            project=cloud.project,
            region=cloud.region,
            subnetwork_resource=compute_v1.Subnetwork(
                name=cloud.n.subnetwork,
                network=cloud.network_url,
                ip_cidr_range=cloud.network_block.get("subnet_range", "10.0.0.0/16"),
                private_ip_google_access=True,
                description=cloud.description,
            ),
        ),
    )


def no_route_to_new_vpc():
    """Why a console that reaches its clusters cannot create one in a VPC of its own without GCE_CONSOLE_NETWORK."""
    return (
        "the console's workers would have no route to this cluster's new VPC: set GCE_CONSOLE_NETWORK to their "
        "network (it is peered with each new VPC), or create the cluster in an existing network the workers "
        "are in (network.create false), or GCE_CONTROLLER_ACCESS=external for a console outside Google Cloud "
        "(the controller gets an external address), or GCE_REACH_CLUSTERS=false for a console that only provisions"
    )


def console_ranges_problem():
    """Why GCE_CONSOLE_RANGES cannot admit the console to a controller ("" when it can): it must be set,
    every entry a CIDR range, and with an external controller address none may be the whole internet
    (slurmrestd and the agent would face every scanner; both check keys, but only the console should
    reach them at all)."""
    import ipaddress

    if not settings.GCE_CONSOLE_RANGES:
        return (
            "GCE_CONSOLE_RANGES is empty: set it to the addresses the console's workers reach the clusters "
            "from (their subnet), or GCE_REACH_CLUSTERS=false for a console that only provisions"
        )
    for entry in settings.GCE_CONSOLE_RANGES:
        try:
            network = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            return f"GCE_CONSOLE_RANGES holds {entry!r}, which is not an address range (e.g. 203.0.113.0/28)"
        if external_access() and network.prefixlen == 0:
            return (
                f"GCE_CONSOLE_RANGES holds {entry}: with GCE_CONTROLLER_ACCESS=external that admits the whole "
                "internet to every controller's slurmrestd and agent; name the console's egress addresses"
            )
    return ""


def reach_problem(network_block):
    """Why the console's workers could not reach the controller of a cluster with this console.network
    block ("" when they can): the ranges the firewall would admit, then a route to a new VPC (its peering
    with GCE_CONSOLE_NETWORK, or the controller's external address). The create's firewall step and
    preflight's "console reach" check both ask this."""
    if problem := console_ranges_problem():
        return problem
    if network_block.get("create") and not settings.GCE_CONSOLE_NETWORK and not external_access():
        return no_route_to_new_vpc()
    return ""


def external_access():
    """Does the console reach controllers at an external address (GCE_CONTROLLER_ACCESS=external: a console
    outside Google Cloud) rather than at their internal one through the VPC or a peering?"""
    return settings.GCE_CONTROLLER_ACCESS == "external"


def create_console_peering(cloud):
    """Peer the cluster's VPC with the console's (GCE_CONSOLE_NETWORK), both ways, so the console's workers
    have a route to the controller; a peering is made on each side
    (https://cloud.google.com/vpc/docs/using-vpc-peering#creating_a_peering_configuration)."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    console_project, console_name = owner_and_name(settings.GCE_CONSOLE_NETWORK, cloud.project)
    sides = (
        (cloud.project, cloud.network_name, settings.GCE_CONSOLE_NETWORK.strip("/")),
        (console_project, console_name, cloud.network_url),
    )
    for project, network, peer in sides:
        found = cloud.get(lambda p=project, n=network: cloud.c.networks.get(project=p, network=n))
        if found is None:
            raise PermanentBackendError(f"network projects/{project}/global/networks/{network} does not exist")
        if any(p.name == cloud.n.console_peering for p in found.peerings):
            continue
        request = compute_v1.NetworksAddPeeringRequest(
            network_peering=compute_v1.NetworkPeering(
                name=cloud.n.console_peering, network=peer, exchange_subnet_routes=True
            )
        )
        try:
            operation = cloud.c.networks.add_peering(
                project=project, network=network, networks_add_peering_request_resource=request
            )
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, f"peering {network} with {peer}") from None
        wait_operation(cloud.c, project, operation, f"peering {network} with {peer}")  # in the network's project


def delete_console_peering(cloud):
    """Remove the console's side of the peering (the cluster's side goes with its network)."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    if not settings.GCE_CONSOLE_NETWORK or not cloud.network_block.get("create"):
        return
    project, name = owner_and_name(settings.GCE_CONSOLE_NETWORK, cloud.project)
    found = cloud.get(lambda: cloud.c.networks.get(project=project, network=name))
    if found is None or not any(p.name == cloud.n.console_peering for p in found.peerings):
        return
    request = compute_v1.NetworksRemovePeeringRequest(name=cloud.n.console_peering)
    try:
        operation = cloud.c.networks.remove_peering(
            project=project, network=name, networks_remove_peering_request_resource=request
        )
    except exceptions.NotFound:
        return
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, f"removing the peering from {name}") from None
    wait_operation(cloud.c, project, operation, f"removing the peering from {name}")


def create_nat(cloud):
    """Cloud NAT for the cluster's region (console.network.cloud_nat): nodes have no external address,
    and without NAT nothing on them reaches the internet (package mirrors, pip, Hugging Face); a baked
    image (`manage.py gce_image build`) needs none. A Cloud Router on the network with one NAT gateway
    for every subnet range, Google-allocated addresses.
    https://cloud.google.com/nat/docs/set-up-manage-network-address-translation"""
    from google.cloud import compute_v1

    cloud.ensure(
        f"Cloud NAT {cloud.n.router}",
        lambda: cloud.c.routers.get(project=cloud.project, region=cloud.region, router=cloud.n.router),
        lambda: cloud.c.routers.insert_unary(
            project=cloud.project,
            region=cloud.region,
            router_resource=compute_v1.Router(
                name=cloud.n.router,
                network=cloud.network_url,
                description=cloud.description,
                nats=[
                    compute_v1.RouterNat(
                        name=cloud.n.nat,
                        nat_ip_allocate_option="AUTO_ONLY",
                        source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                    )
                ],
            ),
        ),
    )


def delete_nat(cloud):
    cloud.remove(
        f"Cloud NAT {cloud.n.router}",
        lambda: cloud.c.routers.get(project=cloud.project, region=cloud.region, router=cloud.n.router),
        lambda: cloud.c.routers.delete_unary(project=cloud.project, region=cloud.region, router=cloud.n.router),
    )


def create_firewalls(cloud):
    from google.cloud import compute_v1

    rules = [
        compute_v1.Firewall(
            name=cloud.n.firewall_internal,
            network=cloud.network_url,
            # The cluster's own VMs only, not everything in the subnet (an existing VPC is shared).
            source_tags=[cloud.n.cluster_tag],
            target_tags=[cloud.n.cluster_tag],
            allowed=[compute_v1.Allowed(I_p_protocol="all")],
            description=cloud.description,
        ),
        compute_v1.Firewall(
            name=cloud.n.firewall_ssh,
            network=cloud.network_url,
            source_ranges=settings.GCE_SSH_SOURCE_RANGES,
            target_tags=[f"{cloud.n.prefix}-login"],
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
            description=cloud.description,
        ),
    ]
    if settings.GCE_REACH_CLUSTERS:
        if problem := reach_problem(cloud.network_block):
            raise PermanentBackendError(problem)
        # The console's workers only (GCE_CONSOLE_RANGES): to the controller's two doors, and the router to
        # the compute nodes' serving replicas on their port range (reached at internal addresses only:
        # with external access the compute nodes have none the console could use, so no rule).
        doors = [str(settings.GCE_SLURMRESTD_PORT), str(settings.GCE_AGENT_PORT)]
        replicas = ["{}-{}".format(*settings.SERVING_REPLICA_PORTS)]
        admitted = [(cloud.n.firewall_console, "controller", doors)]
        if not external_access():
            admitted.append((cloud.n.firewall_serving, "compute", replicas))
        for name, role, ports in admitted:
            rules.append(
                compute_v1.Firewall(
                    name=name,
                    network=cloud.network_url,
                    source_ranges=settings.GCE_CONSOLE_RANGES,
                    target_tags=[f"{cloud.n.prefix}-{role}"],
                    allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=ports)],
                    description=cloud.description,
                )
            )
    for rule in rules:
        cloud.ensure(
            f"firewall rule {rule.name}",
            lambda r=rule: cloud.c.firewalls.get(project=cloud.project, firewall=r.name),
            lambda r=rule: cloud.c.firewalls.insert_unary(project=cloud.project, firewall_resource=r),
        )


def create_private_services_access(cloud):
    from google.cloud import compute_v1

    address, prefix = cloud.network_block["private_services_range"].split("/")
    cloud.ensure(
        f"private services range {cloud.n.psa_range}",
        lambda: cloud.c.addresses.get(project=cloud.project, address=cloud.n.psa_range),
        lambda: cloud.c.addresses.insert_unary(
            project=cloud.project,
            address_resource=compute_v1.Address(
                name=cloud.n.psa_range,
                address=address,
                prefix_length=int(prefix),
                address_type="INTERNAL",
                purpose="VPC_PEERING",
                network=cloud.network_url,
                labels=cloud.labels,
                description=cloud.description,
            ),
        ),
    )
    session, url = cloud.c.session(), cloud.c.rest_url("servicenetworking")
    network = consumer_network(cloud)
    existing = session.get(f"{url}/v1/{CONNECTIONS}", params={"network": network})
    if existing.ok and existing.json().get("connections"):
        return
    created = session.post(
        f"{url}/v1/{CONNECTIONS}", json={"network": network, "reservedPeeringRanges": [cloud.n.psa_range]}
    )
    if not created.ok:
        raise PermanentBackendError(
            f"private services access peering failed: {created.status_code} {created.text[:300]}"
        )
    await_networking(cloud, created.json(), "private services access peering")


# Service Networking's connections of the consumer network, to Google's service producers.
# https://cloud.google.com/service-infrastructure/docs/service-networking/reference/rest/v1/services.connections
CONNECTIONS = "services/servicenetworking.googleapis.com/connections"


def consumer_network(cloud):
    """The cluster's VPC as Service Networking names it: `projects/{project NUMBER}/global/networks/N`
    (the connections API takes the number, not the id), in the project the network lives in."""
    project, _name = owner_and_name(cloud.network_url, cloud.project)
    return f"projects/{project_number(cloud, project)}/global/networks/{cloud.network_name}"


def project_number(cloud, project):
    """A project's number, from Resource Manager (v3 projects.get answers `name: projects/NUMBER`)."""
    known = (cloud.cluster.backend_state or {}).get("project_numbers") or {}
    if project in known:
        return known[project]
    url = cloud.c.rest_url("resourcemanager")
    answer = cloud.c.session().get(f"{url}/v3/projects/{project}")
    if answer.status_code in (403, 404):
        raise PermanentBackendError(
            f"cannot read project {project} from Resource Manager ({answer.status_code}): the credentials "
            "need resourcemanager.projects.get on it"
        )
    if not answer.ok:
        raise TransientBackendError(f"reading project {project}'s number: {answer.status_code}")
    number = answer.json()["name"].rsplit("/", 1)[-1]
    cloud.backend.save_state(cloud.cluster, project_numbers={**known, project: number})
    return number


def await_networking(cloud, operation, what):
    """Poll a Service Networking long-running operation (`operations/...`) until done; raise its error."""
    deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
    session, url = cloud.c.session(), cloud.c.rest_url("servicenetworking")
    while not operation.get("done"):
        if time.monotonic() > deadline:
            raise TransientBackendError(f"{what}: still running after {settings.GCE_OPERATION_TIMEOUT:.0f} s")
        heartbeat(f"{what}: waiting for operation {operation.get('name')}")
        time.sleep(settings.GCE_POLL_INTERVAL)
        answer = session.get(f"{url}/v1/{operation['name']}")
        if not answer.ok:
            raise TransientBackendError(f"{what}: reading its operation failed: {answer.status_code}")
        operation = answer.json()
    if operation.get("error"):
        error = operation["error"]
        raise PermanentBackendError(f"{what} failed: {error.get('message') or error}")


def delete_firewalls(cloud):
    for name in (cloud.n.firewall_serving, cloud.n.firewall_console, cloud.n.firewall_ssh, cloud.n.firewall_internal):
        cloud.remove(
            f"firewall rule {name}",
            lambda n=name: cloud.c.firewalls.get(project=cloud.project, firewall=n),
            lambda n=name: cloud.c.firewalls.delete_unary(project=cloud.project, firewall=n),
        )


def delete_private_services_access(cloud):
    if cloud.network_block.get("create"):
        # The peering belongs to the network this cluster created; on a shared VPC it is left alone. Service
        # Networking refuses while a producer (Filestore, Lustre) still uses it: storage goes first.
        response = cloud.c.session().post(
            f"{cloud.c.rest_url('servicenetworking')}/v1/{CONNECTIONS}/servicenetworking-googleapis-com:deleteConnection",
            json={"consumerNetwork": consumer_network(cloud)},
        )
        if response.ok:
            await_networking(cloud, response.json(), "deleting the private services peering")
        elif response.status_code != 404:
            raise TransientBackendError(
                f"deleting the private services peering failed: {response.status_code} {response.text[:300]}"
            )
    cloud.remove(
        f"private services range {cloud.n.psa_range}",
        lambda: cloud.c.addresses.get(project=cloud.project, address=cloud.n.psa_range),
        lambda: cloud.c.addresses.delete_unary(project=cloud.project, address=cloud.n.psa_range),
    )


def delete_network(cloud):
    if not cloud.network_block.get("create"):
        return
    delete_nat(cloud)  # a router uses the network: it goes first
    delete_console_peering(cloud)
    cloud.remove(
        f"subnetwork {cloud.n.subnetwork}",
        lambda: cloud.c.subnetworks.get(project=cloud.project, region=cloud.region, subnetwork=cloud.n.subnetwork),
        lambda: cloud.c.subnetworks.delete_unary(
            project=cloud.project, region=cloud.region, subnetwork=cloud.n.subnetwork
        ),
    )
    cloud.remove(
        f"network {cloud.n.network}",
        lambda: cloud.c.networks.get(project=cloud.project, network=cloud.n.network),
        lambda: cloud.c.networks.delete_unary(project=cloud.project, network=cloud.n.network),
    )
