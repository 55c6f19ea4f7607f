"""The `local` backend: a real Slurm cluster on this machine, one directory per cluster.

Each cluster gets its own munged (own key and socket), its own slurmctld and one `slurmd -N <node>`
per compute node, all on their own ports, with slurm.conf, state, spool and logs under
LOCAL_CLUSTERS_DIR/c<cluster id>. The login node is this machine itself: `SLURM_CONF=<dir>/slurm.conf`
makes sinfo, sbatch and squeue talk to the cluster. Its slurmrestd and cluster agent run here too, and
the console reaches this cluster through them exactly as it reaches a gce one (backends/base.py).

The work lives in the modules beside this one, one seam each: paths (the folder and its secrets),
conf (slurm.conf, node shapes), ports, daemons (start, stop, wait) and remediation (reboot, faults);
this class maps the backend contract onto them.
"""

import shutil
import sys

from django.conf import settings

from ... import tls
from ...accounts import project_group
from ...choices import NodeState
from ...spec import pool_node_count
from .. import slurm_waits
from ..base import AgentEndpoint, Backend, Finding, SlurmEndpoint, Step
from . import conf, daemons, ports, preflight, remediation
from .paths import paths_for, prepare, replace_secret


def ca_of(paths):
    """The cluster's CA certificate, from the controller's bundle (clusters/tls.py)."""
    return tls.ca_of(paths.tls_bundle.read_bytes())


class LocalBackend(Backend):
    name = "local"
    label = "Local Slurm on this machine"
    runs_jobs = True
    injects_faults = True

    # -- contract -----------------------------------------------------------------------------

    def validate_spec(self, spec):
        login = spec["orchestrator_spec"]["slurm_spec"].get("login_node_pool_id")
        for i, pool in enumerate(spec["node_pools"]):
            if pool.get("id") == login and pool_node_count(pool) != 1:
                yield (
                    f"node_pools[{i}].scaling_spec",
                    "the local backend has one login node (this machine): set min_node_count and max_node_count to 1",
                )
        total = sum(pool_node_count(p) for p in spec["node_pools"] if p.get("id") != login)
        if total > settings.LOCAL_MAX_NODES:
            yield (
                "node_pools",
                f"the local backend runs at most {settings.LOCAL_MAX_NODES} compute nodes on this machine; "
                f"this spec asks for {total} (use the gce backend for more)",
            )

    def node_shape(self, cluster, pool):
        return conf.node_shape(cluster, pool)

    def plan(self, project, cluster_name, spec):
        login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        items = [
            ("Cluster directory", f"{settings.LOCAL_CLUSTERS_DIR}/c<id>", "slurm.conf, state, spool, logs, /home"),
            ("munged", "munge/munge.socket", "its own key (secrets/munge.key, 0400)"),
            ("slurmctld", "slurmctld", "its own port from LOCAL_PORT_RANGE"),
        ]
        for pool in spec["node_pools"]:
            if pool["id"] == login:
                items.append(("Login node", "this machine", "SLURM_CONF=<cluster directory>/slurm.conf"))
                continue
            for i in range(pool_node_count(pool)):
                items.append(
                    ("slurmd", f"{pool['id']}-{i}", f"{pool['machine_spec']['machine_type']} scaled to this machine")
                )
        for partition in spec["orchestrator_spec"]["slurm_spec"]["partitions"]:
            items.append(("Slurm partition", partition["id"], ", ".join(partition["node_pool_ids"])))
        return items

    def apply_steps(self, cluster, hold=None):
        paths = paths_for(cluster)
        wanted = list(cluster.compute_nodes().select_related("node_pool"))
        names = [n.name for n in wanted]
        new = [n.name for n in wanted if n.state == NodeState.PROVISIONING]
        leaving = list(cluster.nodes.filter(state=NodeState.DELETING))

        def make_folder(ctx):
            prepare(paths, project_group(cluster.project))
            conf.write_health_check(paths)

        steps = [
            Step("Prepare the cluster directory and munge key", make_folder),
            Step("Start munged", lambda ctx: daemons.start_munged(paths)),
            Step("Assign ports", lambda ctx: ports.assign(cluster, wanted)),
        ]
        steps += [
            Step(f"Stop slurmd on {n.name}", lambda ctx, n=n: daemons.stop_slurmd(paths, n.name)) for n in leaving
        ]
        # slurmrestd and the agent come up before slurmctld: every later step reaches Slurm through
        # them, as the console does (and as on gce, where the controller's startup script starts them).
        steps += [
            Step("Write slurm.conf", lambda ctx: conf.write(cluster, paths, wanted)),
            Step("Start slurmrestd", lambda ctx: daemons.start_slurmrestd(cluster, paths)),
            Step("Start the cluster agent", lambda ctx: daemons.start_agent(cluster, paths)),
            Step("Start slurmctld", lambda ctx: daemons.start_slurmctld(cluster, paths, self.slurm(cluster))),
        ]
        if hold and new:
            # Before their slurmd starts: no user job can land on a node between registering and its scan.
            steps.append(
                Step("Hold the new nodes for their first health scan", lambda ctx: self.hold(cluster, hold, new))
            )
        steps += [
            Step(f"Start slurmd on {name}", lambda ctx, name=name: daemons.start_slurmd(cluster, paths, name))
            for name in names
        ]
        steps += [
            Step(
                "Reconfigure running nodes", lambda ctx: daemons.reconfigure(cluster, paths, names, self.agent(cluster))
            ),
            Step(
                "Wait for nodes to register idle",
                lambda ctx: slurm_waits.wait_idle(self.slurm(cluster), names, settings.LOCAL_NODE_IDLE_TIMEOUT),
            ),
        ]
        return steps

    def delete_steps(self, cluster):
        paths = paths_for(cluster)
        steps = [
            Step(f"Stop {what}", lambda ctx, stop=stop: stop())
            for what, stop in daemons.stop_all(paths, lambda: self.slurm(cluster))
        ]
        return [*steps, Step("Remove the cluster directory", lambda ctx: shutil.rmtree(paths.root, ignore_errors=True))]

    def preflight(self, project, spec):
        """This machine has Slurm's programs and plugins and munge (local/preflight.py)."""
        missing = preflight.problem()
        return [Finding("fail" if missing else "ok", "Slurm on this machine", missing or "programs and plugins found")]

    def slurm_endpoint(self, cluster):
        """The cluster's slurmrestd, through the agent's TLS relay on 127.0.0.1, and its JWT key (a 0600 file in
        the cluster's folder); the cluster's CA alone vouches for the relay."""
        paths = paths_for(cluster)
        port = cluster.backend_state.get("ports", {}).get("slurmrestd")
        if not port or not paths.jwt_key.exists() or not paths.tls_bundle.exists():
            return None  # not created yet, or made before slurmrestd (or TLS) was added
        return SlurmEndpoint(f"https://127.0.0.1:{port}", paths.jwt_key.read_bytes(), ca_of(paths))

    def tls_bundle(self, cluster):
        path = paths_for(cluster).tls_bundle
        return path.read_bytes() if path.exists() else None

    def store_tls(self, cluster, bundle):
        replace_secret(paths_for(cluster).tls_bundle, bundle)

    def agent_endpoint(self, cluster):
        """The cluster agent (TLS) on 127.0.0.1 and its key (a 0600 file in the cluster's folder)."""
        paths = paths_for(cluster)
        port = cluster.backend_state.get("ports", {}).get("agent")
        if not port or not paths.agent_key.exists() or not paths.tls_bundle.exists():
            return None
        return AgentEndpoint(f"https://127.0.0.1:{port}", paths.agent_key.read_bytes().hex(), ca_of(paths))

    def shared_dir(self, cluster):
        return paths_for(cluster).jobs

    def node_python(self, cluster):
        return sys.executable  # the nodes are this machine

    def login_env(self, cluster):
        return {"SLURM_CONF": str(paths_for(cluster).conf)}

    # -- remediation --------------------------------------------------------------------------

    def kill_node(self, cluster, node):
        remediation.kill_node(paths_for(cluster), node)

    def reboot(self, cluster, node):
        restart = lambda: remediation.restart_slurmd(cluster, paths_for(cluster), node)  # noqa: E731
        self.restart_node(cluster, node, restart, settings.LOCAL_NODE_IDLE_TIMEOUT)

    def reinstall(self, cluster, node):
        restart = lambda: remediation.restart_slurmd(cluster, paths_for(cluster), node, wipe=True)  # noqa: E731
        self.restart_node(cluster, node, restart, settings.LOCAL_NODE_IDLE_TIMEOUT)

    def clean_scratch(self, cluster, node):
        remediation.clean_scratch(paths_for(cluster), node)

    # -- for tests and benchmarks -------------------------------------------------------------

    def paths(self, cluster):
        return paths_for(cluster)
