"""The `gce` backend: the same cluster spec as Compute Engine resources, with google-cloud-compute.

What it creates, in dependency order (each one an operation step): the VPC network with the spec's
MTU and its subnetwork, firewall rules (internal traffic; SSH to the login node only), a private
services access range and its peering (for Filestore / Managed Lustre), the Filestore /home, the
Managed Lustre file system, a compact placement policy per GPU pool, an instance template per
compute pool, the controller and login instances, then the workers with one bulkInsert per pool.

Every name derives from the project and cluster id (names.py), and everything it creates carries
the label `tcc-cluster=<prefix>` (or, where Compute has no labels, that marker in its description):
a rerun finds what exists and creates only what is missing, and delete removes only what it made.
Long-running operations are polled with operation clients built with the same client options,
because the library's own `.result()` polling does not honour a custom endpoint.

The work lives in the modules beside this one, one seam each: names, clients, errors, cloud (one
cluster's resources and the generic create / delete / wait), network, storage, instances and
slurm_conf; this class maps the backend contract onto them.
"""

from pathlib import Path

from django.conf import settings

from ...choices import NodeState
from ...slurm.states import NodeStatus
from ...spec import pool_node_count
from ...spec.catalog import machine_type_info
from .. import slurm_waits
from ..base import AgentEndpoint, Backend, NodeShape, PermanentBackendError, SlurmEndpoint, Step
from . import fabric, identity, image, instances, keys, network, preflight, slurm_conf, storage
from .clients import Clients
from .cloud import Cloud
from .names import names, names_for


class GceBackend(Backend):
    name = "gce"
    label = "Google Compute Engine"

    # Rehearsals (admin only, clusters.inject_faults): fault files in the shared home, and kill_node
    # stops the node's instance at once, as a host failure would.
    injects_faults = True

    @property
    def runs_jobs(self):
        """The console submits jobs when it reaches the controller's slurmrestd and agent (through the
        VPC or IAP: docs/backends.md); a console that only provisions (GCE_REACH_CLUSTERS off) cannot."""
        return settings.GCE_REACH_CLUSTERS

    @property
    def endpoints_refused(self):
        """A console outside Google Cloud (GCE_CONTROLLER_ACCESS=external) reaches the controller only; the
        replicas are on compute nodes without external addresses."""
        if network.external_access():
            return (
                "the console reaches this backend's clusters at their controller's external address only "
                "(GCE_CONTROLLER_ACCESS=external): its router cannot reach replicas on the compute nodes"
            )
        return ""

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
        net = (spec.get("console") or {}).get("network") or {}
        if not net.get("create") and not (spec.get("network") or {}).get("network"):
            yield "network.network", "the gce backend needs an existing network or console.network.create"
        home = spec["orchestrator_spec"]["slurm_spec"].get("home_directory_storage")
        if home and ((spec.get("console") or {}).get("storage") or {}).get("filestore_home"):
            yield (
                "orchestrator_spec.slurm_spec.home_directory_storage",
                "name an existing file system for /home or have the console create one (console.storage."
                "filestore_home), not both",
            )
        if not net.get("create"):
            for i, pool in enumerate(spec["node_pools"]):
                needs = fabric.needs(pool)
                if needs:
                    yield (
                        f"node_pools[{i}].machine_spec.machine_type",
                        f"{pool['machine_spec']['machine_type']} needs its GPU fabric ({needs}), which the console "
                        "makes only with the VPC it creates: set console.network.create",
                    )
        login = spec["orchestrator_spec"]["slurm_spec"].get("login_node_pool_id") or ""
        for i, pool in enumerate(spec["node_pools"]):
            if pool.get("id") != login and instances.is_arm(pool) and not settings.GCE_GPU_ARM64_IMAGE:
                yield (
                    f"node_pools[{i}].machine_spec.machine_type",
                    f"{pool['machine_spec']['machine_type']} has Arm CPUs and boots only an Arm64 image: bake one "
                    "with `manage.py gce_image build --gpu --arm64` and set GCE_GPU_ARM64_IMAGE",
                )
        for path, name in storage.named_paths(spec):
            if not storage.INSTANCE_NAME.match(name):
                yield path, "must be a full instance name: projects/PROJECT/locations/LOCATION/instances/NAME"

    def update_problems(self, old_spec, new_spec):
        # A pool built with the console's compact placement policy keeps it: its instance template names
        # the policy, and its running VMs are in it. One policy holds at most 1,500 VMs (instances.py),
        # so such a pool cannot grow past that; Compute would refuse the 1,501st VM.
        old_pools = {p["id"]: p for p in old_spec.get("node_pools", [])}
        for i, pool in enumerate(new_spec.get("node_pools", [])):
            before = old_pools.get(pool["id"])
            if before and instances.uses_own_placement(before) and not instances.uses_own_placement(pool):
                yield (
                    f"node_pools[{i}].scaling_spec.min_node_count",
                    f"pool '{pool['id']}' was built with a compact placement policy, which holds at most "
                    f"{instances.COMPACT_MAX_INSTANCES:,} VMs: keep it at {instances.COMPACT_MAX_INSTANCES:,} "
                    "or fewer, or create a cluster with the larger pool (it gets no compact placement)",
                )

    def project_problems(self, project):
        if not project.gcp_project_id:
            return [f"project '{project.slug}' has no Google Cloud project id; an administrator sets it in the admin"]
        return []

    def bake_image(self, project, zone, *, gpu=False, arm64=False, family="", base="", report=print):
        """Bake a node image (image.py) in the project's Google Cloud project; returns image.Baked."""
        problems = self.project_problems(project)
        if problems:
            raise PermanentBackendError(problems[0])
        return image.build(
            self.clients_for(project), project.gcp_project_id, zone, gpu=gpu, arm64=arm64, family=family, base=base,
            report=report,
        )  # fmt: skip

    def preflight(self, project, spec):

        return preflight.run(self.clients_for(project), project.gcp_project_id, spec)

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
        net = console.get("network") or {}
        store = console.get("storage") or {}
        login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        items = []
        if net.get("create"):
            items += [
                ("VPC network", n.network, f"MTU {net.get('mtu', 1460)}"),
                ("Subnetwork", n.subnetwork, net.get("subnet_range", "")),
            ]
            if settings.GCE_CONSOLE_NETWORK:
                items.append(("VPC peering", n.console_peering, f"with the console's {settings.GCE_CONSOLE_NETWORK}"))
            if net.get("cloud_nat"):
                items.append(("Cloud NAT", n.router, "outbound internet for the nodes (no external addresses)"))
        if identity.makes_account(spec):
            roles = ", ".join(r.removeprefix("roles/") for r in settings.GCE_NODE_PROJECT_ROLES)
            items.append(
                (
                    "Service account",
                    identity.cluster_email(n, project.gcp_project_id or "PROJECT"),
                    "the nodes' identity: its own keys and buckets" + (f"; {roles}" if roles else ""),
                )
            )
        items += [
            ("Firewall rule", n.firewall_internal, "all traffic inside the subnet"),
            ("Firewall rule", n.firewall_ssh, "tcp:22 to the login node only"),
        ]
        if settings.GCE_REACH_CLUSTERS:
            items.append(("Firewall rule", n.firewall_console, "the console's workers to slurmrestd and the agent"))
            if not network.external_access():
                items.append(("Firewall rule", n.firewall_serving, "the console's router to the serving replicas"))
        if net.get("private_services_range"):
            items.append(("Private services access", n.psa_range, net["private_services_range"]))
        if store.get("filestore_home"):
            home = store["filestore_home"]
            items.append(("Filestore", n.filestore, f"{home['tier']}, {home['capacity_gb']:,} GB, /home"))
        if store.get("lustre"):
            lustre = store["lustre"]
            items.append(
                (
                    "Managed Lustre",
                    n.lustre,
                    f"{lustre['capacity_gb']:,} GiB, {lustre['performance_tier']} MB/s per TiB",
                )
            )
        pools = [p for p in spec["node_pools"] if p["id"] != login]
        for pool in pools:
            if instances.uses_own_placement(pool):
                items.append(("Placement policy", n.placement(pool["id"]), "compact (COLLOCATED)"))
            items.append(
                ("Instance template", n.template(pool["id"]), f"{pool['machine_spec']['machine_type']}, gVNIC")
            )
        reach = ", external address for the console" if network.external_access() else ""
        items.append(("Instance", n.controller, f"{settings.GCE_CONTROLLER_MACHINE_TYPE}, Slurm controller{reach}"))
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
        cloud = Cloud(self, cluster)
        spec = cluster.spec
        console = spec.get("console") or {}
        net = console.get("network") or {}
        store = console.get("storage") or {}
        steps = []
        if net.get("create"):
            steps += [
                Step(f"Create VPC network {cloud.n.network}", lambda ctx: network.create_network(cloud)),
                Step(f"Create subnetwork {cloud.n.subnetwork}", lambda ctx: network.create_subnetwork(cloud)),
            ]
            if settings.GCE_CONSOLE_NETWORK:
                steps.append(Step("Peer with the console's network", lambda ctx: network.create_console_peering(cloud)))
            if net.get("cloud_nat"):
                steps.append(Step(f"Create Cloud NAT {cloud.n.router}", lambda ctx: network.create_nat(cloud)))
            if fabric.cluster_nets(cloud):
                steps.append(Step("Create the GPU fabric networks", lambda ctx: fabric.create_fabric(cloud)))
        steps.append(Step("Create firewall rules", lambda ctx: network.create_firewalls(cloud)))
        if identity.per_cluster(cloud):
            steps.append(
                Step(
                    f"Create the nodes' service account {identity.email(cloud)}",
                    lambda ctx: identity.create_service_account(cloud),
                )
            )
        if net.get("private_services_range") and (store.get("filestore_home") or store.get("lustre")):
            steps.append(
                Step("Set up private services access", lambda ctx: network.create_private_services_access(cloud))
            )
        if store.get("filestore_home"):
            steps.append(Step(f"Create Filestore {cloud.n.filestore}", lambda ctx: storage.create_filestore(cloud)))
        if store.get("lustre"):
            steps.append(Step(f"Create Managed Lustre {cloud.n.lustre}", lambda ctx: storage.create_lustre(cloud)))
        if store.get("gcs_buckets"):
            steps.append(Step("Create or check the Cloud Storage buckets", lambda ctx: storage.ensure_buckets(cloud)))
        if storage.existing_names(spec):
            steps.append(Step("Read the file systems the spec names", lambda ctx: storage.read_existing(cloud)))
        for pool in cloud.compute_pools:
            if instances.uses_own_placement(pool):
                steps.append(
                    Step(
                        f"Create placement policy for {pool['id']}",
                        lambda ctx, p=pool: instances.create_placement(cloud, p),
                    )
                )
            steps.append(
                Step(
                    f"Create instance template for {pool['id']}",
                    lambda ctx, p=pool: instances.create_template(cloud, p),
                )
            )
        steps.append(Step("Create the cluster's keys in Secret Manager", lambda ctx: keys.create_keys(cloud)))
        steps.append(Step("Create the controller and login nodes", lambda ctx: instances.create_head_nodes(cloud)))
        # New workers before the controller reads their names: slurmctld resolves every node's host
        # name when it starts (measured: 11 s per attempt, 5 attempts, for a name not in DNS yet),
        # and their slurmds keep trying until the controller knows them.
        for pool in cloud.compute_pools:
            steps.append(
                Step(f"Create {pool['id']} nodes (bulkInsert)", lambda ctx, p=pool: instances.create_workers(cloud, p))
            )
        steps.append(
            Step("Update slurm.conf on the controller and login nodes", lambda ctx: slurm_conf.update_slurm_conf(cloud))
        )
        steps.append(
            Step("Wait for the controller and login nodes to start", lambda ctx: instances.wait_started(cloud))
        )
        wanted = list(cluster.compute_nodes().values_list("name", flat=True))
        new = list(cluster.compute_nodes().filter(state=NodeState.PROVISIONING).values_list("name", flat=True))
        if self.runs_jobs:
            steps.append(
                Step(
                    "Wait for slurmctld to know every wanted node",
                    lambda ctx: slurm_waits.wait_node_list(
                        self.slurm(cluster), wanted, settings.GCE_STARTUP_TIMEOUT, settings.GCE_POLL_INTERVAL
                    ),
                )
            )
            # Configless slurmds keep the slurm.conf they fetched: a reconfigure makes them fetch the new
            # one (else a job step on an old node cannot find a new node: "can't find address for host").
            steps.append(Step("Reconfigure running nodes", lambda ctx: self.agent(cluster).slurm("reconfigure")))
            if hold and new:
                # Slurm 22.05 reserves only nodes it knows: the hold follows the restart that taught it
                # them, a moment before their slurmds (retrying every 2 s) register.
                steps.append(
                    Step("Hold the new nodes for their first health scan", lambda ctx: self.hold(cluster, hold, new))
                )
        if cluster.nodes.filter(state=NodeState.DELETING).exists():
            steps.append(Step("Delete removed nodes", lambda ctx: instances.delete_removed_workers(cloud)))
        steps.append(Step("Wait for every instance to run", lambda ctx: instances.wait_running(cloud)))
        if self.runs_jobs:
            steps.append(
                Step(
                    "Wait for nodes to register idle",
                    lambda ctx: slurm_waits.wait_idle(
                        self.slurm(cluster),
                        wanted,
                        settings.GCE_STARTUP_TIMEOUT,
                        interval=settings.GCE_POLL_INTERVAL,
                        failed=lambda waiting: instances.failed_startups(cloud, waiting),
                    ),
                )
            )
        return steps

    def delete_steps(self, cluster):
        cloud = Cloud(self, cluster)
        return [
            Step("Delete instances", lambda ctx: instances.delete_instances(cloud)),
            Step("Delete instance templates and placement policies", lambda ctx: instances.delete_templates(cloud)),
            Step("Delete Managed Lustre and Filestore", lambda ctx: storage.delete_storage(cloud)),
            Step("Delete firewall rules", lambda ctx: network.delete_firewalls(cloud)),
            Step("Delete private services access", lambda ctx: network.delete_private_services_access(cloud)),
            Step("Delete the GPU fabric networks", lambda ctx: fabric.delete_fabric(cloud)),
            Step("Delete subnetwork and network", lambda ctx: network.delete_network(cloud)),
            Step("Delete the cluster's keys from Secret Manager", lambda ctx: keys.delete_keys(cloud)),
            Step("Delete the nodes' service account", lambda ctx: identity.delete_service_account(cloud)),
        ]

    # -- reaching the cluster --------------------------------------------------------------------
    # The controller's internal address (read when its startup finished); the JWT and agent keys are
    # in Secret Manager (keys.py). A console that only provisions reaches nothing.

    def controller_url(self, cluster, port):
        address = (cluster.backend_state or {}).get("controller_ip")
        if not settings.GCE_REACH_CLUSTERS or not address:
            return None
        return f"https://{address}:{port}"

    def slurm_endpoint(self, cluster):
        """slurmrestd through the agent's TLS relay (slurmrestd itself listens on a Unix socket of its own)."""
        url = self.controller_url(cluster, settings.GCE_SLURMRESTD_PORT)
        cloud = Cloud(self, cluster)
        return url and SlurmEndpoint(url, keys.read_key(cloud, "jwt"), keys.cluster_ca(cloud))

    def tls_bundle(self, cluster):
        if not settings.GCE_REACH_CLUSTERS:
            return None
        return keys.read_key(Cloud(self, cluster), "tls")

    def store_tls(self, cluster, bundle):
        keys.replace_key(Cloud(self, cluster), "tls", bundle)

    def agent_endpoint(self, cluster):
        url = self.controller_url(cluster, settings.GCE_AGENT_PORT)
        cloud = Cloud(self, cluster)
        return url and AgentEndpoint(url, keys.read_key(cloud, "agent").hex(), keys.cluster_ca(cloud))

    def shared_dir(self, cluster):
        return slurm_conf.SHARED

    def login_command(self, cluster):
        """SSH to the first login node through IAP with OS Login (no external address needed: the SSH
        rule admits IAP's range, GCE_SSH_SOURCE_RANGES). The user needs roles/compute.osLogin and
        roles/iap.tunnelResourceAccessor. https://cloud.google.com/iap/docs/using-tcp-forwarding"""
        spec = cluster.spec
        login_id = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        zone = next(p["zone"] for p in spec["node_pools"] if p["id"] == login_id)
        login = names_for(cluster).instance(f"{login_id}-0")
        project = cluster.project.gcp_project_id
        return f"gcloud compute ssh {login} --zone {zone} --project {project} --tunnel-through-iap" if project else ""

    def node_python(self, cluster):
        return settings.GCE_NODE_PYTHON

    # Instance states in which the machine is gone for Slurm: the repair watcher takes them as "down".
    STOPPED = {"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"}

    def node_statuses(self, cluster):
        """Slurm's node states (through slurmrestd), where the cloud's word wins: a stopped or
        terminated instance (host error, preemption) reads as down at once, and so does a wanted node
        whose instance is gone (a Spot or Flex-start VM the cloud took back is deleted), without
        waiting for Slurm's SlurmdTimeout. A console that only provisions sees the instances alone."""
        cloud = Cloud(self, cluster)
        found = {
            instance.name.removeprefix(f"{cloud.n.prefix}-"): instance
            for instance in instances.list_instances(cloud)
            if instance.labels.get("tcc-role") == "compute"
        }
        gone = {}
        for name, instance in found.items():
            if instance.status in self.STOPPED:
                gone[name] = f"Compute Engine instance {instance.status}"
        for node in cluster.compute_nodes().filter(state=NodeState.READY).select_related("node_pool"):
            if node.name not in found:
                model = node.node_pool.provisioning_model
                taken = model in ("SPOT", "FLEX_START")
                why = f"the {model.replace('_', '-').title()} VM was taken back" if taken else "instance missing"
                gone[node.name] = f"Compute Engine: {why}"
        if self.runs_jobs:
            statuses = super().node_statuses(cluster)
        else:
            statuses = [
                NodeStatus(
                    name=name,
                    state=instance.status.lower(),
                    reason=f"Compute Engine instance {instance.status}",
                    partitions=[instance.labels.get("tcc-pool", "")],
                )
                for name, instance in found.items()
            ]
        known = {status.name for status in statuses}
        statuses += [NodeStatus(name=name, state="down", reason=why) for name, why in gone.items() if name not in known]
        for status in statuses:
            if status.name in gone:
                status.state, status.reason = "down", gone[status.name]
            # Slurm knows a VM by its instance name; the console reaches it at its internal address.
            interfaces = found[status.name].network_interfaces if status.name in found else []
            status.address = interfaces[0].network_i_p if interfaces else ""
        return statuses

    def jobs(self, cluster):
        return super().jobs(cluster) if self.runs_jobs else []

    # -- remediation --------------------------------------------------------------------------
    # Drain, resume and holds are the base class's (the cluster agent); reboot is an instance reset;
    # reinstall deletes the instance and makes it again from the pool's template. Replace needs
    # nothing here: it is a resize (apply_steps) that adds one node and removes another.

    def kill_node(self, cluster, node):
        instances.stop_instance(Cloud(self, cluster), node)

    def reboot(self, cluster, node):
        self.restart(cluster, node, instances.reset_instance)

    def reinstall(self, cluster, node):
        self.restart(cluster, node, instances.recreate_instance)

    def restart(self, cluster, node, how):
        cloud = Cloud(self, cluster)
        if self.runs_jobs:
            self.restart_node(cluster, node, lambda: how(cloud, node), settings.GCE_STARTUP_TIMEOUT)
        else:
            how(cloud, node)
