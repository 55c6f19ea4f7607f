"""A deterministic float64 matmul chain: every node must get the reference checksum (and each other's)."""

import hashlib

import numpy as np

from .. import FAIL, PASS, Result, check, thresholds


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
    got = checksum(limits["size"], limits["rounds"], limits["seed"], perturb=context.get("faults", {}).get("perturb"))
    reference = context.get("reference_checksum") or checksum(limits["size"], limits["rounds"], limits["seed"])
    values = {"checksum": got}
    if got != reference:
        return Result(FAIL, values, {"reference": reference}, "result differs from the reference computation")
    return Result(PASS, values, {"reference": reference})
