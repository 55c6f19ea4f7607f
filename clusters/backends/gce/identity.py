"""A gce cluster's own cloud identity: the service account its VMs run as.

Every VM of a cluster runs as that cluster's service account (`<name>-<digest>@PROJECT.iam.gserviceaccount.com`,
made by the console, deleted with the cluster), granted only what its nodes need, on those resources
and never project-wide: secretAccessor on the cluster's own four secrets (keys.py), objectUser on the
buckets its spec mounts (storage.py), and the project roles named in GCE_NODE_PROJECT_ROLES (log and
metric writers, which exist only at the project level). A job that gets a node's token therefore
reads that cluster's keys and buckets, not another cluster's; and the nodes refuse the metadata
server to every uid but root (startup.sh), so a job gets no token at all.

A spec that names `runtime_spec.service_account`, or GCE_SERVICE_ACCOUNT set to an email or `default`
(the project's Compute Engine default account), uses that account as it is: the console creates and
grants nothing project-wide for it (the secret and bucket grants still name it).

IAM is eventually consistent: a new account may not be seen for a minute
(https://cloud.google.com/iam/docs/service-accounts-create: "After you create a service account, you
might need to wait for 60 seconds or more before you use the service account ... retry the request
with exponential backoff"), so its first uses are retried for GCE_IAM_PROPAGATION_TIMEOUT.
"""

import time
from urllib.parse import quote

from django.conf import settings

from ...work import PermanentBackendError, TransientBackendError
from .errors import SERVICE_ACCOUNT_UNSEEN
from .names import MARKER


def makes_account(spec):
    """True when a cluster of this spec runs as an account the console makes for it (no account named)."""
    return not (spec.get("runtime_spec") or {}).get("service_account") and settings.GCE_SERVICE_ACCOUNT == "cluster"


def per_cluster(cloud):
    return makes_account(cloud.spec)


def cluster_email(n, project):
    """The email of the account the console makes for the cluster of names `n` in `project`."""
    return f"{n.service_account_id}@{project}.iam.gserviceaccount.com"


def email(cloud):
    """The email the cluster's VMs run as ("default": the project's Compute Engine default account)."""
    if per_cluster(cloud):
        return cluster_email(cloud.n, cloud.project)
    return (cloud.spec.get("runtime_spec") or {}).get("service_account") or settings.GCE_SERVICE_ACCOUNT


def member(cloud):
    """The IAM member the cluster's VMs are: their account, or the project's Compute Engine default one
    (PROJECT_NUMBER-compute@developer.gserviceaccount.com,
    https://cloud.google.com/compute/docs/access/service-accounts#default_service_account)."""
    from .network import project_number

    address = email(cloud)
    if address == "default":
        address = f"{project_number(cloud, cloud.project)}-compute@developer.gserviceaccount.com"
    return f"serviceAccount:{address}"


def account_url(cloud):
    return f"{cloud.c.rest_url('iam')}/v1/projects/{cloud.project}/serviceAccounts/{quote(email(cloud), safe='@')}"


def read_account(cloud, session):
    """The cluster's account as IAM answers it, or None when there is none."""
    found = session.get(account_url(cloud))
    if found.status_code == 404:
        return None
    if not found.ok:
        raise answer_error(found, f"reading service account {email(cloud)}")
    return found.json()


def create_service_account(cloud):
    """The cluster's account (unless there already: a rerun finds it), then its project roles."""
    if not per_cluster(cloud):
        return
    session = cloud.c.session()
    found = read_account(cloud, session)
    if found is not None:
        if MARKER not in (found.get("description") or ""):
            raise PermanentBackendError(
                f"service account {email(cloud)} already exists and was not created by this cluster"
            )
    else:
        made = session.post(
            f"{cloud.c.rest_url('iam')}/v1/projects/{cloud.project}/serviceAccounts",
            json={
                "accountId": cloud.n.service_account_id,
                "serviceAccount": {
                    "displayName": f"Nodes of cluster {cloud.cluster.name}"[:100],
                    "description": f"{MARKER}; {cloud.n.prefix}",
                },
            },
        )
        if made.status_code not in (200, 409):  # 409: a concurrent rerun made it
            raise answer_error(made, f"creating service account {email(cloud)}")
    set_project_roles(cloud, add=True)


def retried(call):
    """call() again while its error says the nodes' new account is not seen yet (IAM's propagation)."""
    deadline = time.monotonic() + settings.GCE_IAM_PROPAGATION_TIMEOUT
    delay = settings.GCE_POLL_INTERVAL
    while True:
        try:
            return call()
        except Exception as exc:  # re-raised unless it is IAM's propagation delay
            if not SERVICE_ACCOUNT_UNSEEN.search(str(getattr(exc, "message", exc))) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 10)


def set_project_roles(cloud, *, add):
    """GCE_NODE_PROJECT_ROLES for the cluster's account on the project (add), or none (remove): a read,
    change and write with the policy's etag, again when another writer got in between (409 ABORTED,
    https://cloud.google.com/iam/docs/policies#etag)."""
    if not settings.GCE_NODE_PROJECT_ROLES:
        return
    for _attempt in range(5):
        if retried(lambda: write_project_roles(cloud, add)):
            return
    raise TransientBackendError("the project's IAM policy kept changing while the console wrote it; retrying")


def write_project_roles(cloud, add):
    """One read-change-write of the project's policy: True when done, False when the etag was stale."""
    who = member(cloud)
    session = cloud.c.session()
    base = f"{cloud.c.rest_url('resourcemanager')}/v3/projects/{cloud.project}"
    read = session.post(f"{base}:getIamPolicy", json={"options": {"requestedPolicyVersion": 3}})
    if not read.ok:
        raise answer_error(read, "reading the project's IAM policy")
    policy = read.json()
    changed = [set_member(policy, role, who, add=add) for role in settings.GCE_NODE_PROJECT_ROLES]
    if not any(changed):
        return True
    written = session.post(f"{base}:setIamPolicy", json={"policy": policy})
    if written.status_code == 409:
        return False
    if not written.ok:
        raise answer_error(written, "writing the project's IAM policy")
    return True


def delete_service_account(cloud):
    """Its project roles first (a deleted account's bindings linger as deleted:serviceAccount:...), then it."""
    if not per_cluster(cloud):
        return
    session = cloud.c.session()
    found = read_account(cloud, session)
    if found is None or MARKER not in (found.get("description") or ""):
        return  # gone already, or not the console's: leave it
    from .storage import revoke_buckets

    set_project_roles(cloud, add=False)
    revoke_buckets(cloud)
    gone = session.delete(account_url(cloud))
    if gone.status_code not in (200, 404):
        raise answer_error(gone, f"deleting service account {email(cloud)}")


def set_member(policy, role, member, *, add):
    """`member` into (add) or out of the policy's unconditional binding of `role`, in a JSON IAM policy
    (bindings left empty go); True when the policy changed."""
    bindings = policy.setdefault("bindings", [])
    binding = next((b for b in bindings if b.get("role") == role and not b.get("condition")), None)
    members = binding.get("members", []) if binding else []
    if add == (member in members):
        return False
    if add:
        if binding is None:
            binding = {"role": role, "members": []}
            bindings.append(binding)
        binding.setdefault("members", []).append(member)
    else:
        members.remove(member)
        policy["bindings"] = [b for b in bindings if b.get("members")]
    return True


def answer_error(answer, what):
    """A REST answer's error as a BackendError: 403 is a missing permission, 429/5xx a retry."""
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = answer.text[:200]
    if answer.status_code == 403:
        return PermanentBackendError(f"{what}: permission denied: {message}")
    if answer.status_code in (429, 500, 502, 503, 504):
        return TransientBackendError(f"{what}: {answer.status_code} {message}")
    return PermanentBackendError(f"{what}: {message}")
