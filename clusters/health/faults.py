"""Fault injection: rehearse scans and repairs on a cluster.

GPU faults run simulated GPU tools on the node (clusters/health/simulated/) that print what the real
ones print on a faulty GPU, so the checks read them as they read real outputs. Faults other than
kill_node are a small JSON file per node in the shared home (`.tcc/faults/<node>.json`,
written through the cluster agent), which the health agent reads on that node; kill_node makes the
node die at once (local: its slurmd and job steps are killed; gce: its instance is stopped). Only a
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
    "gpu_dcgm": "dcgmi diag reports GPU 3's memory test failed (a row remap pending) and exits 226",
    "gpu_ecc": "nvidia-smi reports 2 uncorrectable ECC errors and a pending row remap on GPU 3",
    "gpu_xid": "the kernel log has an Xid 79 (a GPU fell off the bus)",
    "kill_node": "the node dies at once: its slurmd and job steps are gone (Slurm marks it down)",
    "clear": "remove every fault of the node",
}
VALUED = {"slow", "slow_link"}


FOLDER = ".tcc/faults"  # below the cluster's shared home


class FaultError(ConsoleError):
    pass


def faults_file(node):
    return f"{FOLDER}/{node}.json"


def inject(cluster, node, kind, value=5):
    """Inject `kind` into `node`; returns a sentence saying what the node has now."""
    if kind not in KINDS:
        raise FaultError(f"unknown fault {kind!r}; choose from: {', '.join(KINDS)}")
    if not cluster.nodes.filter(name=node).exists():
        raise FaultError(f"{cluster} has no node {node}")
    try:
        if kind == "kill_node":
            services.inject_fault(cluster, node)
            return f"{node}: killed"
        services.fault_backend(cluster)  # a backend that rehearses failures, else Conflict
        path = faults_file(node)
        faults = json.loads(services.read_file(cluster, path)) if services.file_exists(cluster, path) else {}
        if kind == "clear":
            faults = {}
        elif kind.startswith("gpu_"):
            faults["gpu"] = kind.removeprefix("gpu_")  # the simulated tools of clusters/health/simulated/
        else:
            faults[kind] = value if kind in VALUED else True
        services.write_file(cluster, path, json.dumps(faults))
    except ConsoleError as exc:
        raise FaultError(exc.message) from None
    return f"{node}: {faults or 'no faults'}"
