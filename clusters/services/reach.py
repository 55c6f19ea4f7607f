"""How pages, recipes and health reach a cluster's backend: these service functions, never a backend.

Each asks the cluster's backend for one thing and turns a failure into a ConsoleError the surfaces
know how to answer (a 503 when the cluster is not answering, a 409 when it cannot do that).
"""

from console.errors import Conflict, Unavailable

from ..accounts import account_for
from ..backends import all_backends, get_backend
from ..choices import NodeRole
from ..work import BackendError


def backend_choices():
    """{name: label} of the configured backends, the default first."""
    return {name: backend.label for name, backend in all_backends().items()}


def backend_label(cluster):
    return get_backend(cluster.backend).label


def node_shapes(cluster):
    """[(pool, NodeShape or None)]: what each node of each pool really gets (compute pools only)."""
    backend = get_backend(cluster.backend)
    return [
        (pool, backend.node_shape(cluster, pool) if pool.role == NodeRole.COMPUTE else None)
        for pool in cluster.node_pools.prefetch_related("partitions")
    ]


def gpus_per_node(cluster, pool):
    """The GPUs a node of `pool` really has on its backend (0 where GPUs are not emulated)."""
    return get_backend(cluster.backend).node_shape(cluster, pool).gpus


def plan(cluster):
    """(kind, name, detail) of every resource a create of this draft would make."""
    return get_backend(cluster.backend).plan(cluster.project, cluster.name, cluster.spec)


def login_env(cluster):
    return get_backend(cluster.backend).login_env(cluster)


def login_command(cluster):
    """How a user opens a shell on the login node ("" for a cluster on this machine or not usable)."""
    if not cluster.is_usable:
        return ""
    return get_backend(cluster.backend).login_command(cluster)


def shared_dir(cluster):
    """The folder every node and the console see (the cluster's /home); Conflict where there is none."""
    return call(cluster, "shared_dir")


def submit_batch(cluster, path, user=None):
    """Submit the batch script at `path` (relative to the shared home, written with write_file) as
    `user`'s POSIX account in the cluster's project, made on first use; the script's folder becomes
    the account's. Without a user: the service account. The job id."""
    return call(cluster, "submit_batch", path, account_of(cluster, user))


def job_status(cluster, job_id):
    return call(cluster, "job_status", job_id)


def jobs_named(cluster, name):
    """The jobs in Slurm's queue now (recently ended ones included) called `name` (for workers: pages
    read the synced rows)."""
    return [job for job in call(cluster, "jobs") if job.name == name]


def job_address(cluster, job_id):
    """Where job `job_id` runs, as Slurm knows it: the address (NodeAddr) of its one node; "" while it has
    no node yet (for workers: a replica's host comes from here, never from what the job itself says)."""
    return job_node(cluster, job_id)[1]


def job_node(cluster, job_id):
    """(node name, its address) of the one node job `job_id` runs on, as Slurm knows them; ("", "") while
    it has none yet (or runs on several)."""
    job = call(cluster, "job_status", job_id)
    if job is None or not job.nodes or any(c in job.nodes for c in "[,"):
        return "", ""
    address = next((node.address for node in call(cluster, "node_statuses") if node.name == job.nodes), "")
    return (job.nodes, address) if address else ("", "")


def cancel_job(cluster, job_id):
    return call(cluster, "cancel_job", job_id)


def drain(cluster, node, reason):
    return call(cluster, "drain", node, reason)


def call_slurm_rest(cluster, method, path, body=None, user=None):
    """(HTTP status, raw body) of one request to the cluster's slurmrestd, as `user`'s POSIX account
    in the cluster's project (made on first use); without a user, as the console's service account."""
    return call(cluster, "call_slurm_rest", method, path, body, account_of(cluster, user))


def account_of(cluster, user):
    """`user`'s account in the cluster's project, made on the cluster if need be; None without a user
    (the backend then acts as the console's service account)."""
    if user is None:
        return None
    account = account_for(user, cluster.project)
    call(cluster, "ensure_account", account)
    return account


def inject_fault(cluster, node):
    """Kill the node at once (its slurmd and job steps), where the backend can rehearse failures."""
    fault_backend(cluster).kill_node(cluster, node)


def endpoints_refused(cluster):
    """Why the console's router cannot reach serving replicas on the cluster's nodes ("" when it can)."""
    return get_backend(cluster.backend).endpoints_refused


def fault_backend(cluster):
    """The cluster's backend when it can rehearse failures (injects_faults); Conflict otherwise."""
    backend = get_backend(cluster.backend)
    if not backend.injects_faults:
        raise Conflict(f"Fault injection is not available on the {backend.label} backend")
    return backend


def call(cluster, method, *args):
    """backend.<method>(cluster, *args), with a transient failure as Unavailable (503) and a permanent
    one as Conflict."""
    return with_backend(cluster, lambda backend: getattr(backend, method)(cluster, *args))


def with_backend(cluster, work):
    """work(the cluster's backend), with its failures mapped as call() maps them."""
    try:
        return work(get_backend(cluster.backend))
    except BackendError as exc:
        raise (Unavailable if exc.retryable else Conflict)(str(exc)) from None
    except (OSError, ValueError) as exc:  # a daemon gone, an answer cut short
        raise Unavailable(f"Slurm is not answering: {exc}") from None
