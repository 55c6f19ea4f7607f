"""One gce cluster's resources: its project, zone and names, and the generic create / delete / wait
that every seam (network, storage, instances, slurm_conf) builds on, with ownership and idempotence."""

import time

from django.conf import settings

from ...work import PermanentBackendError, TransientBackendError, heartbeat
from .errors import map_api_error, map_operation_errors
from .names import MARKER, OWNER_LABEL, names_for

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).


class Cloud:
    """What the steps of one gce cluster share: clients, project, zone, names and the spec's blocks."""

    def __init__(self, backend, cluster):
        self.backend, self.cluster, self.spec = backend, cluster, cluster.spec
        self.c = backend.clients_for(cluster.project)
        self.project = cluster.project.gcp_project_id
        if not self.project:
            raise PermanentBackendError(
                f"Project '{cluster.project.slug}' has no Google Cloud project id; set it in the admin"
            )
        self.n = names_for(cluster)
        if (cluster.backend_state or {}).get("gce_prefix") != self.n.prefix:
            backend.save_state(cluster, gce_prefix=self.n.prefix)  # kept, whatever names() becomes
        self.zone = next(p["zone"] for p in self.spec["node_pools"])
        self.region = self.zone.rsplit("-", 1)[0]
        console = self.spec.get("console") or {}
        self.network_block = console.get("network") or {}
        self.storage = console.get("storage") or {}
        login = self.spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        self.login_pool = next(p for p in self.spec["node_pools"] if p["id"] == login)
        self.compute_pools = [p for p in self.spec["node_pools"] if p["id"] != login]

    @property
    def labels(self):
        """The spec's labels and the console's own (which win) on every resource that takes labels."""
        return {**(self.spec.get("labels") or {}), OWNER_LABEL: self.n.prefix, "managed-by": "training-cluster-console"}

    @property
    def description(self):
        return f"{MARKER}; {OWNER_LABEL}={self.n.prefix}"

    def owned(self, resource):
        labels = dict(getattr(resource, "labels", {}) or {})
        return labels.get(OWNER_LABEL) == self.n.prefix or f"{OWNER_LABEL}={self.n.prefix}" in (
            getattr(resource, "description", "") or ""
        )

    @property
    def network_name(self):
        return (
            self.n.network if self.network_block.get("create") else self.spec["network"]["network"].rsplit("/", 1)[-1]
        )

    @property
    def network_url(self):
        """The cluster's VPC: the spec's own path when it names one (a Shared VPC lives in its host
        project, not the console's), else this project's network of that name."""
        given = "" if self.network_block.get("create") else self.spec["network"]["network"].strip("/")
        if given.startswith("projects/"):
            return given
        return f"projects/{self.project}/global/networks/{self.network_name}"

    @property
    def subnetwork_url(self):
        if self.network_block.get("create"):
            return f"projects/{self.project}/regions/{self.region}/subnetworks/{self.n.subnetwork}"
        return self.spec["network"].get("subnetwork", "")

    def get(self, fetch):
        from google.api_core import exceptions

        try:
            return fetch()
        except exceptions.NotFound:
            return None
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc) from None

    def ensure(self, what, fetch, insert):
        """Create a resource unless it exists; refuse one with our name that is not ours."""
        from google.api_core import exceptions

        existing = self.get(fetch)
        if existing is not None:
            if not self.owned(existing):
                raise PermanentBackendError(
                    f"{what} already exists and was not created by this cluster; rename the cluster"
                )
            return existing
        try:
            operation = insert()
        except exceptions.Conflict:
            return self.get(fetch)  # created by a concurrent rerun
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, what) from None
        self.wait(operation, what)
        return self.get(fetch)

    def remove(self, what, fetch, delete):
        from google.api_core import exceptions

        existing = self.get(fetch)
        if existing is None or not self.owned(existing):
            return
        try:
            operation = delete()
        except exceptions.NotFound:
            return
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, what) from None
        self.wait(operation, what)

    def wait(self, operation, what):
        return wait_operation(self.c, self.project, operation, what)

    def ensure_lro(self, what, fetch, create):
        """Like ensure(), for APIs with google.longrunning operations (Filestore, Lustre)."""
        from google.api_core import exceptions

        existing = self.get(fetch)
        if existing is not None:
            if not self.owned(existing):
                raise PermanentBackendError(f"{what} already exists and was not created by this cluster")
            return
        try:
            future = create()
        except exceptions.Conflict:
            return
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, what) from None
        deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
        while not future.operation.done:
            if time.monotonic() > deadline:
                raise TransientBackendError(f"{what}: still being created after {settings.GCE_OPERATION_TIMEOUT} s")
            heartbeat(f"{what}: still being created")
            time.sleep(settings.GCE_POLL_INTERVAL)
            future._refresh_and_update()
        if future.operation.HasField("error") and future.operation.error.code:
            raise PermanentBackendError(f"{what} failed: {future.operation.error.message}")


def wait_operation(clients, project, operation, what):
    """Wait for a Compute operation to be DONE with the operation clients' `wait` (a long poll: it
    answers when the operation is DONE or after about two minutes, maybe sooner), sleeping only when it
    answered early; then raise the operation's error if any.
    https://cloud.google.com/compute/docs/api/how-tos/api-requests-responses#handling_api_responses"""
    from google.cloud import compute_v1

    deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
    op = operation
    first = True
    while op.status != compute_v1.Operation.Status.DONE:
        if time.monotonic() > deadline:
            raise TransientBackendError(
                f"{what}: operation {op.name} still running after {settings.GCE_OPERATION_TIMEOUT} s"
            )
        heartbeat(f"{what}: waiting for Compute operation {op.name}")
        if not first:
            time.sleep(settings.GCE_POLL_INTERVAL)
        first = False
        if op.zone:
            op = clients.zone_operations.wait(project=project, zone=op.zone.rsplit("/", 1)[-1], operation=op.name)
        elif op.region:
            op = clients.region_operations.wait(project=project, region=op.region.rsplit("/", 1)[-1], operation=op.name)
        else:
            op = clients.global_operations.wait(project=project, operation=op.name)
    if op.error and op.error.errors:
        raise map_operation_errors(op.error.errors, what)
    return op
