"""`nvidia-smi -q -d ECC,ROW_REMAPPER`, read per GPU.

What fails, after NVIDIA's memory error management guide for A100/H100
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html): an uncorrectable error since the
last reset (every SRAM and DRAM "Uncorrectable" counter of the Volatile section: H100 drivers split
SRAM into "Parity" and "SEC-DED"), a row remap pending (it needs a GPU reset to take effect), a remap
that failed, or the SRAM threshold exceeded (the RMA criteria). Uncorrectable errors in the Aggregate
section alone are history the remapper has dealt with: a warning. Many correctable errors warn.

A failed remap and SRAM errors over the threshold are the guide's RMA criteria: no reset or reboot
fixes them, so the result says to start the repair at "replace" instead of rebooting first.
"""

from .. import FAIL, PASS, SKIPPED, WARN, Result, check, thresholds
from .gpu import number, query_sections, run

YES = "Yes"


def counters(section, kind):
    """Sum of the section's counters named `kind` (Correctable / Uncorrectable ...)."""
    return sum(number(v) for k, v in section.items() if isinstance(v, str) and k.split()[1:2] == [kind])


def gpu_values(gpu):
    errors, remapped = gpu.get("ECC Errors", {}), gpu.get("Remapped Rows", {})
    volatile, aggregate = errors.get("Volatile", {}), errors.get("Aggregate", {})
    return {
        "volatile_uncorrectable": counters(volatile, "Uncorrectable"),
        "volatile_correctable": counters(volatile, "Correctable"),
        "aggregate_uncorrectable": counters(aggregate, "Uncorrectable"),
        "sram_threshold_exceeded": aggregate.get("SRAM Threshold Exceeded") == YES,
        "remapped_uncorrectable": number(remapped.get("Uncorrectable Error")),
        "remap_pending": remapped.get("Pending") == YES,
        "remap_failed": remapped.get("Remapping Failure Occurred") == YES,
        "page_retirement_pending": gpu.get("Retired Pages", {}).get("Pending Page Blacklist") == YES,
    }


def needs_replacing(values):
    """Whether the GPU meets NVIDIA's RMA criteria (a reset cannot help)."""
    return values["remap_failed"] or values["sram_threshold_exceeded"]


def verdict(values, limits):
    """(status, reason) for one GPU's values."""
    if values["remap_failed"]:
        return FAIL, "a row remap failed (NVIDIA's RMA criteria)"
    if values["sram_threshold_exceeded"]:
        return FAIL, "SRAM uncorrectable errors over the threshold (NVIDIA's RMA criteria)"
    if values["volatile_uncorrectable"]:
        return FAIL, f"{values['volatile_uncorrectable']} uncorrectable ECC errors since the last reset"
    if values["remap_pending"] or values["page_retirement_pending"]:
        return FAIL, "a row remap is pending: the GPU needs a reset"
    if values["volatile_correctable"] > limits["max_correctable_volatile"]:
        return WARN, f"{values['volatile_correctable']} correctable ECC errors since the last reset"
    if values["aggregate_uncorrectable"]:
        return WARN, f"{values['aggregate_uncorrectable']} uncorrectable ECC errors in the GPU's lifetime"
    return PASS, ""


def read(text, limits):
    """A Result from the tool's output."""
    gpus = query_sections(text)
    if not gpus:
        return Result(FAIL, {}, limits, "nvidia-smi listed no GPU")
    values, findings = {}, {FAIL: [], WARN: []}
    for bus_id, gpu in gpus.items():
        values[bus_id] = gpu_values(gpu)
        status, reason = verdict(values[bus_id], limits)
        if reason:
            findings[status].append(f"GPU {bus_id}: {reason}")
    worst = FAIL if findings[FAIL] else WARN if findings[WARN] else PASS
    repair = "replace" if any(needs_replacing(v) for v in values.values()) else ""
    return Result(worst, values, limits, "; ".join(findings[FAIL] or findings[WARN]), repair)


@check("ecc")
def ecc(context):
    output = run(["nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER"], context)
    if output is None:
        return Result(SKIPPED, reason="no GPU (nvidia-smi not found)")
    limits = thresholds(context)["ecc"]
    if output.code != 0:
        return Result(FAIL, {}, limits, f"nvidia-smi failed ({output.problem()})")
    return read(output.stdout, limits)
