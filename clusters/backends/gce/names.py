"""Every name a gce cluster's resources get, derived from its project and cluster id alone, and the
marker that says a resource is the cluster's own."""

import hashlib
from dataclasses import dataclass

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
