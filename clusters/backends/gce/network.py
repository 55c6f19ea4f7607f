"""A gce cluster's network: VPC and subnetwork (when the spec asks for new ones), firewall rules and
private services access for Filestore and Managed Lustre; and their removal."""

from django.conf import settings

from ...work import PermanentBackendError, TransientBackendError

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
    url = (
        f"{settings.GCE_SERVICE_NETWORKING_ENDPOINT or cloud.c.endpoint or 'https://servicenetworking.googleapis.com'}"
    )
    session = cloud.c.session()
    network = f"projects/{cloud.project}/global/networks/{cloud.network_name}"
    existing = session.get(
        f"{url}/v1/services/servicenetworking.googleapis.com/connections", params={"network": network}
    )
    if existing.ok and existing.json().get("connections"):
        return
    created = session.post(
        f"{url}/v1/services/servicenetworking.googleapis.com/connections",
        json={"network": network, "reservedPeeringRanges": [cloud.n.psa_range]},
    )
    if not created.ok:
        raise PermanentBackendError(
            f"private services access peering failed: {created.status_code} {created.text[:300]}"
        )


def delete_firewalls(cloud):
    for name in (cloud.n.firewall_ssh, cloud.n.firewall_internal):
        cloud.remove(
            f"firewall rule {name}",
            lambda n=name: cloud.c.firewalls.get(project=cloud.project, firewall=n),
            lambda n=name: cloud.c.firewalls.delete_unary(project=cloud.project, firewall=n),
        )


def delete_private_services_access(cloud):
    if cloud.network_block.get("create"):
        # The peering belongs to the network this cluster created; on a shared VPC it is left alone.
        url = settings.GCE_SERVICE_NETWORKING_ENDPOINT or cloud.c.endpoint or "https://servicenetworking.googleapis.com"
        network = f"projects/{cloud.project}/global/networks/{cloud.network_name}"
        response = cloud.c.session().post(
            f"{url}/v1/services/servicenetworking.googleapis.com/connections/"
            "servicenetworking-googleapis-com:deleteConnection",
            json={"consumerNetwork": network},
        )
        if not response.ok and response.status_code != 404:
            raise TransientBackendError(f"deleting the private services peering failed: {response.status_code}")
    cloud.remove(
        f"private services range {cloud.n.psa_range}",
        lambda: cloud.c.addresses.get(project=cloud.project, address=cloud.n.psa_range),
        lambda: cloud.c.addresses.delete_unary(project=cloud.project, address=cloud.n.psa_range),
    )


def delete_network(cloud):
    if not cloud.network_block.get("create"):
        return
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
