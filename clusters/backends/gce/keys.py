"""A gce cluster's keys, in Secret Manager: the munge key (every node reads it at boot), the JWT key
(slurmctld checks the tokens the console signs with it), the agent key (the cluster agent checks
the bearer the console sends) and the controller's TLS bundle (its key and certificate, signed by a CA
made for this cluster alone, whose certificate the console pins: clusters/tls.py). Each is made once,
labelled as the cluster's, and never in instance metadata, the console's database, a page or a log; the
console reads the ones it needs from Secret Manager with its own credentials and keeps them in memory only."""

import contextlib
import secrets as random_source
import threading

from ... import tls
from ...work import PermanentBackendError
from . import identity
from .errors import map_api_error

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).

MAKERS = {
    "munge": lambda cloud: random_source.token_bytes(1024),  # munge's own keys are 1 KiB
    "jwt": lambda cloud: random_source.token_bytes(32),
    "agent": lambda cloud: random_source.token_bytes(32),
    "tls": lambda cloud: tls.controller_bundle(cloud.n.prefix),
}

# (endpoint, secret name, cluster id, TLS generation) -> bytes: a cluster made again under the same name (new
# keys) has another id, and the TLS bundle, the one key that changes while a cluster exists (a rotation:
# replace_key), changes with the generation the rotation records in the cluster's backend_state, so no
# worker keeps an old one past its next task.
_cache = {}
_lock = threading.Lock()


def secret_name(cloud, kind):
    return f"projects/{cloud.project}/secrets/{cloud.n.secret(kind)}"


def create_keys(cloud):
    """Each key's secret and its one version, unless there already (a rerun finds them)."""
    from google.api_core import exceptions
    from google.cloud import secretmanager_v1

    for kind, make in MAKERS.items():
        name = secret_name(cloud, kind)
        secret = cloud.get(lambda name=name: cloud.c.secrets.get_secret(name=name))
        if secret is None:
            try:
                cloud.c.secrets.create_secret(
                    parent=f"projects/{cloud.project}",
                    secret_id=cloud.n.secret(kind),
                    secret=secretmanager_v1.Secret(
                        replication=secretmanager_v1.Replication(automatic=secretmanager_v1.Replication.Automatic()),
                        labels=cloud.labels,
                    ),
                )
            except exceptions.AlreadyExists:
                pass  # made by a concurrent rerun
            except exceptions.GoogleAPICallError as exc:
                raise map_api_error(exc, f"creating the {kind} key secret") from None
        elif not cloud.owned(secret):
            raise PermanentBackendError(
                f"secret {cloud.n.secret(kind)} already exists and was not created by this cluster"
            )
        if not list(cloud.c.secrets.list_secret_versions(parent=name)):
            cloud.c.secrets.add_secret_version(parent=name, payload=secretmanager_v1.SecretPayload(data=make(cloud)))
        grant_nodes(cloud, name)


ACCESSOR = "roles/secretmanager.secretAccessor"


def grant_nodes(cloud, name):
    """secretAccessor on this one secret for the nodes' service account, never project-wide: one cluster's
    nodes read their own keys, not another cluster's
    (https://cloud.google.com/secret-manager/docs/manage-access-to-secrets#secretmanager-grant-access)."""
    from google.api_core import exceptions

    member = identity.member(cloud)

    def grant():
        policy = cloud.c.secrets.get_iam_policy(request={"resource": name})
        binding = next((b for b in policy.bindings if b.role == ACCESSOR), None)
        if binding is not None and member in binding.members:
            return
        if binding is None:
            binding = policy.bindings.add(role=ACCESSOR)
        binding.members.append(member)
        cloud.c.secrets.set_iam_policy(request={"resource": name, "policy": policy})

    try:
        identity.retried(grant)
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, f"granting the nodes access to {name}") from None


def delete_keys(cloud):
    from google.api_core import exceptions

    for kind in MAKERS:
        name = secret_name(cloud, kind)
        secret = cloud.get(lambda name=name: cloud.c.secrets.get_secret(name=name))
        if secret is None or not cloud.owned(secret):
            continue
        with contextlib.suppress(exceptions.NotFound):
            cloud.c.secrets.delete_secret(name=name)
        forget(name)


def replace_key(cloud, kind, data):
    """`data` becomes the key's only version: added, then every older version destroyed (a rotated key, the
    controller's old TLS private key among them, is not readable again)
    (https://cloud.google.com/secret-manager/docs/destroy-secret-versions)."""
    from google.api_core import exceptions
    from google.cloud import secretmanager_v1

    name = secret_name(cloud, kind)
    try:
        added = cloud.c.secrets.add_secret_version(parent=name, payload=secretmanager_v1.SecretPayload(data=data))
        for version in cloud.c.secrets.list_secret_versions(parent=name):
            if version.name != added.name and version.state != secretmanager_v1.SecretVersion.State.DESTROYED:
                cloud.c.secrets.destroy_secret_version(name=version.name)
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, f"replacing the {kind} key") from None
    forget(name)


def forget(name):
    """Drop every cached copy of the secret `name` in this process (whatever cluster or generation)."""
    with _lock:
        for key in [k for k in _cache if k[1] == name]:
            del _cache[key]


def cluster_ca(cloud):
    """The cluster's CA certificate (PEM), from the controller's TLS bundle: what the console pins."""
    return tls.ca_of(read_key(cloud, "tls"))


def read_key(cloud, kind):
    """The key's bytes, read once per console process (Secret Manager's access call)."""
    name = secret_name(cloud, kind)
    key = (cloud.c.endpoint, name, cloud.cluster.pk, (cloud.cluster.backend_state.get("tls") or {}).get("generation"))
    with _lock:
        if key in _cache:
            return _cache[key]
    found = cloud.get(lambda: cloud.c.secrets.access_secret_version(name=f"{name}/versions/latest"))
    if found is None:
        raise PermanentBackendError(f"the cluster's {kind} key ({cloud.n.secret(kind)}) is missing in Secret Manager")
    with _lock:
        _cache[key] = found.payload.data
    return found.payload.data
