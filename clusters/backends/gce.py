"""The `gce` backend: the same cluster spec as Compute Engine resources, with google-cloud-compute.

What it creates, in dependency order (each one an operation step): the VPC network with the spec's
MTU and its subnetwork, firewall rules (internal traffic; SSH to the login node only), a private
services access range and its peering (for Filestore / Managed Lustre), the Filestore /home, the
Managed Lustre file system, a compact placement policy per GPU pool, an instance template per
compute pool, the controller and login instances, then the workers with one bulkInsert per pool.

Every name derives from the project and cluster id (`names()`), and everything it creates carries
the label `tcc-cluster=<prefix>` (or, where Compute has no labels, that marker in its description):
a rerun finds what exists and creates only what is missing, and delete removes only what it made.
Long-running operations are polled with operation clients built with the same client options,
because the library's own `.result()` polling does not honour a custom endpoint.
"""

import hashlib
import json
import re
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from django.conf import settings

from ..choices import NodeRole, NodeState
from ..spec import pool_node_count
from ..spec.catalog import machine_type_info
from .base import Backend, NodeShape, PermanentBackendError, Step, TransientBackendError

OWNER_LABEL = "tcc-cluster"
MARKER = "managed-by=training-cluster-console"
CAPACITY_CODES = {
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
    "NOT_ENOUGH_RESOURCES_AVAILABLE",
    "RESERVATION_CAPACITY_EXCEEDED",
}


@dataclass(frozen=True)
class Names:
    """Every resource name of one cluster, derived from its project and id alone."""

    prefix: str

    @property
    def network(self):
        return f"{self.prefix}-net"

    @property
    def subnetwork(self):
        return f"{self.prefix}-subnet"

    @property
    def firewall_internal(self):
        return f"{self.prefix}-internal"

    @property
    def firewall_ssh(self):
        return f"{self.prefix}-ssh-login"

    @property
    def psa_range(self):
        return f"{self.prefix}-psa"

    @property
    def filestore(self):
        return f"{self.prefix}-home"

    @property
    def lustre(self):
        return f"{self.prefix}-lustre"

    @property
    def controller(self):
        return f"{self.prefix}-ctl"

    @property
    def munge_secret(self):
        return f"{self.prefix}-munge-key"

    def placement(self, pool_id):
        return f"{self.prefix}-place-{pool_id}"

    def template(self, pool_id):
        return f"{self.prefix}-tpl-{pool_id}"

    def instance(self, node_name):
        return f"{self.prefix}-{node_name}"


def names(project_slug, cluster_name):
    digest = hashlib.sha256(f"{project_slug}/{cluster_name}".encode()).hexdigest()[:4]
    return Names(f"{cluster_name[:28].rstrip('-')}-{digest}")


def is_gpu_pool(pool):
    return bool(pool.get("machine_spec", {}).get("accelerator_count"))


class GceBackend(Backend):
    name = "gce"
    label = "Google Compute Engine"

    # -- clients ----------------------------------------------------------------------------------

    def __init__(self):
        self._clients = {}

    def clients_for(self, project):
        """Clients with the project's own service-account key if it has one, else ADC; cached per key."""
        key_file = None
        if settings.GCE_CREDENTIALS_DIR:
            candidate = Path(settings.GCE_CREDENTIALS_DIR) / f"{project.slug}.json"
            key_file = str(candidate) if candidate.exists() else None
        cache_key = (settings.GCE_API_ENDPOINT, key_file)
        if cache_key not in self._clients:
            self._clients[cache_key] = Clients(settings.GCE_API_ENDPOINT, key_file)
        return self._clients[cache_key]

    # -- contract -----------------------------------------------------------------------------

    def validate_spec(self, spec):
        network = (spec.get("console") or {}).get("network") or {}
        if not network.get("create") and not (spec.get("network") or {}).get("network"):
            yield "network.network", "the gce backend needs an existing network or console.network.create"

    def project_problems(self, project):
        if not project.gcp_project_id:
            return [f"project '{project.slug}' has no Google Cloud project id; an administrator sets it in the admin"]
        return []

    def node_shape(self, cluster, pool):
        info = machine_type_info(pool.machine_type)
        gpus = pool.accelerator_count
        note = f"{pool.machine_type}: {info.vcpus} vCPUs, {info.memory_gb} GB" if info else pool.machine_type
        if gpus:
            note += f", {gpus} x {pool.accelerator_type}"
        return NodeShape(
            cpus=info.vcpus if info else 0, memory_mb=(info.memory_gb * 1024) if info else 0, gpus=gpus, note=note
        )

    def plan(self, project, cluster_name, spec):
        """(kind, name, detail) for every resource create would make, with its real name."""
        n = names(project.slug, cluster_name)
        console = spec.get("console") or {}
        network = console.get("network") or {}
        storage = console.get("storage") or {}
        login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        items = []
        if network.get("create"):
            items += [
                ("VPC network", n.network, f"MTU {network.get('mtu', 1460)}"),
                ("Subnetwork", n.subnetwork, network.get("subnet_range", "")),
            ]
        items += [
            ("Firewall rule", n.firewall_internal, "all traffic inside the subnet"),
            ("Firewall rule", n.firewall_ssh, "tcp:22 to the login node only"),
        ]
        if network.get("private_services_range"):
            items.append(("Private services access", n.psa_range, network["private_services_range"]))
        if storage.get("filestore_home"):
            home = storage["filestore_home"]
            items.append(("Filestore", n.filestore, f"{home['tier']}, {home['capacity_gb']:,} GB, /home"))
        if storage.get("lustre"):
            lustre = storage["lustre"]
            items.append(
                (
                    "Managed Lustre",
                    n.lustre,
                    f"{lustre['capacity_gb']:,} GiB, {lustre['performance_tier']} MB/s per TiB",
                )
            )
        pools = [p for p in spec["node_pools"] if p["id"] != login]
        for pool in pools:
            if is_gpu_pool(pool):
                items.append(("Placement policy", n.placement(pool["id"]), "compact (COLLOCATED)"))
            items.append(
                ("Instance template", n.template(pool["id"]), f"{pool['machine_spec']['machine_type']}, gVNIC")
            )
        items.append(("Instance", n.controller, f"{settings.GCE_CONTROLLER_MACHINE_TYPE}, Slurm controller"))
        login_pool = next(p for p in spec["node_pools"] if p["id"] == login)
        for i in range(pool_node_count(login_pool)):
            items.append(
                ("Instance", n.instance(f"{login}-{i}"), f"{login_pool['machine_spec']['machine_type']}, login")
            )
        for pool in pools:
            count = pool_node_count(pool)
            last = n.instance(f"{pool['id']}-{max(count - 1, 0)}")
            items.append(
                (
                    "bulkInsert",
                    f"{n.instance(pool['id'] + '-0')} .. {last}",
                    f"{count} x {pool['machine_spec']['machine_type']}",
                )
            )
        return items

    def apply_steps(self, cluster, hold=None):
        # `hold` is never asked of this backend: the console cannot submit the scans it would wait for.
        ctx = Context(self, cluster)
        spec = cluster.spec
        console = spec.get("console") or {}
        network = console.get("network") or {}
        storage = console.get("storage") or {}
        steps = []
        if network.get("create"):
            steps += [
                Step(f"Create VPC network {ctx.n.network}", ctx.create_network),
                Step(f"Create subnetwork {ctx.n.subnetwork}", ctx.create_subnetwork),
            ]
        steps.append(Step("Create firewall rules", ctx.create_firewalls))
        if network.get("private_services_range") and (storage.get("filestore_home") or storage.get("lustre")):
            steps.append(Step("Set up private services access", ctx.create_private_services_access))
        if storage.get("filestore_home"):
            steps.append(Step(f"Create Filestore {ctx.n.filestore}", ctx.create_filestore))
        if storage.get("lustre"):
            steps.append(Step(f"Create Managed Lustre {ctx.n.lustre}", ctx.create_lustre))
        for pool in ctx.compute_pools:
            if is_gpu_pool(pool):
                steps.append(Step(f"Create placement policy for {pool['id']}", lambda p=pool: ctx.create_placement(p)))
            steps.append(Step(f"Create instance template for {pool['id']}", lambda p=pool: ctx.create_template(p)))
        steps.append(Step("Create the munge key secret", ctx.create_munge_secret))
        steps.append(Step("Create the controller and login nodes", ctx.create_head_nodes))
        for pool in ctx.compute_pools:
            steps.append(Step(f"Create {pool['id']} nodes (bulkInsert)", lambda p=pool: ctx.create_workers(p)))
        if cluster.nodes.filter(state=NodeState.DELETING).exists():
            steps.append(Step("Delete removed nodes", ctx.delete_removed_workers))
        steps.append(Step("Update slurm.conf on the controller and login nodes", ctx.update_slurm_conf))
        steps.append(Step("Wait for every instance to run", ctx.wait_running))
        return steps

    def delete_steps(self, cluster):
        ctx = Context(self, cluster)
        return [
            Step("Delete instances", ctx.delete_instances),
            Step("Delete instance templates and placement policies", ctx.delete_templates),
            Step("Delete Managed Lustre and Filestore", ctx.delete_storage),
            Step("Delete firewall rules", ctx.delete_firewalls),
            Step("Delete private services access", ctx.delete_private_services_access),
            Step("Delete subnetwork and network", ctx.delete_network),
            Step("Delete the munge key secret", ctx.delete_munge_secret),
        ]

    # Instance states in which the machine is gone for Slurm: the repair watcher takes them as "down".
    STOPPED = {"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"}

    def node_statuses(self, cluster):
        """Compute nodes' instance states (lower case), until the console reaches the cluster's slurmrestd;
        a stopped or terminated instance (host error, preemption) reads as down."""
        from .base import NodeStatus

        ctx = Context(self, cluster)
        return [
            NodeStatus(
                name=instance.name.removeprefix(f"{ctx.n.prefix}-"),
                state="down" if instance.status in self.STOPPED else instance.status.lower(),
                reason=f"Compute Engine instance {instance.status}",
                partitions=[instance.labels.get("tcc-pool", "")],
            )
            for instance in ctx.list_instances()
            if instance.labels.get("tcc-role") == "compute"
        ]

    def jobs(self, cluster):
        return []

    # -- remediation --------------------------------------------------------------------------
    # Drain and resume go through the controller's metadata (key `tcc-node-states`), which its
    # agent (gce_startup.sh) applies with scontrol; reboot is an instance reset; reinstall deletes
    # the instance and makes it again from the pool's template. Replace needs nothing here: it is
    # a resize (apply_steps) that adds one node and removes another.

    def drain(self, cluster, node, reason):
        Context(self, cluster).set_node_state(node, "DRAIN", reason)

    def resume(self, cluster, node):
        Context(self, cluster).set_node_state(node, "RESUME", "")

    def reboot(self, cluster, node):
        Context(self, cluster).reset_instance(node)

    def reinstall(self, cluster, node):
        Context(self, cluster).recreate_instance(node)


class Clients:
    """google-cloud clients sharing one endpoint and one set of credentials."""

    def __init__(self, endpoint, credentials_file):
        self.endpoint = endpoint
        self.credentials_file = credentials_file
        self.endpoints = {
            "filestore": settings.GCE_FILESTORE_ENDPOINT,
            "lustre": settings.GCE_LUSTRE_ENDPOINT,
            "secrets": settings.GCE_SECRET_MANAGER_ENDPOINT,
        }

    @cached_property
    def credentials(self):
        if self.endpoint and settings.GCE_ANONYMOUS:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        if self.credentials_file:
            from google.oauth2 import service_account

            return service_account.Credentials.from_service_account_file(
                self.credentials_file, scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        import google.auth

        credentials, _project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return credentials

    def make(self, cls, endpoint=""):
        endpoint = endpoint or self.endpoint
        options = {"api_endpoint": endpoint} if endpoint else None
        return cls(credentials=self.credentials, transport="rest", client_options=options)

    def __getattr__(self, name):
        from google.cloud import compute_v1, filestore_v1, lustre_v1, secretmanager_v1

        classes = {
            "networks": compute_v1.NetworksClient,
            "subnetworks": compute_v1.SubnetworksClient,
            "firewalls": compute_v1.FirewallsClient,
            "addresses": compute_v1.GlobalAddressesClient,
            "templates": compute_v1.InstanceTemplatesClient,
            "policies": compute_v1.ResourcePoliciesClient,
            "instances": compute_v1.InstancesClient,
            "zone_operations": compute_v1.ZoneOperationsClient,
            "region_operations": compute_v1.RegionOperationsClient,
            "global_operations": compute_v1.GlobalOperationsClient,
            "filestore": filestore_v1.CloudFilestoreManagerClient,
            "lustre": lustre_v1.LustreClient,
            "secrets": secretmanager_v1.SecretManagerServiceClient,
        }
        if name not in classes:
            raise AttributeError(name)
        client = self.make(classes[name], self.endpoints.get(name, ""))
        setattr(self, name, client)
        return client

    def session(self):
        from google.auth.transport.requests import AuthorizedSession

        return AuthorizedSession(self.credentials)


class Context:
    """One cluster's resources on one backend: the steps' shared state and helpers."""

    def __init__(self, backend, cluster):
        self.backend, self.cluster, self.spec = backend, cluster, cluster.spec
        self.c = backend.clients_for(cluster.project)
        self.project = cluster.project.gcp_project_id
        if not self.project:
            raise PermanentBackendError(
                f"Project '{cluster.project.slug}' has no Google Cloud project id; set it in the admin"
            )
        self.n = names(cluster.project.slug, cluster.name)
        self.zone = next(p["zone"] for p in self.spec["node_pools"])
        self.region = self.zone.rsplit("-", 1)[0]
        console = self.spec.get("console") or {}
        self.network_block = console.get("network") or {}
        self.storage = console.get("storage") or {}
        login = self.spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        self.login_pool = next(p for p in self.spec["node_pools"] if p["id"] == login)
        self.compute_pools = [p for p in self.spec["node_pools"] if p["id"] != login]

    # -- naming and ownership -----------------------------------------------------------------

    @property
    def labels(self):
        return {OWNER_LABEL: self.n.prefix, "managed-by": "training-cluster-console"}

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
        return f"projects/{self.project}/global/networks/{self.network_name}"

    @property
    def subnetwork_url(self):
        if self.network_block.get("create"):
            return f"projects/{self.project}/regions/{self.region}/subnetworks/{self.n.subnetwork}"
        return self.spec["network"].get("subnetwork", "")

    # -- generic create / delete with ownership and idempotence ---------------------------------

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
        """Poll a Compute operation to DONE with the operation clients, then raise its error if any."""
        from google.cloud import compute_v1

        deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
        op = operation
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise TransientBackendError(
                    f"{what}: operation {op.name} still running after {settings.GCE_OPERATION_TIMEOUT} s"
                )
            time.sleep(settings.GCE_POLL_INTERVAL)
            if op.zone:
                op = self.c.zone_operations.wait(
                    project=self.project, zone=op.zone.rsplit("/", 1)[-1], operation=op.name
                )
            elif op.region:
                op = self.c.region_operations.wait(
                    project=self.project, region=op.region.rsplit("/", 1)[-1], operation=op.name
                )
            else:
                op = self.c.global_operations.wait(project=self.project, operation=op.name)
        if op.error and op.error.errors:
            raise map_operation_errors(op.error.errors, what)
        return op

    # -- network ------------------------------------------------------------------------------

    def create_network(self):
        from google.cloud import compute_v1

        self.ensure(
            f"network {self.n.network}",
            lambda: self.c.networks.get(project=self.project, network=self.n.network),
            lambda: self.c.networks.insert_unary(
                project=self.project,
                network_resource=compute_v1.Network(
                    name=self.n.network,
                    auto_create_subnetworks=False,
                    mtu=int(self.network_block.get("mtu", 1460)),
                    description=self.description,
                ),
            ),
        )

    def create_subnetwork(self):
        from google.cloud import compute_v1

        self.ensure(
            f"subnetwork {self.n.subnetwork}",
            lambda: self.c.subnetworks.get(project=self.project, region=self.region, subnetwork=self.n.subnetwork),
            lambda: self.c.subnetworks.insert_unary(
                project=self.project,
                region=self.region,
                subnetwork_resource=compute_v1.Subnetwork(
                    name=self.n.subnetwork,
                    network=self.network_url,
                    ip_cidr_range=self.network_block.get("subnet_range", "10.0.0.0/16"),
                    private_ip_google_access=True,
                    description=self.description,
                ),
            ),
        )

    def create_firewalls(self):
        from google.cloud import compute_v1

        source = self.network_block.get("subnet_range", "10.0.0.0/8")
        rules = [
            compute_v1.Firewall(
                name=self.n.firewall_internal,
                network=self.network_url,
                source_ranges=[source],
                allowed=[compute_v1.Allowed(I_p_protocol="all")],
                description=self.description,
            ),
            compute_v1.Firewall(
                name=self.n.firewall_ssh,
                network=self.network_url,
                source_ranges=["0.0.0.0/0"],
                target_tags=[f"{self.n.prefix}-login"],
                allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
                description=self.description,
            ),
        ]
        for rule in rules:
            self.ensure(
                f"firewall rule {rule.name}",
                lambda r=rule: self.c.firewalls.get(project=self.project, firewall=r.name),
                lambda r=rule: self.c.firewalls.insert_unary(project=self.project, firewall_resource=r),
            )

    def create_private_services_access(self):
        from google.cloud import compute_v1

        address, prefix = self.network_block["private_services_range"].split("/")
        self.ensure(
            f"private services range {self.n.psa_range}",
            lambda: self.c.addresses.get(project=self.project, address=self.n.psa_range),
            lambda: self.c.addresses.insert_unary(
                project=self.project,
                address_resource=compute_v1.Address(
                    name=self.n.psa_range,
                    address=address,
                    prefix_length=int(prefix),
                    address_type="INTERNAL",
                    purpose="VPC_PEERING",
                    network=self.network_url,
                    labels=self.labels,
                    description=self.description,
                ),
            ),
        )
        url = f"{settings.GCE_SERVICE_NETWORKING_ENDPOINT or self.c.endpoint or 'https://servicenetworking.googleapis.com'}"
        session = self.c.session()
        network = f"projects/{self.project}/global/networks/{self.network_name}"
        existing = session.get(
            f"{url}/v1/services/servicenetworking.googleapis.com/connections", params={"network": network}
        )
        if existing.ok and existing.json().get("connections"):
            return
        created = session.post(
            f"{url}/v1/services/servicenetworking.googleapis.com/connections",
            json={"network": network, "reservedPeeringRanges": [self.n.psa_range]},
        )
        if not created.ok:
            raise PermanentBackendError(
                f"private services access peering failed: {created.status_code} {created.text[:300]}"
            )

    # -- storage ------------------------------------------------------------------------------

    def create_filestore(self):
        from google.cloud import filestore_v1

        home = self.storage["filestore_home"]
        parent = f"projects/{self.project}/locations/{self.zone}"
        name = f"{parent}/instances/{self.n.filestore}"
        self.ensure_lro(
            f"Filestore {self.n.filestore}",
            lambda: self.c.filestore.get_instance(name=name),
            lambda: self.c.filestore.create_instance(
                parent=parent,
                instance_id=self.n.filestore,
                instance=filestore_v1.Instance(
                    tier=home["tier"],
                    labels=self.labels,
                    file_shares=[filestore_v1.FileShareConfig(name="home", capacity_gb=int(home["capacity_gb"]))],
                    networks=[
                        filestore_v1.NetworkConfig(
                            network=self.network_name, connect_mode="PRIVATE_SERVICE_ACCESS", modes=["MODE_IPV4"]
                        )
                    ],
                ),
            ),
        )

    def create_lustre(self):
        from google.cloud import lustre_v1

        lustre = self.storage["lustre"]
        parent = f"projects/{self.project}/locations/{self.zone}"
        name = f"{parent}/instances/{self.n.lustre}"
        self.ensure_lro(
            f"Managed Lustre {self.n.lustre}",
            lambda: self.c.lustre.get_instance(name=name),
            lambda: self.c.lustre.create_instance(
                parent=parent,
                instance_id=self.n.lustre,
                instance=lustre_v1.Instance(
                    filesystem="lustrefs",
                    capacity_gib=int(lustre["capacity_gb"]),
                    per_unit_storage_throughput=int(lustre["performance_tier"]),
                    network=self.network_url,
                    labels=self.labels,
                ),
            ),
        )

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
            time.sleep(settings.GCE_POLL_INTERVAL)
            future._refresh_and_update()
        if future.operation.HasField("error") and future.operation.error.code:
            raise PermanentBackendError(f"{what} failed: {future.operation.error.message}")

    def delete_storage(self):
        from google.api_core import exceptions

        parent = f"projects/{self.project}/locations/{self.zone}"
        for client, name in ((self.c.lustre, self.n.lustre), (self.c.filestore, self.n.filestore)):
            full = f"{parent}/instances/{name}"
            existing = self.get(lambda c=client, f=full: c.get_instance(name=f))
            if existing is None or not self.owned(existing):
                continue
            try:
                client.delete_instance(name=full)
            except exceptions.NotFound:
                continue
            except exceptions.GoogleAPICallError as exc:
                raise map_api_error(exc, name) from None

    # -- templates and instances ----------------------------------------------------------------

    def create_placement(self, pool):
        from google.cloud import compute_v1

        name = self.n.placement(pool["id"])
        self.ensure(
            f"placement policy {name}",
            lambda: self.c.policies.get(project=self.project, region=self.region, resource_policy=name),
            lambda: self.c.policies.insert_unary(
                project=self.project,
                region=self.region,
                resource_policy_resource=compute_v1.ResourcePolicy(
                    name=name,
                    description=self.description,
                    group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED"),
                ),
            ),
        )

    def instance_properties(self, pool, role):
        from google.cloud import compute_v1

        machine = pool["machine_spec"]
        disk = pool.get("boot_disk") or {}
        model = pool.get("provisioning_model", "ON_DEMAND")
        scheduling = compute_v1.Scheduling(
            provisioning_model="SPOT" if model == "SPOT" else ("FLEX_START" if model == "FLEX_START" else "STANDARD"),
            on_host_maintenance="TERMINATE" if is_gpu_pool(pool) else "MIGRATE",
            automatic_restart=model not in ("SPOT", "FLEX_START"),
        )
        if model in ("SPOT", "FLEX_START"):
            scheduling.instance_termination_action = "DELETE"
        properties = compute_v1.InstanceProperties(
            machine_type=machine["machine_type"],
            labels={**self.labels, "tcc-pool": pool["id"], "tcc-role": role},
            tags=compute_v1.Tags(items=[f"{self.n.prefix}-{role}"]),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=settings.GCE_IMAGE,
                        disk_size_gb=int(disk.get("boot_disk_size_gb", 100)),
                        disk_type=disk.get("boot_disk_type", "pd-balanced"),
                    ),
                )
            ],
            network_interfaces=[
                compute_v1.NetworkInterface(
                    network=self.network_url,
                    subnetwork=self.subnetwork_url,
                    nic_type="GVNIC",
                    access_configs=[compute_v1.AccessConfig(name="External NAT")]
                    if pool.get("enable_public_ips")
                    else [],
                )
            ],
            scheduling=scheduling,
            metadata=compute_v1.Metadata(
                items=[
                    compute_v1.Items(key="startup-script", value=startup_script(self, pool, role)),
                    compute_v1.Items(key="tcc-cluster", value=self.n.prefix),
                ]
            ),
        )
        affinity = machine.get("reservation_affinity")
        if affinity:
            properties.reservation_affinity = compute_v1.ReservationAffinity(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key=affinity.get("key", "compute.googleapis.com/reservation-name"),
                values=affinity.get("values", []),
            )
        if is_gpu_pool(pool) and role == "compute":
            properties.resource_policies = [self.n.placement(pool["id"])]
        return properties

    def create_template(self, pool):
        from google.cloud import compute_v1

        name = self.n.template(pool["id"])
        self.ensure(
            f"instance template {name}",
            lambda: self.c.templates.get(project=self.project, instance_template=name),
            lambda: self.c.templates.insert_unary(
                project=self.project,
                instance_template_resource=compute_v1.InstanceTemplate(
                    name=name, description=self.description, properties=self.instance_properties(pool, "compute")
                ),
            ),
        )

    def create_head_nodes(self):
        from google.cloud import compute_v1

        controller_pool = {
            "id": "ctl",
            "machine_spec": {"machine_type": settings.GCE_CONTROLLER_MACHINE_TYPE},
            "boot_disk": {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 100},
        }
        heads = [(self.n.controller, controller_pool, "controller", "ctl")]
        login_id = self.login_pool["id"]
        for i in range(pool_node_count(self.login_pool)):
            heads.append((self.n.instance(f"{login_id}-{i}"), self.login_pool, "login", f"{login_id}-{i}"))
        for name, pool, role, node in heads:
            properties = self.instance_properties(pool, role)
            instance = compute_v1.Instance(
                name=name,
                machine_type=f"zones/{self.zone}/machineTypes/{properties.machine_type}",
                labels={**properties.labels, "tcc-node": node},
                tags=properties.tags,
                disks=properties.disks,
                network_interfaces=properties.network_interfaces,
                scheduling=properties.scheduling,
                metadata=compute_v1.Metadata(items=[*properties.metadata.items, *self.slurm_items()]),
                description=self.description,
            )
            self.ensure(
                f"instance {name}",
                lambda n=name: self.c.instances.get(project=self.project, zone=self.zone, instance=n),
                lambda i=instance: self.c.instances.insert_unary(
                    project=self.project, zone=self.zone, instance_resource=i
                ),
            )

    # -- Slurm configuration and the munge key ------------------------------------------------

    def slurm_items(self):
        """Metadata the controller and login nodes read: slurm.conf and the spec's prolog and epilog."""
        from google.cloud import compute_v1

        slurm = self.spec["orchestrator_spec"]["slurm_spec"]
        return [
            compute_v1.Items(key="slurm-conf", value=render_slurm_conf(self)),
            compute_v1.Items(key="slurm-prolog", value="\n\n".join(slurm.get("prolog_bash_scripts", []))),
            compute_v1.Items(key="slurm-epilog", value="\n\n".join(slurm.get("epilog_bash_scripts", []))),
        ]

    def head_names(self):
        login_id = self.login_pool["id"]
        return [
            self.n.controller,
            *(self.n.instance(f"{login_id}-{i}") for i in range(pool_node_count(self.login_pool))),
        ]

    def update_slurm_conf(self):
        """After a resize, give the controller and login nodes the new node list (their agent reconfigures)."""
        wanted = {item.key: item.value for item in self.slurm_items()}
        for name in self.head_names():
            self.change_metadata(name, lambda items: {**items, **wanted}, f"updating slurm.conf on {name}")

    NODE_STATES = "tcc-node-states"

    def set_node_state(self, node, state, reason):
        """Record the node's wanted Slurm admin state in the controller's metadata; its agent runs
        `scontrol update nodename=NODE state=STATE reason=REASON` on each change."""

        def change(items):
            states = json.loads(items.get(self.NODE_STATES) or "{}")
            states[node] = {"state": state, "reason": reason[:100]}
            return {**items, self.NODE_STATES: json.dumps(states, sort_keys=True)}

        what = f"{state.lower()} {node}"
        if not self.change_metadata(self.n.controller, change, what):
            raise PermanentBackendError(f"{what}: the controller {self.n.controller} does not exist")

    def change_metadata(self, name, change, what):
        """Apply `change(items) -> items` to an instance's metadata with Compute's fingerprint check,
        reading again when a concurrent change moved it. False when the instance does not exist."""
        from google.api_core import exceptions
        from google.cloud import compute_v1

        for _ in range(3):
            instance = self.get(lambda: self.c.instances.get(project=self.project, zone=self.zone, instance=name))
            if instance is None:
                return False
            items = {item.key: item.value for item in instance.metadata.items}
            wanted = change(items)
            if wanted == items:
                return True
            metadata = compute_v1.Metadata(
                fingerprint=instance.metadata.fingerprint,
                items=[compute_v1.Items(key=k, value=v) for k, v in wanted.items()],
            )
            try:
                operation = self.c.instances.set_metadata_unary(
                    project=self.project, zone=self.zone, instance=name, metadata_resource=metadata
                )
            except exceptions.PreconditionFailed:
                continue
            except exceptions.GoogleAPICallError as exc:
                raise map_api_error(exc, what) from None
            self.wait(operation, what)
            return True
        raise TransientBackendError(f"{what}: the instance's metadata kept changing; will retry")

    def reset_instance(self, node):
        """Reset a running instance; start one that has stopped (a reset needs a running machine)."""
        from google.api_core import exceptions

        name = self.n.instance(node)
        instance = self.get(lambda: self.c.instances.get(project=self.project, zone=self.zone, instance=name))
        stopped = instance is not None and instance.status != "RUNNING"
        action = self.c.instances.start_unary if stopped else self.c.instances.reset_unary
        try:
            operation = action(project=self.project, zone=self.zone, instance=name)
        except exceptions.NotFound:
            raise PermanentBackendError(f"cannot reboot {node}: instance {name} does not exist") from None
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, f"resetting {name}") from None
        self.wait(operation, f"resetting {name}")
        self.wait_running()

    def recreate_instance(self, node):
        """A fresh boot disk from the pool's template: delete the instance, bulkInsert it again."""
        found = self.cluster.nodes.select_related("node_pool").get(name=node)
        pool = next(p for p in self.compute_pools if p["id"] == found.node_pool.pool_id)
        self.delete_each([i for i in self.list_instances(pool["id"]) if i.name == self.n.instance(node)])
        self.create_workers(pool)
        self.wait_running()

    @property
    def secret_name(self):
        return f"projects/{self.project}/secrets/{self.n.munge_secret}"

    def create_munge_secret(self):
        """A random munge key in Secret Manager, read by every node at boot; it never leaves Google."""
        import secrets as random_source

        from google.api_core import exceptions
        from google.cloud import secretmanager_v1

        secret = self.get(lambda: self.c.secrets.get_secret(name=self.secret_name))
        if secret is None:
            try:
                secret = self.c.secrets.create_secret(
                    parent=f"projects/{self.project}",
                    secret_id=self.n.munge_secret,
                    secret=secretmanager_v1.Secret(
                        replication=secretmanager_v1.Replication(automatic=secretmanager_v1.Replication.Automatic()),
                        labels=self.labels,
                    ),
                )
            except exceptions.GoogleAPICallError as exc:
                raise map_api_error(exc, "creating the munge key secret") from None
        elif not self.owned(secret):
            raise PermanentBackendError(
                f"secret {self.n.munge_secret} already exists and was not created by this cluster"
            )
        versions = list(self.c.secrets.list_secret_versions(parent=self.secret_name))
        if not versions:
            self.c.secrets.add_secret_version(
                parent=self.secret_name, payload=secretmanager_v1.SecretPayload(data=random_source.token_bytes(1024))
            )

    def delete_munge_secret(self):
        from google.api_core import exceptions

        secret = self.get(lambda: self.c.secrets.get_secret(name=self.secret_name))
        if secret is None or not self.owned(secret):
            return
        try:
            self.c.secrets.delete_secret(name=self.secret_name)
        except exceptions.NotFound:
            return

    def list_instances(self, pool_id=None):
        from google.api_core import exceptions

        expression = f'labels.{OWNER_LABEL} = "{self.n.prefix}"'
        if pool_id:
            expression += f' AND labels.tcc-pool = "{pool_id}"'
        try:
            from google.cloud import compute_v1

            request = compute_v1.ListInstancesRequest(project=self.project, zone=self.zone, filter=expression)
            return list(self.c.instances.list(request=request))
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, "listing instances") from None

    def wanted_workers(self, pool_id):
        return list(
            self.cluster.nodes.filter(node_pool__pool_id=pool_id, state__in=NodeState.wanted()).values_list(
                "name", flat=True
            )
        )

    def create_workers(self, pool):
        """One bulkInsert for every missing node of the pool; a partial success is topped up, not redone."""
        from google.api_core import exceptions
        from google.cloud import compute_v1

        wanted = {self.n.instance(node): node for node in self.wanted_workers(pool["id"])}
        missing = sorted(set(wanted) - {i.name for i in self.list_instances(pool["id"])})
        if not missing:
            return
        template = f"projects/{self.project}/global/instanceTemplates/{self.n.template(pool['id'])}"
        request = compute_v1.BulkInsertInstanceResource(
            count=len(missing),
            min_count=len(missing),
            source_instance_template=template,
            per_instance_properties={
                name: compute_v1.BulkInsertInstanceResourcePerInstanceProperties(name=name) for name in missing
            },
        )
        try:
            operation = self.c.instances.bulk_insert_unary(
                project=self.project, zone=self.zone, bulk_insert_instance_resource_resource=request
            )
            self.wait(operation, f"bulkInsert of {len(missing)} {pool['id']} nodes")
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, f"bulkInsert of {pool['id']} nodes") from None
        except TransientBackendError as exc:
            still = sorted(set(wanted) - {i.name for i in self.list_instances(pool["id"])})
            created = len(missing) - len(still)
            raise TransientBackendError(
                f"{exc} ({created} of {len(missing)} {pool['id']} nodes created; the rest will be retried)"
            ) from None

    def delete_removed_workers(self):
        leaving = set(self.cluster.nodes.filter(state=NodeState.DELETING).values_list("name", flat=True))
        doomed = [
            i
            for i in self.list_instances()
            if i.labels.get("tcc-node") in leaving or i.name in {self.n.instance(n) for n in leaving}
        ]
        self.delete_each(doomed)

    def delete_each(self, instances):
        """Send every delete first, then watch the list shrink: one list call per poll, not one wait per node."""
        from google.api_core import exceptions

        operations = {}
        for instance in instances:
            if not self.owned(instance):
                continue
            try:
                operations[instance.name] = self.c.instances.delete_unary(
                    project=self.project, zone=self.zone, instance=instance.name
                )
            except exceptions.NotFound:
                continue
            except exceptions.GoogleAPICallError as exc:
                raise map_api_error(exc, f"deleting {instance.name}") from None
        deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
        remaining = set(operations)
        while remaining:
            remaining &= {i.name for i in self.list_instances()}
            if not remaining:
                return
            if time.monotonic() > deadline:
                for name in sorted(remaining)[:3]:
                    self.wait(operations[name], f"deleting {name}")  # raises the operation's own error
                raise TransientBackendError(f"{len(remaining)} instances are still being deleted")
            time.sleep(settings.GCE_POLL_INTERVAL)

    def wait_running(self):
        wanted = {
            self.n.instance(node.name)
            for node in self.cluster.wanted_nodes().select_related("node_pool")
            if node.node_pool.role == NodeRole.COMPUTE
        }
        deadline = time.monotonic() + settings.GCE_OPERATION_TIMEOUT
        while True:
            running = {i.name for i in self.list_instances() if i.status == "RUNNING"}
            missing = wanted - running
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TransientBackendError(
                    f"{len(missing)} instances are not running yet: {', '.join(sorted(missing)[:5])}"
                )
            time.sleep(settings.GCE_POLL_INTERVAL)

    # -- deletion -----------------------------------------------------------------------------

    def delete_instances(self):
        self.delete_each(self.list_instances())

    def delete_templates(self):
        for pool in self.compute_pools:
            name = self.n.template(pool["id"])
            self.remove(
                f"instance template {name}",
                lambda n=name: self.c.templates.get(project=self.project, instance_template=n),
                lambda n=name: self.c.templates.delete_unary(project=self.project, instance_template=n),
            )
            if is_gpu_pool(pool):
                policy = self.n.placement(pool["id"])
                self.remove(
                    f"placement policy {policy}",
                    lambda p=policy: self.c.policies.get(project=self.project, region=self.region, resource_policy=p),
                    lambda p=policy: self.c.policies.delete_unary(
                        project=self.project, region=self.region, resource_policy=p
                    ),
                )

    def delete_firewalls(self):
        for name in (self.n.firewall_ssh, self.n.firewall_internal):
            self.remove(
                f"firewall rule {name}",
                lambda n=name: self.c.firewalls.get(project=self.project, firewall=n),
                lambda n=name: self.c.firewalls.delete_unary(project=self.project, firewall=n),
            )

    def delete_private_services_access(self):
        if self.network_block.get("create"):
            # The peering belongs to the network this cluster created; on a shared VPC it is left alone.
            url = (
                settings.GCE_SERVICE_NETWORKING_ENDPOINT
                or self.c.endpoint
                or "https://servicenetworking.googleapis.com"
            )
            network = f"projects/{self.project}/global/networks/{self.network_name}"
            response = self.c.session().post(
                f"{url}/v1/services/servicenetworking.googleapis.com/connections/"
                "servicenetworking-googleapis-com:deleteConnection",
                json={"consumerNetwork": network},
            )
            if not response.ok and response.status_code != 404:
                raise TransientBackendError(f"deleting the private services peering failed: {response.status_code}")
        self.remove(
            f"private services range {self.n.psa_range}",
            lambda: self.c.addresses.get(project=self.project, address=self.n.psa_range),
            lambda: self.c.addresses.delete_unary(project=self.project, address=self.n.psa_range),
        )

    def delete_network(self):
        if not self.network_block.get("create"):
            return
        self.remove(
            f"subnetwork {self.n.subnetwork}",
            lambda: self.c.subnetworks.get(project=self.project, region=self.region, subnetwork=self.n.subnetwork),
            lambda: self.c.subnetworks.delete_unary(
                project=self.project, region=self.region, subnetwork=self.n.subnetwork
            ),
        )
        self.remove(
            f"network {self.n.network}",
            lambda: self.c.networks.get(project=self.project, network=self.n.network),
            lambda: self.c.networks.delete_unary(project=self.project, network=self.n.network),
        )


def render_slurm_conf(ctx):
    """slurm.conf for the VMs: configless slurmd, one NodeName line per node, the spec's scheduling."""
    slurm = ctx.spec["orchestrator_spec"]["slurm_spec"]
    scheduling = slurm.get("scheduling") or {}
    lines = [
        "# Written by the console's gce backend; the controller's agent reloads it when it changes.",
        f"ClusterName={ctx.n.prefix.replace('-', '')[:40]}",
        f"SlurmctldHost={ctx.n.controller}",
        "SlurmctldParameters=enable_configless",
        "AuthType=auth/munge",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "ReturnToService=2",
        "JobRequeue=1",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
    ]
    if slurm.get("prolog_bash_scripts"):
        lines.append("Prolog=/etc/slurm/prolog.sh")
    if slurm.get("epilog_bash_scripts"):
        lines.append("Epilog=/etc/slurm/epilog.sh")
    enforce = (slurm.get("accounting") or {}).get("accounting_storage_enforce")
    if enforce:
        lines.append(f"AccountingStorageEnforce={enforce}")
    keys = {
        "priority_type": "PriorityType",
        "preempt_type": "PreemptType",
        "preempt_mode": "PreemptMode",
        "preempt_exempt_time": "PreemptExemptTime",
        "priority_weight_age": "PriorityWeightAge",
        "priority_weight_assoc": "PriorityWeightAssoc",
        "priority_weight_fairshare": "PriorityWeightFairshare",
        "priority_weight_job_size": "PriorityWeightJobSize",
        "priority_weight_partition": "PriorityWeightPartition",
        "priority_weight_qos": "PriorityWeightQOS",
        "priority_weight_tres": "PriorityWeightTRES",
    }
    lines += [f"{conf}={scheduling[key]}" for key, conf in keys.items() if key in scheduling]
    lines.append("")
    wanted = {}
    for node in ctx.cluster.wanted_nodes().select_related("node_pool"):
        if node.node_pool.role == NodeRole.COMPUTE:
            wanted.setdefault(node.node_pool.pool_id, []).append(node.name)
    for pool in ctx.compute_pools:
        info = machine_type_info(pool["machine_spec"]["machine_type"])
        gpus = int(pool["machine_spec"].get("accelerator_count") or 0)
        for node in sorted(wanted.get(pool["id"], []), key=lambda n: int(n.rsplit("-", 1)[1])):
            memory = int(info.memory_gb * 1024 * 0.9)  # leave the OS a tenth
            line = f"NodeName={node} NodeHostname={ctx.n.instance(node)} CPUs={info.vcpus} RealMemory={memory}"
            lines.append(line + (f" Gres=gpu:{gpus}" if gpus else "") + " State=UNKNOWN")
    lines.append("")
    for i, partition in enumerate(slurm["partitions"]):
        nodes = [n for pool_id in partition["node_pool_ids"] for n in wanted.get(pool_id, [])]
        if nodes:
            gpu = any(is_gpu_pool(p) for p in ctx.compute_pools if p["id"] in partition["node_pool_ids"])
            lines.append(
                f"PartitionName={partition['id']} Nodes={','.join(nodes)} Default={'YES' if i == 0 else 'NO'} "
                f"MaxTime=INFINITE State=UP{' OverSubscribe=EXCLUSIVE' if gpu else ''}"
            )
    return "\n".join(lines) + "\n"


STARTUP = Path(__file__).resolve().parent / "gce_startup.sh"


def startup_script(ctx, pool, role):
    """The node's startup script: install Slurm, join the controller, mount /home, Lustre and buckets."""
    storage = ctx.storage
    mounts = [
        f"{b['bucket']} {b['mount_point']} {','.join(b.get('mount_options', []))}"
        for b in storage.get("gcs_buckets", [])
    ]
    values = {
        "ROLE": role,
        "CLUSTER": ctx.n.prefix,
        "CONTROLLER": ctx.n.controller,
        "HOME_SHARE": f"{ctx.n.filestore}:/home" if storage.get("filestore_home") else "",
        "LUSTRE": ctx.n.lustre if storage.get("lustre") else "",
        "LUSTRE_MOUNT": (storage.get("lustre") or {}).get("mount_point", "/lustre"),
        "GCS_MOUNTS": ";".join(mounts),
        "USER_SCRIPT": pool.get("startup_script", ""),
    }
    text = STARTUP.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value.replace("'", "'\\''"))
    return text


# -- error mapping ------------------------------------------------------------------------------

QUOTA = re.compile(r"Quota '(?P<quota>[A-Z0-9_]+)' exceeded\.\s+Limit: (?P<limit>[\d.]+)(?: in (?P<where>[\w -]+))?")
PERMISSION = re.compile(r"Required '(?P<permission>[\w.]+)' permission for '(?P<resource>[^']+)'")


def map_operation_errors(errors, what):
    first = errors[0]
    return map_message(first.code, first.message, what)


def map_api_error(exc, what=""):
    reason = ""
    for error in getattr(exc, "errors", None) or []:
        reason = (error.get("reason") if isinstance(error, dict) else "") or reason
    return map_message(
        reason or type(exc).__name__,
        exc.message if hasattr(exc, "message") else str(exc),
        what,
        getattr(exc, "code", None),
    )


def map_message(code, message, what, http_status=None):
    """A user-facing BackendError for a Compute error: which quota, which permission, which capacity."""
    prefix = f"{what}: " if what else ""
    quota = QUOTA.search(message or "")
    if code == "QUOTA_EXCEEDED" or quota:
        if quota:
            where = f" in {quota['where'].strip()}" if quota["where"] else ""
            return PermanentBackendError(
                f"{prefix}quota {quota['quota']} exceeded{where}: the limit is {float(quota['limit']):g}; "
                "ask for more quota or fewer nodes"
            )
        return PermanentBackendError(f"{prefix}quota exceeded: {message}")
    permission = PERMISSION.search(message or "")
    if permission or http_status == 403 or code in ("forbidden", "Forbidden"):
        detail = (
            f"the credentials lack {permission['permission']} on {permission['resource']}" if permission else message
        )
        return PermanentBackendError(f"{prefix}permission denied: {detail}")
    if code in CAPACITY_CODES or "does not have enough resources" in (message or ""):
        return TransientBackendError(
            f"{prefix}no capacity in the zone or reservation right now ({code}); retrying with backoff"
        )
    if "machineType" in (message or "") or "Machine type" in (message or ""):
        return PermanentBackendError(f"{prefix}invalid machine type for this zone: {message}")
    if http_status in (429, 500, 502, 503, 504) or code in ("rateLimitExceeded", "backendError", "ServiceUnavailable"):
        return TransientBackendError(f"{prefix}{message}")
    return PermanentBackendError(f"{prefix}{message}")
