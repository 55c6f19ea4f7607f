"""A deterministic matmul chain: every node must get the reference checksum (and each other's).

On CPU nodes a float64 chain with numpy against the console's reference; on GPU nodes fp32 and bf16
chains on every GPU with torch (on_gpu.py): a GPU that differs from the node's others fails, and the
console compares the nodes' checksums with each other.
"""

import hashlib

import numpy as np

from .. import FAIL, PASS, Result, check, thresholds
from . import on_gpu


def checksum(size, rounds, seed, perturb=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((size, size))
    b = rng.standard_normal((size, size)) / size
    for _ in range(rounds):
        a = np.tanh(a @ b)
    if perturb:
        a[0, 0] += 1e-9  # fault injection: a silent data corruption
    return hashlib.sha256(np.round(a, 9).tobytes()).hexdigest()


@check("correctness")
def correctness(context):
    limits = thresholds(context)["correctness"]
    perturb = context.get("faults", {}).get("perturb")
    gpus = on_gpu.devices(context)
    if gpus:
        return on_gpus(gpus, limits, perturb=perturb)
    got = checksum(limits["size"], limits["rounds"], limits["seed"], perturb=perturb)
    reference = context.get("reference_checksum") or checksum(limits["size"], limits["rounds"], limits["seed"])
    values = {"checksum": got}
    if got != reference:
        return Result(FAIL, values, {"reference": reference}, "result differs from the reference computation")
    return Result(PASS, values, {"reference": reference})


def on_gpus(names, limits, perturb=False):
    found = on_gpu.checksums(
        names, limits["gpu_size"], limits["rounds"], limits["seed"], names[-1] if perturb else None
    )
    value, differing = on_gpu.judge_checksums(found)
    values = {"checksum": value or "", "gpus": found}
    threshold = {"size": limits["gpu_size"], "rounds": limits["rounds"]}
    if value is None:
        return Result(FAIL, values, threshold, f"the node's {len(names)} GPUs disagree: no result has a majority")
    if differing:
        others = len(names) - len(differing)
        verb = "differs" if len(differing) == 1 else "differ"
        return Result(FAIL, values, threshold, f"{', '.join(differing)} {verb} from the other {others} GPUs")
    return Result(PASS, values, threshold)
