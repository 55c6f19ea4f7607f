"""A backend for service tests that fails on purpose: its steps raise what the cluster name asks for."""

from clusters.backends.base import Backend, NodeShape, PermanentBackendError, Step, TransientBackendError


class ScriptedBackend(Backend):
    name = "scripted"
    label = "Scripted (tests)"

    def steps(self, cluster, hold=None):
        def fail():
            if cluster.name.startswith("flaky"):
                raise TransientBackendError("zone capacity exhausted, try later")
            if cluster.name.startswith("broken"):
                raise PermanentBackendError("quota CPUS exceeded: need 16, have 8")

        return [Step("First step", lambda: None), Step("Second step", fail)]

    apply_steps = delete_steps = steps

    calls = []  # (action, node), for tests that count what a repair did
    down = set()  # node names the fake Slurm reports down

    def node_statuses(self, cluster):
        from clusters.backends.base import NodeStatus

        return [
            NodeStatus(name=n.name, state="down" if n.name in self.down else "idle") for n in cluster.compute_nodes()
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
        return []

    def node_shape(self, cluster, pool):
        return NodeShape(cpus=1, memory_mb=1024, note="scripted")
