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
    # The best of three windows: a node's speed, not a neighbour's burst of load.
    best = 0.0
    for _ in range(3):
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < limits["seconds"] / 3:
            a @ a
            done += 1
            if slow:
                time.sleep(slow * 0.01)  # fault injection: a throttled node
        best = max(best, 2 * size**3 * done / (time.perf_counter() - started) / 1e9)
    gflops = best
    # pass here; the fleet comparison (straggler) is made by the console once every node reported.
    return Result(PASS, {"gflops": round(gflops, 3)}, {"straggler_fraction": limits["straggler_fraction"]})


def on_gpus(names, limits, accelerator=None, slow=0):
    tflops = {
        n: on_gpu.matmul_tflops(n, limits["gpu_size"], limits["gpu_seconds"], slow if n == names[-1] else 0)
        for n in names
    }
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
