"""An all-reduce across every GPU of the node over NCCL (NVLink / NVSwitch on the GPU machine types):
its bus bandwidth against the accelerator's NVLink rate (clusters/data/accelerators.json). Under
`min_fraction` of it the node's GPUs talk over PCIe or a link is down: a failure. The interconnect
check measures the paths between nodes; this one, the fabric inside a node. Skipped without 2 GPUs.
"""

from .. import FAIL, PASS, SKIPPED, Result, check, thresholds
from . import on_gpu


@check("nvlink")
def nvlink(context):
    gpus = on_gpu.devices(context)
    if len(gpus) < 2:
        return Result(SKIPPED, reason="fewer than 2 GPUs on this node: no NVLink to measure")
    limits = thresholds(context)["nvlink"]
    busbw = on_gpu.local_all_reduce_busbw(len(gpus), megabytes=limits["megabytes"], iterations=limits["iterations"])
    return judge(busbw, len(gpus), limits, context.get("accelerator"))


def judge(busbw, count, limits, accelerator):
    values = {"gpus": count, "busbw_gbps": round(busbw, 1)}
    rate = (accelerator or {}).get("nvlink_gbps")
    if not rate:
        return Result(PASS, values, {}, "")
    floor = limits["min_fraction"] * rate
    threshold = {"nvlink_gbps": rate, "min_busbw_gbps": round(floor, 1)}
    if busbw < floor:
        reason = (
            f"all-reduce over {count} GPUs at {busbw:.0f} GB/s, under {floor:.0f} (GPUs over PCIe, or a link down?)"
        )
        return Result(FAIL, values, threshold, reason)
    return Result(PASS, values, threshold)
