"""The same kernel's throughput; the console compares each node with the scan's fleet median.

On GPU nodes (on_gpu.py) each GPU's bf16 matmul TFLOPS and pinned host-to-device bandwidth are
measured: a GPU under `min_peak_fraction` of its accelerator's dense peak, or whose host link is
under `min_host_link_fraction` of the link's rate (a PCIe link trained down), or a GPU under
`straggler_fail_fraction` of the node's median GPU fails; the node's figure for the fleet comparison
is its slowest GPU.
"""

import statistics
import time

import numpy as np

from .. import FAIL, PASS, Result, check, thresholds
from . import on_gpu


@check("speed")
def speed(context):
    limits = thresholds(context)["speed"]
    gpus = on_gpu.devices(context)
    if gpus:
        return on_gpus(gpus, limits, context.get("accelerator"), context.get("faults", {}).get("slow", 0))
    size = limits["size"]
    a = np.random.default_rng(1).standard_normal((size, size))
    slow = context.get("faults", {}).get("slow", 0)
    gflops = best_rate(lambda: a @ a, 2 * size**3, limits["seconds"], slow) / 1e9
    # pass here; the fleet comparison (straggler) is made by the console once every node reported.
    return Result(PASS, {"gflops": round(gflops, 3)}, {"straggler_fraction": limits["straggler_fraction"]})


def best_rate(step, flops, seconds, slow=0, settle=lambda: None):
    """FLOP/s of `step` (`flops` each) over about `seconds`: the best of three windows, so a node's (or
    GPU's) speed, not a neighbour's burst of load. `settle` waits for queued work (a GPU's stream);
    `slow` injects a throttle."""
    best = 0.0
    for _ in range(3):
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 3:
            step()
            done += 1
            if slow:
                time.sleep(slow * 0.01)  # fault injection: a throttled node or GPU
            if done % 8 == 0:
                settle()  # a GPU queues work: keep the window honest
        settle()
        best = max(best, flops * done / (time.perf_counter() - started))
    return best


def gpu_tflops(name, size, seconds, slow=0):
    """Achieved bf16 matmul TFLOPS on one device."""
    import torch

    a = torch.randn(size, size, device=name, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=name, dtype=torch.bfloat16)
    a @ b  # warm-up: cuBLAS picks its kernel
    on_gpu.synchronize(name)
    return best_rate(lambda: a @ b, 2 * size**3, seconds, slow, lambda: on_gpu.synchronize(name)) / 1e12


def on_gpus(names, limits, accelerator=None, slow=0):
    tflops = {n: gpu_tflops(n, limits["gpu_size"], limits["gpu_seconds"], slow if n == names[-1] else 0) for n in names}
    links = {n: on_gpu.host_to_device_gbps(n) for n in names}
    values = {
        "gflops": round(min(tflops.values()) * 1000, 3),  # the node's slowest GPU, for the fleet comparison
        "tflops": {n: round(t, 2) for n, t in tflops.items()},
        "host_to_device_gbps": {n: round(g, 2) for n, g in links.items()},
    }
    threshold = {k: limits[k] for k in ("min_peak_fraction", "min_host_link_fraction", "straggler_fail_fraction")}
    problems = []
    median = statistics.median(tflops.values())
    for name, value in tflops.items():
        if value < limits["straggler_fail_fraction"] * median:
            problems.append(f"{name} reaches {value:.0f} TFLOPS, {value / median:.0%} of the node's median GPU")
    if accelerator:
        threshold.update(peak_tflops=accelerator["bf16_tflops"], host_link_gbps=accelerator["host_to_device_gbps"])
        floor, share = limits["min_peak_fraction"] * accelerator["bf16_tflops"], limits["min_peak_fraction"]
        peak = f"{accelerator['name']}'s {accelerator['bf16_tflops']}"
        for name, value in tflops.items():
            if value < floor:
                problems.append(f"{name} reaches {value:.0f} bf16 TFLOPS, under {share:.0%} of the {peak}")
        link_floor = limits["min_host_link_fraction"] * accelerator["host_to_device_gbps"]
        for name, value in links.items():
            if value < link_floor:
                problems.append(
                    f"{name} copies from the host at {value:.1f} GB/s, under {link_floor:.0f} (PCIe trained down?)"
                )
    return Result(FAIL if problems else PASS, values, threshold, "; ".join(dict.fromkeys(problems)))
