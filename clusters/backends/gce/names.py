"""Every name a gce cluster's resources get, derived from its project and cluster id alone, and the
marker that says a resource is the cluster's own."""

import hashlib
from dataclasses import dataclass

from ...spec.catalog import machine_type_info

OWNER_LABEL = "tcc-cluster"
MARKER = "managed-by=training-cluster-console"


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
    def cluster_tag(self):
        """The network tag every VM of the cluster carries: the internal firewall rule admits only it."""
        return f"{self.prefix}-node"

    @property
    def firewall_internal(self):
        return f"{self.prefix}-internal"

    @property
    def firewall_ssh(self):
        return f"{self.prefix}-ssh-login"

    @property
    def router(self):
        """The Cloud Router that carries the cluster's Cloud NAT (console.network.cloud_nat)."""
        return f"{self.prefix}-router"

    @property
    def nat(self):
        return f"{self.prefix}-nat"

    @property
    def firewall_console(self):
        """Admits the console's workers (GCE_CONSOLE_RANGES) to the controller's slurmrestd and agent."""
        return f"{self.prefix}-console"

    @property
    def firewall_serving(self):
        """Admits the console's router (GCE_CONSOLE_RANGES) to the compute nodes' serving replicas'
        ports (SERVING_REPLICA_PORTS)."""
        return f"{self.prefix}-serving"

    @property
    def console_peering(self):
        return f"{self.prefix}-console-peering"

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
    def service_account_id(self):
        """The accountId of the cluster's own service account (identity.py): IAM takes 6 to 30 characters
        matching [a-z]([-a-z0-9]*[a-z0-9]), so the prefix's head is cut to 13 and its digest kept whole."""
        head, _, digest = self.prefix.rpartition("-")
        return f"{head[:13].rstrip('-')}-{digest}"

    def secret(self, kind):
        """The Secret Manager secret of one of the cluster's keys (munge, jwt, agent; keys.py)."""
        return f"{self.prefix}-{kind}-key"

    def placement(self, pool_id):
        return f"{self.prefix}-place-{pool_id}"

    def template(self, pool_id):
        return f"{self.prefix}-tpl-{pool_id}"

    def instance(self, node_name):
        return f"{self.prefix}-{node_name}"


# 16 hex digits (64 bits) of sha256(project/cluster): two console projects sharing one GCP project
# cannot collide by chance, and one cannot pick a cluster id whose names (and owner label, the same
# prefix) land on another's; a 4-digit digest (clusters created before) was 65,536 tries away.
DIGEST_CHARS = 16


def names(project_slug, cluster_name, digest_chars=DIGEST_CHARS):
    digest = hashlib.sha256(f"{project_slug}/{cluster_name}".encode()).hexdigest()[:digest_chars]
    return Names(f"{cluster_name[:20].rstrip('-')}-{digest}")


def names_for(cluster):
    """The cluster's names: the prefix it was created with (kept in backend_state), else today's."""
    prefix = (cluster.backend_state or {}).get("gce_prefix")
    return Names(prefix) if prefix else names(cluster.project.slug, cluster.name)


def gpu_count(pool):
    """GPUs per machine of the pool: accelerator-optimized machine types (a2, a3, a4, g2) come with
    theirs, so the spec's optional accelerator_count is not the only word."""
    machine = pool.get("machine_spec", {})
    info = machine_type_info(machine.get("machine_type", ""))
    return int(machine.get("accelerator_count") or (info.accelerator_count if info else 0) or 0)


def is_gpu_pool(pool):
    return gpu_count(pool) > 0


def owner_and_name(path, project):
    """(project, name) of a resource named by path (`projects/P/.../NAME`), or (`project`, path) for a bare
    name, which is `project`'s own."""
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "projects":
        return parts[1], parts[-1]
    return project, parts[-1]


def rdma_profile(project, zone):
    """The zone's RoCE network profile, which RDMA VPCs are created from
    (https://cloud.google.com/vpc/docs/rdma-network-profiles)."""
    return f"projects/{project}/global/networkProfiles/{zone}-vpc-roce"
