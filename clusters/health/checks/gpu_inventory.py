"""`nvidia-smi -L`: the GPU count and model match the partition's spec."""

from .. import FAIL, PASS, SKIPPED, Result, check
from .gpu import run

# The partition's accelerator type -> what `nvidia-smi -L` names its GPUs with ("NVIDIA H100 80GB HBM3"
# on A3 High, Edge and Mega, "NVIDIA H200" on A3 Ultra, "NVIDIA B200" on A4: tests/fixtures/gpu/).
MODELS = {
    "NVIDIA_H100_MEGA_80GB": "H100",  # first of the two H100s (the same figures): what accelerator_type() names
    "NVIDIA_H100_80GB": "H100",
    "NVIDIA_H200_141GB": "H200",
    "NVIDIA_B200": "B200",
    "NVIDIA_GB200": "GB200",  # A4X: "GPU 0: NVIDIA GB200 (UUID: ...)" (tests/fixtures/gpu/README.md)
}


def accelerator_type(gpu_name):
    """The accelerator type whose model the GPU's name ("NVIDIA H200", torch's or nvidia-smi's) carries as a
    word ("GB200" is not a "B200"); "" for another GPU."""
    words = gpu_name.split()
    return next((kind for kind, model in MODELS.items() if model in words), "")


@check("gpu_inventory")
def gpu_inventory(context):
    output = run(["nvidia-smi", "-L"], context)
    if output is None:
        return Result(SKIPPED, reason="no GPU (nvidia-smi not found)")
    return judge(output, context.get("gpus_per_node", 0), context.get("accelerator_type", ""))


def judge(output, expected, accelerator_type):
    """The listing (a gpu.Output) against `expected` GPUs of the accelerator type's model."""
    gpus = [line for line in output.stdout.splitlines() if line.startswith("GPU ")]
    model = MODELS.get(accelerator_type, "")
    wrong = [g for g in gpus if model and model not in g]
    values = {"count": len(gpus), "models": sorted({g.split(":")[1].split("(")[0].strip() for g in gpus})}
    threshold = {"count": expected, "model": model}
    if len(gpus) != expected or wrong:
        # nvidia-smi exits non-zero when it cannot reach the driver or a GPU (fallen off the bus).
        failed = f" (nvidia-smi {output.problem()})" if output.code else ""
        reason = f"found {len(gpus)} GPUs, expected {expected} x {model or 'any'}{failed}"
        return Result(FAIL, values, threshold, reason)
    return Result(PASS, values, threshold)
