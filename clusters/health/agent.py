"""Runs the asked checks on this node (one Slurm task per node) and writes NODE.json atomically.

Usage (from the scan job): python -m clusters.health.agent CONTEXT.json OUT_DIR
No Django here: the node only needs numpy and, for GPU checks, nvidia-smi / dcgmi.
"""

import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from ..rendezvous import leave
from . import COLLECTIVE, FAIL, load_checks, node_faults, this_node


def main(context_path, out_dir):
    context = json.loads(Path(context_path).read_text())
    node = this_node()
    context["faults"] = node_faults(context, node)
    checks = load_checks()
    if COLLECTIVE & set(context["checks"]):
        # torch takes seconds to import: do it while the node's own checks run (a node has cores to
        # spare; the import lock makes the collective check's own import wait for this one).
        threading.Thread(target=importlib.import_module, args=("torch.distributed",), daemon=True).start()
    results = {}
    # Collective checks last, so every node reaches them after its own checks, near the same time.
    for name in sorted(context["checks"], key=lambda c: c in COLLECTIVE):
        started = time.perf_counter()
        try:
            result = checks[name](context).as_dict()
        except Exception as exc:  # a check that crashes is a failed check, not a failed scan
            result = {"status": FAIL, "values": {}, "threshold": {}, "reason": f"check crashed: {exc}"}
        result["seconds"] = round(time.perf_counter() - started, 3)
        results[name] = result
    out = Path(out_dir)
    tmp = out / f".{node}.json.tmp"
    tmp.write_text(json.dumps({"node": node, "results": results}))
    os.replace(tmp, out / f"{node}.json")  # never a half-written result


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    if "torch.distributed" in sys.modules:
        # The result is written. The interpreter's teardown of gloo's state after a collective check
        # sometimes aborts (SIGABRT; clusters/rendezvous.py leave()): skip it.
        leave()
