"""A backend for service tests that fails on purpose: its steps raise what the cluster name asks for.

Each test gets a fresh instance from the `scripted` fixture (conftest.py), so what one test records
(`calls`) or makes Slurm report (`down`) never leaks into the next.
"""

from clusters.backends.base import Backend, NodeShape, PermanentBackendError, Step, TransientBackendError


class ScriptedBackend(Backend):
    name = "scripted"
    label = "Scripted (tests)"

    def __init__(self):
        self.calls = []  # (action, node), for tests that count what a repair did
        self.down = set()  # node names the fake Slurm reports down
        self.during = None  # ctx -> None, called inside the second step (a test's long-running work)
        self.queue = []  # the JobStatus list the fake Slurm reports
        self.silent = False  # the fake Slurm does not answer
        self.slurm_calls = 0  # node and job queries made of the fake Slurm

    def steps(self, cluster, hold=None):
        def second(ctx):
            if self.during is not None:
                self.during(ctx)
            if cluster.name.startswith("flaky"):
                raise TransientBackendError("zone capacity exhausted, try later")
            if cluster.name.startswith("broken"):
                raise PermanentBackendError("quota CPUS exceeded: need 16, have 8")

        return [Step("First step", lambda ctx: None), Step("Second step", second)]

    apply_steps = delete_steps = steps

    def ask_slurm(self):
        self.slurm_calls += 1
        if self.silent:
            raise TransientBackendError("slurmctld: connection refused")

    def node_statuses(self, cluster):
        from clusters.slurm.states import NodeStatus

        self.ask_slurm()
        return [
            NodeStatus(name=n.name, state="down" if n.name in self.down else "idle", address=f"10.9.0.{n.index}")
            for n in cluster.compute_nodes()
        ]

    def drain(self, cluster, node, reason):
        self.calls.append(("drain", node))

    def resume(self, cluster, node):
        self.calls.append(("resume", node))

    def reboot(self, cluster, node):
        self.calls.append(("reboot", node))

    def reinstall(self, cluster, node):
        self.calls.append(("reinstall", node))

    def jobs(self, cluster):
        self.ask_slurm()
        return list(self.queue)

    def cancel_job(self, cluster, job_id):
        self.ask_slurm()
        self.calls.append(("cancel", job_id))

    def node_shape(self, cluster, pool):
        return NodeShape(cpus=1, memory_mb=1024, note="scripted")
