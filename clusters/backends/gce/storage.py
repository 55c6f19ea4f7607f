"""A gce cluster's storage: the Filestore /home and the Managed Lustre file system; and their removal.

Nodes mount them by the addresses the services give, never by instance name: Filestore by its IP and
share (`10.0.0.2:/home`), Managed Lustre by its mount point (`10.0.0.3@tcp:/lustrefs`). Both are
read after the create and kept in backend_state for the startup script."""

import time

from django.conf import settings

from ...spec.console_block import storage_tiers
from ...work import TransientBackendError, heartbeat
from .errors import map_api_error

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).


def create_filestore(cloud):
    from google.cloud import filestore_v1

    home = cloud.storage["filestore_home"]
    name = filestore_name(cloud)
    parent = name.rsplit("/instances/", 1)[0]
    cloud.ensure_lro(
        f"Filestore {cloud.n.filestore}",
        lambda: cloud.c.filestore.get_instance(name=name),
        lambda: cloud.c.filestore.create_instance(
            parent=parent,
            instance_id=cloud.n.filestore,
            instance=filestore_v1.Instance(
                tier=home["tier"],
                labels=cloud.labels,
                file_shares=[filestore_v1.FileShareConfig(name="home", capacity_gb=int(home["capacity_gb"]))],
                networks=[
                    filestore_v1.NetworkConfig(
                        network=cloud.network_name, connect_mode="PRIVATE_SERVICE_ACCESS", modes=["MODE_IPV4"]
                    )
                ],
            ),
        ),
    )
    found = cloud.c.filestore.get_instance(name=name)
    addresses = [ip for network in found.networks for ip in network.ip_addresses]
    if not addresses or not found.file_shares:
        raise TransientBackendError(f"Filestore {cloud.n.filestore} has no IP address or share yet")
    cloud.backend.save_state(cloud.cluster, home_share=f"{addresses[0]}:/{found.file_shares[0].name}")


def create_lustre(cloud):
    from google.cloud import lustre_v1

    lustre = cloud.storage["lustre"]
    parent = f"projects/{cloud.project}/locations/{cloud.zone}"
    name = f"{parent}/instances/{cloud.n.lustre}"
    cloud.ensure_lro(
        f"Managed Lustre {cloud.n.lustre}",
        lambda: cloud.c.lustre.get_instance(name=name),
        lambda: cloud.c.lustre.create_instance(
            parent=parent,
            instance_id=cloud.n.lustre,
            instance=lustre_v1.Instance(
                filesystem="lustrefs",
                capacity_gib=int(lustre["capacity_gb"]),
                per_unit_storage_throughput=int(lustre["performance_tier"]),
                network=cloud.network_url,
                labels=cloud.labels,
            ),
        ),
    )
    found = cloud.c.lustre.get_instance(name=name)
    if not found.mount_point:
        raise TransientBackendError(f"Managed Lustre {cloud.n.lustre} has no mount point yet")
    cloud.backend.save_state(cloud.cluster, lustre_mount_point=found.mount_point)


def filestore_name(cloud):
    """Filestore's full name: in the zone for basic, zonal and high scale tiers, in the region for regional
    and enterprise ones (https://cloud.google.com/filestore/docs/service-tiers)."""
    tier = (cloud.storage.get("filestore_home") or {}).get("tier", "")
    regional = storage_tiers()["filestore"].get(tier, {}).get("location") == "region"
    return (
        f"projects/{cloud.project}/locations/{cloud.region if regional else cloud.zone}/instances/{cloud.n.filestore}"
    )


def delete_storage(cloud):
    """Delete Managed Lustre and Filestore and wait until they are gone: the private services peering
    they use can be removed only after them."""
    from google.api_core import exceptions

    lustre = f"projects/{cloud.project}/locations/{cloud.zone}/instances/{cloud.n.lustre}"
    deleting = []
    for client, full in ((cloud.c.lustre, lustre), (cloud.c.filestore, filestore_name(cloud))):
        existing = cloud.get(lambda c=client, f=full: c.get_instance(name=f))
        if existing is None or not cloud.owned(existing):
            continue
        try:
            client.delete_instance(name=full)
        except exceptions.NotFound:
            continue
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, full.rsplit("/", 1)[-1]) from None
        deleting.append((client, full))
    deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
    for client, full in deleting:
        while cloud.get(lambda c=client, f=full: c.get_instance(name=f)) is not None:
            if time.monotonic() > deadline:
                raise TransientBackendError(f"{full.rsplit('/', 1)[-1]} is still being deleted")
            heartbeat(f"waiting for {full.rsplit('/', 1)[-1]} to be deleted")
            time.sleep(settings.GCE_POLL_INTERVAL)
