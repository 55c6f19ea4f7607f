"""A gce cluster's storage: the Filestore /home and the Managed Lustre file system; and their removal.

Nodes mount them by the addresses the services give, never by instance name: Filestore by its IP and
share (`10.0.0.2:/home`), Managed Lustre by its mount point (`10.0.0.3@tcp:/lustrefs`). Both are
read after the create and kept in backend_state for the startup script."""

import re
import time

from django.conf import settings

from ...spec.console_block import storage_tiers
from ...work import PermanentBackendError, TransientBackendError, heartbeat
from . import identity
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


INSTANCE_NAME = re.compile(r"projects/[^/]+/locations/[a-z0-9-]+/instances/[a-z][-a-z0-9]*\Z")


def named_paths(spec):
    """(field path, instance name) for every existing file system the spec names."""
    home = spec["orchestrator_spec"]["slurm_spec"].get("home_directory_storage")
    if home:
        yield "orchestrator_spec.slurm_spec.home_directory_storage", home
    for i, pool in enumerate(spec["node_pools"]):
        for key in ("filestores", "lustres"):
            for j, name in enumerate(pool.get(key) or []):
                yield f"node_pools[{i}].{key}[{j}]", name


def existing_names(spec):
    """{instance name: (field path, kind)} of the file systems the spec names that exist already; kind is
    nfs (a pool's filestores), lustre (its lustres) or "" (the home directory storage: either)."""
    found = {}
    for path, name in named_paths(spec):
        kind = "nfs" if ".filestores[" in path else "lustre" if ".lustres[" in path else ""
        found.setdefault(name, (path, kind))
    return found


def read_existing(cloud):
    """Read each existing file system the spec names (its address, as for those the console creates) and
    keep `kind source` per name in backend_state for the startup script; one that does not exist stops
    the create with the field that names it."""
    mounts = {}
    for name, (field, kind) in existing_names(cloud.spec).items():
        found = None
        if kind in ("", "nfs"):
            found = cloud.get(lambda n=name: cloud.c.filestore.get_instance(name=n))
            if found is not None:
                addresses = [ip for network in found.networks for ip in network.ip_addresses]
                if not addresses or not found.file_shares:
                    raise TransientBackendError(f"Filestore {name} has no IP address or share yet")
                mounts[name] = f"nfs {addresses[0]}:/{found.file_shares[0].name}"
        if found is None and kind in ("", "lustre"):
            found = cloud.get(lambda n=name: cloud.c.lustre.get_instance(name=n))
            if found is not None:
                if not found.mount_point:
                    raise TransientBackendError(f"Managed Lustre {name} has no mount point yet")
                mounts[name] = f"lustre {found.mount_point}"
        if found is None:
            what = {"nfs": "Filestore instance", "lustre": "Managed Lustre instance"}.get(
                kind, "Filestore or Lustre instance"
            )
            raise PermanentBackendError(f"{field}: no {what} {name}")
    cloud.backend.save_state(cloud.cluster, existing_mounts=mounts)


def mount_point(spec, name):
    """Where nodes mount an existing file system: /home for the home directory storage, else
    /mnt/<instance id>."""
    if name == spec["orchestrator_spec"]["slurm_spec"].get("home_directory_storage"):
        return "/home"
    return f"/mnt/{name.rsplit('/', 1)[-1]}"


def existing_mounts(cloud, pool):
    """ "kind source point" for each existing file system a node of `pool` mounts: the home on every node,
    a pool's filestores and lustres on its own nodes."""
    known = (cloud.cluster.backend_state or {}).get("existing_mounts") or {}
    home = cloud.spec["orchestrator_spec"]["slurm_spec"].get("home_directory_storage")
    names = ([home] if home else []) + list(pool.get("filestores") or []) + list(pool.get("lustres") or [])
    missing = [n for n in names if n not in known]
    if missing:
        raise TransientBackendError(f"the address of {missing[0]} is not known yet (a storage step reads it)")
    return [f"{known[n]} {mount_point(cloud.spec, n)}" for n in dict.fromkeys(names)]


OBJECT_USER = "roles/storage.objectUser"


def ensure_buckets(cloud):
    """The Cloud Storage buckets the spec mounts: each is made in the cluster's region with uniform
    bucket-level access when it does not exist (and kept after the cluster: checkpoints outlive it), and
    the nodes' service account gets objectUser on it so gcsfuse can read and write.
    https://cloud.google.com/storage/docs/creating-buckets, https://cloud.google.com/storage/docs/uniform-bucket-level-access"""
    session, base = cloud.c.session(), f"{cloud.c.rest_url('storage')}/storage/v1"
    member = identity.member(cloud)
    for bucket in cloud.storage.get("gcs_buckets", []):
        name = bucket["bucket"]
        found = session.get(f"{base}/b/{name}")
        if found.status_code == 404:
            created = session.post(
                f"{base}/b",
                params={"project": cloud.project},
                json={
                    "name": name,
                    "location": cloud.region,
                    "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}},
                    "labels": cloud.labels,
                },
            )
            if created.status_code == 409:
                raise PermanentBackendError(
                    f"console.storage.gcs_buckets: the bucket name {name} is taken by another project "
                    "(bucket names are global); choose another"
                )
            if not created.ok:
                raise TransientBackendError(f"creating bucket {name}: {created.status_code} {created.text[:200]}")
        elif found.status_code == 403:
            raise PermanentBackendError(
                f"console.storage.gcs_buckets: bucket {name} exists, but the console's credentials cannot read it"
            )
        elif not found.ok:
            raise TransientBackendError(f"reading bucket {name}: {found.status_code}")
        identity.retried(lambda name=name: set_bucket_member(session, base, name, member, add=True))


def set_bucket_member(session, base, name, member, *, add):
    """objectUser on bucket `name` for `member` (add), or not (remove), in the bucket's own policy."""
    policy = session.get(f"{base}/b/{name}/iam")
    if policy.status_code == 404 and not add:
        return
    if not policy.ok:
        raise PermanentBackendError(f"reading bucket {name}'s IAM policy: {policy.status_code}")
    body = policy.json()
    if not identity.set_member(body, OBJECT_USER, member, add=add):
        return
    written = session.put(f"{base}/b/{name}/iam", json=body)
    if not written.ok:
        verb = "granting the nodes access to" if add else "revoking the nodes' access to"
        raise PermanentBackendError(f"{verb} bucket {name}: {written.status_code} {written.text[:200]}")


def revoke_buckets(cloud):
    """The cluster's account off the buckets it mounted (they outlive the cluster; its account does not)."""
    session, base = cloud.c.session(), f"{cloud.c.rest_url('storage')}/storage/v1"
    member = identity.member(cloud)
    for bucket in cloud.storage.get("gcs_buckets", []):
        set_bucket_member(session, base, bucket["bucket"], member, add=False)


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
