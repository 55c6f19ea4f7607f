"""Fault injection for the local backend: rehearse scans and repairs on a cluster of this machine.

Faults other than kill_node are a small JSON file per node in the cluster's faults folder, which the
health agent reads on that node; kill_node kills the node's slurmd and job steps at once. Only a
backend that says it can (`injects_faults`) takes them.
Used by `manage.py inject_fault` and the Node admin's actions.
"""

import json

from console.errors import ConsoleError

from .. import services

KINDS = {
    "perturb": "the correctness check computes a slightly wrong result",
    "slow": "the speed check is throttled (VALUE 0-10, default 5)",
    "slow_link": (
        "every message the node sends in the interconnect check waits VALUE x 50 ms first "
        "(default 5: a quarter second, about 0.03 GB/s for the check's 4 MB: under the gloo floor)"
    ),
    "disk_full": "the disk check sees no free space",
    "kill_node": "the node dies: its slurmd and job steps are killed at once (Slurm marks it down)",
    "clear": "remove every fault of the node",
}
VALUED = {"slow", "slow_link"}


class FaultError(ConsoleError):
    pass


def faults_dir(cluster):
    return services.faults_dir(cluster)


def inject(cluster, node, kind, value=5):
    """Inject `kind` into `node`; returns a sentence saying what the node has now."""
    if kind not in KINDS:
        raise FaultError(f"unknown fault {kind!r}; choose from: {', '.join(KINDS)}")
    if not cluster.nodes.filter(name=node).exists():
        raise FaultError(f"{cluster} has no node {node}")
    try:
        if kind == "kill_node":
            services.inject_fault(cluster, node)
            return f"{node}: slurmd and its job steps killed"
        folder = faults_dir(cluster)
    except ConsoleError as exc:
        raise FaultError(exc.message) from None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{node}.json"
    faults = json.loads(path.read_text()) if path.exists() else {}
    if kind == "clear":
        faults = {}
    else:
        faults[kind] = value if kind in VALUED else True
    path.write_text(json.dumps(faults))
    return f"{node}: {faults or 'no faults'}"
