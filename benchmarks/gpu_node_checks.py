"""The health checks on this machine's GPUs, as a scan's agent runs them on a node, with each check's
figures: GPU inventory, ECC and row remapping, Xids, DCGM (level 1 here: seconds), correctness on every
GPU, speed (bf16 TFLOPS and host-to-device GB/s per GPU, against the accelerator's figures), and the
nvlink check's all-reduce across every GPU of the node over NCCL (bus bandwidth, as nccl-tests defines it). No
Django, no Slurm: run it on a GPU machine (scripts/gpu-smoke.sh does) or here, where the GPU checks skip.

Usage: python benchmarks/gpu_node_checks.py [ACCELERATOR_TYPE]   (default: from the GPU's name)
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusters.health import load_checks  # noqa: E402
from clusters.health.checks.gpu_inventory import accelerator_type  # noqa: E402


def gpus():
    try:
        import torch
    except ImportError:
        return 0, ""
    if not torch.cuda.is_available():
        return 0, ""
    return torch.cuda.device_count(), torch.cuda.get_device_name(0)


def main():
    count, name = gpus()
    accelerator = sys.argv[1] if len(sys.argv) > 1 else accelerator_type(name)
    figures = json.loads((ROOT / "clusters/data/accelerators.json").read_text()).get(accelerator)
    context = {
        "backend": "smoke",
        "checks": [],
        "thresholds": {"dcgm": {"level": 1}},
        "paths": ["/tmp"],
        "gpus_per_node": count,
        "accelerator_type": accelerator,
        "accelerator": figures,
        "faults": {},
    }
    print(f"{count} GPU(s) {name or '(none)'}; accelerator {accelerator or '(unknown)'}: {figures}")
    checks = load_checks()
    for check in ("gpu_inventory", "ecc", "xid", "dcgm", "correctness", "speed", "nvlink", "disk"):
        started = time.perf_counter()
        result = checks[check](context)
        seconds = time.perf_counter() - started
        print(f"{check:14} {result.status:8} {seconds:6.1f} s  {result.reason}")
        print(f"{'':14} values: {json.dumps(result.values)[:600]}")


if __name__ == "__main__":
    main()
