"""`nvidia-smi -q -d ECC,ROW_REMAPPER`: uncorrectable errors or pending remaps fail; many correctable warn."""

import re

from .. import FAIL, PASS, SKIPPED, WARN, Result, check, thresholds
from .gpu import run


def counts(text, section, kind):
    """Sum of the `kind` counts (Correctable/Uncorrectable) under `section` (Volatile/Aggregate) per GPU."""
    total = 0
    for block in re.split(rf"\n\s+{section}\s*\n", text)[1:]:
        for line in block.splitlines()[:12]:
            match = re.match(rf"\s*(?:DRAM |SRAM )?{kind}\s*:\s*(\d+)", line)
            if match:
                total += int(match[1])
    return total


@check("ecc")
def ecc(context):
    text = run(["nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER"])
    if text is None:
        return Result(SKIPPED, reason="no GPU (nvidia-smi not found)")
    limits = thresholds(context)["ecc"]
    values = {
        "volatile_uncorrectable": counts(text, "Volatile", "Uncorrectable"),
        "aggregate_uncorrectable": counts(text, "Aggregate", "Uncorrectable"),
        "volatile_correctable": counts(text, "Volatile", "Correctable"),
        "pending_remap": len(re.findall(r"Pending\s*:\s*Yes", text)),
    }
    if values["volatile_uncorrectable"] or values["aggregate_uncorrectable"] or values["pending_remap"]:
        return Result(FAIL, values, limits, "uncorrectable ECC errors or pending row remaps")
    if values["volatile_correctable"] > limits["max_correctable_volatile"]:
        return Result(WARN, values, limits, "many correctable ECC errors")
    return Result(PASS, values, limits)
