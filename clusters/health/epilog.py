"""The console's fast GPU checks after a job: Slurm's Epilog calls `tcc_gpu_check` (clusters/slurm/hooks.py),
which runs this on the node as root with the context a health scan wrote (GPU_CHECK's .json).

GPU inventory, ECC and Xids take a second or two, so they can run after every job; the first failure,
in the repair policy's order, drains the node with the reason "tcc CHECK: why", which the console's
watcher repairs like any other drained node (clusters/health/repair.py). A healthy node is left as it
is. This never fails the epilog: Slurm would drain the node with a reason that says nothing.

Usage: python -m clusters.health.epilog CONTEXT.json
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from . import FAIL, load_checks

CHECKS = ("ecc", "xid", "gpu_inventory")  # the repair policy's priority order (policy.json)


def context_for(node, context):
    """The scan's context with this node's pool's GPU figures and fault file."""
    pool = context.get("pools", {}).get(node.rsplit("-", 1)[0], {})
    faults_file = Path(context.get("faults_dir", "/nonexistent")) / f"{node}.json"
    faults = json.loads(faults_file.read_text()) if faults_file.is_file() else {}
    return {**context, **pool, "faults": faults}


def first_failure(context):
    """(check, reason) of the first check that fails, or None."""
    checks = load_checks()
    for name in CHECKS:
        try:
            result = checks[name](context)
        except Exception as exc:  # a crashed check says nothing about the GPU: leave the node be
            print(f"tcc_gpu_check: {name} crashed: {exc}", file=sys.stderr)
            continue
        if result.status == FAIL:
            return name, result.reason
    return None


def drain_reason(check, reason):
    text = " ".join(f"tcc {check}: {reason}".split())  # one line
    return text.replace('"', "'")[:250]


def main(context_path):
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    context = context_for(node, json.loads(Path(context_path).read_text()))
    failure = first_failure(context)
    if failure is None:
        return
    reason = drain_reason(*failure)
    print(f"tcc_gpu_check: draining {node}: {reason}")
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], check=False, timeout=60
    )


if __name__ == "__main__":
    main(sys.argv[1])
