"""`nvidia-smi -L`: the GPU count and model match the partition's spec."""

from .. import FAIL, PASS, SKIPPED, Result, check
from .gpu import run

MODELS = {"NVIDIA_H100_MEGA_80GB": "H100", "NVIDIA_H200_141GB": "H200", "NVIDIA_B200": "B200"}


@check("gpu_inventory")
def gpu_inventory(context):
    output = run(["nvidia-smi", "-L"], context)
    if output is None:
        return Result(SKIPPED, reason="no GPU (nvidia-smi not found)")
    gpus = [line for line in output.stdout.splitlines() if line.startswith("GPU ")]
    expected, model = context.get("gpus_per_node", 0), MODELS.get(context.get("accelerator_type", ""), "")
    wrong = [g for g in gpus if model and model not in g]
    values = {"count": len(gpus), "models": sorted({g.split(":")[1].split("(")[0].strip() for g in gpus})}
    threshold = {"count": expected, "model": model}
    if len(gpus) != expected or wrong:
        # nvidia-smi exits non-zero when it cannot reach the driver or a GPU (fallen off the bus).
        failed = f" (nvidia-smi {output.problem()})" if output.code else ""
        reason = f"found {len(gpus)} GPUs, expected {expected} x {model or 'any'}{failed}"
        return Result(FAIL, values, threshold, reason)
    return Result(PASS, values, threshold)
