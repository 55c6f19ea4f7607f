"""The backend contract: what every cluster backend (local Slurm, Compute Engine) must provide.

A backend turns a cluster's desired state (its Node rows and spec) into real machines and a running
Slurm, and reports what Slurm sees. The operations engine owns the Operation row, progress and
events; a backend only hands it an ordered list of named steps (`Step(name, run)`, `run(ctx)`) and
runs them when asked. A backend says what it can do with capability attributes (`runs_jobs`,
`injects_faults`, `endpoints_refused`); callers ask those, never the backend's name.

Rules every backend keeps:

* Steps are idempotent. A step run twice (a worker died after doing it, or the task was delivered
  again) finds the work done and does nothing. Names of everything a backend creates are derived
  from the cluster, never random, so a rerun can find them.
* Waiting is a heartbeat: every loop that waits calls `clusters.work.heartbeat(detail)` (or
  `processes.wait_for`, which does), so a step that waits half an hour is not taken for a dead worker.
* Errors are `BackendError`s. `TransientBackendError` means a retry can help (a port in use, a
  capacity error, an API timeout); `PermanentBackendError` means it cannot (bad quota, bad config).
* Whatever a backend must remember between steps lives in `cluster.backend_state`, saved with
  `save_state()`; secrets never do (they live in files or secret stores the backend owns).
* The console reaches every cluster's Slurm the same way: through its slurmrestd, and the
  cluster's files through its agent (`agent_endpoint`, clusters/agent/). A backend says
  where with `slurm_endpoint(cluster)` (URL and JWT key); node states, jobs, job status, cancels
  and `:callSlurmRestApi` then go through the one client in clusters/slurm/rest.py, whatever the
  backend. A backend whose slurmrestd the console cannot reach yet answers None and overrides them.
  Batch jobs are submitted through slurmrestd too, with the script in the request (its #SBATCH lines
  read by clusters/slurm/batch.py); what slurmrestd 0.0.38 cannot do (drain, resume, holds as
  reservations, reconfigure, handing a run's folder to a user) the agent does beside slurmctld.
"""

import contextlib
import posixpath
from dataclasses import dataclass

from .. import processes
from ..agent.client import AgentClient, AgentEndpoint, AgentRefused
from ..slurm.batch import job_properties
from ..slurm.rest import SERVICE_USER, SlurmEndpoint, SlurmRest
from ..slurm.states import JobStatus, NodeStatus
from ..work import BackendError, PermanentBackendError, Step, TransientBackendError
from . import slurm_waits

__all__ = [
    "AgentEndpoint",
    "Backend",
    "BackendError",
    "Finding",
    "JobStatus",
    "NodeShape",
    "NodeStatus",
    "PermanentBackendError",
    "SlurmEndpoint",
    "Step",
    "TransientBackendError",
]


@dataclass
class Finding:
    """One preflight check: status "ok", "fail" or "warn", what was checked, and what was found."""

    status: str
    check: str
    detail: str


@dataclass
class NodeShape:
    """What one node of a pool really gets on a backend, and a sentence saying how it differs from the spec."""

    cpus: int
    memory_mb: int
    gpus: int = 0
    note: str = ""


class Backend:
    """Base class; subclasses set `name` and implement every method below."""

    name = ""
    label = ""
    # Whether the console can submit Slurm jobs here (shared_dir, submit_batch, job_status): health
    # scans and recipes need it.
    runs_jobs = False
    # Whether the console can rehearse failures here (kill_node; fault files the health agent reads):
    # admin fault actions.
    injects_faults = False
    # Why the console's router cannot reach serving replicas on this backend's compute nodes ("" when it
    # can): endpoints are refused on its clusters with this reason.
    endpoints_refused = ""

    def validate_spec(self, spec):
        """Yield (field path, message) for what this backend cannot build from a valid spec."""
        return []

    def update_problems(self, old_spec, new_spec):
        """Yield (field path, message) for a node-count change (the only change an update makes) that this
        backend cannot make to what the old spec built."""
        return []

    def project_problems(self, project):
        """Why this backend cannot build clusters for `project` yet (missing settings); empty when it can."""
        return []

    def preflight(self, project, spec):
        """Is the backend's side ready for this spec (APIs, quotas, reservations)? A list of findings
        with .status ("ok", "fail", "warn"), .check and .detail; [] where there is nothing to check."""
        return []

    def plan(self, project, cluster_name, spec):
        """(kind, name, detail) for every resource a create would make, named as it will be: the dry run."""
        raise NotImplementedError

    def apply_steps(self, cluster, hold=None):
        """Steps that bring the real cluster to its wanted nodes: create, grow or shrink.

        With `hold` (a name; only asked of backends that run jobs), the nodes this apply starts are put
        in that hold (see hold()) before they can take a job: they are scanned before users get them."""
        raise NotImplementedError

    def delete_steps(self, cluster):
        """Steps that remove everything this backend created for the cluster, and nothing else."""
        raise NotImplementedError

    def slurm_endpoint(self, cluster):
        """Where the cluster's slurmrestd answers the console (a SlurmEndpoint), or None while it cannot."""
        return None

    def slurm(self, cluster):
        """The slurmrestd client for the cluster; PermanentBackendError where there is none yet."""
        return self.client_for(self.slurm_endpoint(cluster), SlurmRest, "slurmrestd")

    def agent_endpoint(self, cluster):
        """Where the cluster agent (files under the shared home) answers the console, or None while it cannot."""
        return None

    def agent(self, cluster):
        """The cluster agent's client; PermanentBackendError where there is none yet."""
        return self.client_for(self.agent_endpoint(cluster), AgentClient, "agent")

    def tls_bundle(self, cluster):
        """The controller's TLS bundle as the console keeps it (bytes: the controller's key and certificate,
        then the CA certificates the console pins for the cluster; clusters/tls.py), or None where it has none
        (a backend that reaches no controller)."""
        return None

    def store_tls(self, cluster, bundle):
        """Keep `bundle` as the controller's: the CAs the console pins from now on, and what the controller
        serves after a restart (the running agent is switched by its `tls` call; clusters/services/certificates.py).
        The bundle it replaces is gone after (its private key with it)."""
        raise NotImplementedError

    def client_for(self, endpoint, client, what):
        if endpoint is None:
            raise PermanentBackendError(f"The console cannot reach this cluster's {what} on {self.label} yet")
        return client(endpoint)

    def node_statuses(self, cluster):
        """What Slurm says of each node now (a list of NodeStatus)."""
        return self.slurm(cluster).nodes()

    def jobs(self, cluster):
        """Slurm's queue now (a list of JobStatus)."""
        return self.slurm(cluster).jobs()

    def node_shape(self, cluster, pool):
        """The NodeShape each node of `pool` gets on this backend; shown on the cluster page."""
        raise NotImplementedError

    def shared_dir(self, cluster):
        """The cluster's shared home as its nodes see it (an absolute path on the cluster, e.g. /home):
        scripts name their outputs there; the console itself reaches it only through the agent."""
        raise PermanentBackendError(f"The {self.name} backend cannot run recipes yet")

    def node_python(self, cluster):
        """The Python on the cluster's nodes that runs health checks and recipes (numpy; torch and
        transformers for recipes)."""
        raise PermanentBackendError(f"The {self.name} backend cannot run recipes yet")

    def login_env(self, cluster):
        """Environment a user sets on the login node to reach this cluster's Slurm ({} when nothing)."""
        return {}

    def login_command(self, cluster):
        """The command that opens a shell on the cluster's login node from a user's machine ("" when
        the login node is this machine)."""
        return ""

    def job_environment(self, cluster):
        """The environment a batch job starts with (slurmrestd passes none of its own)."""
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **self.login_env(cluster)}

    def submit_batch(self, cluster, path, account=None):
        """Submit the batch script at `path` (relative to the shared home, written through the agent)
        from its folder; returns the Slurm job id. With an `account` (clusters.accounts.Account) the
        job is that account's: its folder becomes the account's and Slurm runs it as the account;
        without, as the console's service account. A directive the console cannot pass on is a
        PermanentBackendError naming its line."""
        agent = self.agent(cluster)
        script = agent.read(path).decode()
        job = job_properties(script)
        folder = posixpath.dirname(path)
        if account is not None:
            agent.own(folder, account.name, account.group)
        job.setdefault("current_working_directory", posixpath.join(str(self.shared_dir(cluster)), folder))
        job["environment"] = self.job_environment(cluster)
        return self.slurm(cluster).submit(script, job, user=account.name if account is not None else SERVICE_USER)

    def cancel_job(self, cluster, job_id):
        self.slurm(cluster).cancel(job_id)

    # -- remediation (issue: health scans and self-repair) ---------------------------------------

    def drain(self, cluster, node, reason):
        """Stop new jobs landing on `node`; the reason shows in sinfo."""
        self.agent(cluster).slurm("drain", node=node, reason=reason)

    def resume(self, cluster, node):
        self.agent(cluster).slurm("resume", node=node)

    def restart_node(self, cluster, node, restart, timeout):
        """A reboot as Slurm should see it: the node is marked DOWN first, so its jobs end (requeueable
        ones are requeued) at once instead of after SlurmdTimeout; then `restart()` (the backend's own
        way: a slurmd restart, an instance reset) and a wait until the node's new slurmd registered."""
        slurm = self.slurm(cluster)
        before = slurm_waits.slurmd_start_time(slurm, node)
        with contextlib.suppress(AgentRefused):  # a node Slurm cannot mark down is restarted all the same
            self.agent(cluster).slurm("down", node=node, reason="tcc reboot")
        restart()
        slurm_waits.wait_registered(slurm, node, before, timeout)

    def reboot(self, cluster, node):
        """Restart the node (its jobs die with it) and wait until its slurmd registers again."""
        raise PermanentBackendError(f"The {self.name} backend cannot reboot nodes yet")

    def reinstall(self, cluster, node):
        """Like reboot, from a fresh node state (image / template)."""
        raise PermanentBackendError(f"The {self.name} backend cannot reinstall nodes yet")

    def clean_scratch(self, cluster, node):
        raise PermanentBackendError(f"The {self.name} backend cannot clean scratch space yet")

    def hold(self, cluster, name, nodes):
        """Keep `nodes` for jobs that ask for hold `name` (on Slurm, a reservation): no other job starts
        on them, while a job asking for the hold may use other nodes too. Again with the same name: the
        hold covers `nodes` as well. Only asked of backends that run jobs.

        On Slurm: a reservation for root, made by the agent. FLEX lets a scan job asking for it use
        unheld nodes too (scheduled by backfill); IGNORE_JOBS lets it cover a node that has jobs."""
        self.agent(cluster).slurm("hold", name=name, nodes=list(nodes))

    def release(self, cluster, name):
        """End hold `name` (its nodes take any job again); a hold that is gone already is fine. Slurm
        refuses while a job that asked for it is still completing, so this waits up to 30 s."""
        agent, answer = self.agent(cluster), {}

        def released():
            answer.update(agent.slurm("release", name=name))
            return answer["done"]

        if not processes.wait_for(released, timeout=30, interval=0.5, waiting_for=f"Slurm to end hold {name}"):
            raise TransientBackendError(f"Slurm would not end hold {name}: {answer.get('error', '')}")

    def kill_node(self, cluster, node):
        """Kill the node's slurmd and job steps at once, as a dead machine would (needs injects_faults)."""
        raise PermanentBackendError(f"The {self.name} backend cannot inject faults")

    def call_slurm_rest(self, cluster, method, path, body=None, account=None):
        """Forward a request to the cluster's slurmrestd as `account` (a clusters.accounts.Account;
        None: the console's service account); returns (HTTP status, raw body)."""
        user = account.name if account is not None else SERVICE_USER
        return self.slurm(cluster).request(method, path, body, user=user)

    def ensure_account(self, cluster, account):
        """Make `account` (user, and its project group) exist on the cluster, in the group that owns the
        cluster's shared home (idempotent); the cluster agent makes it beside slurmctld."""
        self.agent(cluster).account(account.name, account.group)

    def remove_account(self, cluster, account):
        """`account`'s user left its project: out of the group that owns the shared home and that the
        partitions admit, and every job of theirs cancelled (the cluster agent does both)."""
        self.agent(cluster).leave(account.name, account.group)

    def job_status(self, cluster, job_id):
        """The job's JobStatus while Slurm still knows it, else None."""
        return self.slurm(cluster).job(job_id)

    @staticmethod
    def save_state(cluster, **values):
        cluster.backend_state = {**cluster.backend_state, **values}
        type(cluster).objects.filter(pk=cluster.pk).update(backend_state=cluster.backend_state)
