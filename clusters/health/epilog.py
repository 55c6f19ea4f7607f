"""The console's fast GPU checks after a job: Slurm's Epilog calls `tcc_gpu_check` (clusters/slurm/hooks.py),
which runs this on the node as root with the context a health scan wrote (GPU_CHECK's .json).

GPU inventory, ECC and Xids take a second or two, so they can run after every job; the worst failure
by the repair policy (policy.json) drains the node with the policy's reason prefix ("tcc CHECK: why"),
which the console's watcher repairs like any other drained node (clusters/health/repair.py). A
healthy node is left as it is. This never fails the epilog: Slurm would drain the node with a reason
that says nothing.

Usage: python -m clusters.health.epilog CONTEXT.json
"""

import json
import subprocess
import sys
from pathlib import Path

from . import FAIL, load_checks, node_faults, this_node
from .policy import REASON_PREFIX, worst

CHECKS = ("ecc", "xid", "gpu_inventory")


def context_for(node, context):
    """The scan's context with this node's pool's GPU figures and fault file."""
    pool = context.get("pools", {}).get(node.rsplit("-", 1)[0], {})
    return {**context, **pool, "faults": node_faults(context, node)}


def first_failure(context):
    """(check, reason) of the worst check that fails (the repair policy's priority), or None."""
    checks, failed = load_checks(), {}
    for name in CHECKS:
        try:
            result = checks[name](context)
        except Exception as exc:  # a crashed check says nothing about the GPU: leave the node be
            print(f"tcc_gpu_check: {name} crashed: {exc}", file=sys.stderr)
            continue
        if result.status == FAIL:
            failed[name] = result.reason
    if not failed:
        return None
    name = worst(failed)
    return name, failed[name]


def drain_reason(check, reason):
    text = " ".join(f"{REASON_PREFIX}{check}: {reason}".split())  # one line
    return text.replace('"', "'")[:250]


def main(context_path):
    node = this_node()
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
