"""Correctness and speed measured on every GPU of the node with torch (CUDA), when it has GPUs.

Correctness: the same seeded fp32 (TF32 off) and bf16 matmul chains on every GPU, from the same inputs
made on the host. cuBLAS gives bit-identical results on GPUs of the same architecture and SM count
(cuBLAS documentation, "Results reproducibility": https://docs.nvidia.com/cuda/cublas/#results-reproducibility),
so a GPU whose checksum differs from the node's others is computing wrong (silent data corruption);
the console compares the nodes' checksums the same way. Speed (speed.py times the matmuls): each
GPU's pinned host-to-device bandwidth, against the accelerator's figures
(clusters/data/accelerators.json, passed in the scan's context).

The functions take device names, so the tests run them on "cpu" devices; the checks pass CUDA ones.
torch is imported inside them (start-up cost), as in interconnect.py.
"""

import hashlib
import time
from collections import Counter


def devices(context):
    """The node's CUDA devices when its pool has GPUs and torch sees them; else []."""
    if not context.get("gpus_per_node"):
        return []
    try:
        import torch
    except ImportError:
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def synchronize(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def checksums(names, size, rounds, seed, perturb=None):
    """{device: sha256 of its results}; `perturb` names a device whose result is nudged (fault injection)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32: the check compares exact results
    generator = torch.Generator().manual_seed(seed)
    a0 = torch.randn(size, size, generator=generator)
    b0 = torch.randn(size, size, generator=generator) / size
    found = {}
    with torch.no_grad():
        for name in names:
            digest = hashlib.sha256()
            for dtype in (torch.float32, torch.bfloat16):
                a, b = a0.to(name, dtype), b0.to(name, dtype)
                for _ in range(rounds):
                    a = torch.tanh(a @ b)
                if name == perturb:
                    a[0, 0] += 1e-2  # a silent data corruption
                digest.update(a.float().cpu().numpy().tobytes())
            found[name] = digest.hexdigest()
    return found


def judge_checksums(found):
    """(majority checksum or None, [devices that differ from it])."""
    counts = Counter(found.values())
    value, votes = counts.most_common(1)[0]
    if len(counts) > 1 and votes <= len(found) / 2:
        return None, sorted(found)  # no majority: every GPU is suspect
    return value, sorted(d for d, v in found.items() if v != value)


def host_to_device_gbps(name, megabytes=256, repeats=5):
    """Pinned host memory to the device, GB/s (the best of `repeats` copies)."""
    import torch

    cuda = str(name).startswith("cuda")
    host = torch.empty(megabytes * 2**20, dtype=torch.uint8, pin_memory=cuda)
    target = torch.empty_like(host, device=name)
    best = 0.0
    for _ in range(repeats):
        synchronize(name)
        started = time.perf_counter()
        target.copy_(host, non_blocking=cuda)
        synchronize(name)
        best = max(best, host.numel() / (time.perf_counter() - started) / 1e9)
    return best


def local_all_reduce_busbw(count, *, backend="nccl", megabytes=256, iterations=20, timeout=300):
    """All-reduce across `count` processes of this node, one per GPU (NCCL; "gloo" runs them on the
    CPU, for tests), rendezvous through a file: bus bandwidth in GB/s (nccl-tests' definition). Plain
    child processes (`python -m clusters.health.checks.on_gpu`), not multiprocessing's, whose helper
    process would outlive the check."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable, "-m", "clusters.health.checks.on_gpu", str(count), f"file://{folder}/store", backend]
        argv += [str(megabytes), str(iterations)]
        ranks = [subprocess.Popen([*argv, str(rank)], stdout=subprocess.PIPE, text=True) for rank in range(count)]
        try:
            outputs = [rank.communicate(timeout=timeout)[0] for rank in ranks]
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
                    rank.wait()
        failed = [rank.returncode for rank in ranks if rank.returncode != 0]
        if failed:
            raise RuntimeError(f"the all-reduce's processes exited with {failed}")
        return float(outputs[0].strip().splitlines()[-1])


def all_reduce_rank(world, store, backend, megabytes, iterations, rank):
    """One rank of local_all_reduce_busbw; rank 0 prints the bus bandwidth."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        buffer = torch.ones(megabytes * 2**20 // 4, device=device)
        for _ in range(3):  # warm-up: NCCL sets up its rings and channels
            dist.all_reduce(buffer)
        synchronize(device)
        started = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(buffer)
        synchronize(device)
        seconds = (time.perf_counter() - started) / iterations
        if rank == 0:
            print(buffer.numel() * 4 / seconds / 1e9 * 2 * (world - 1) / world, flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    from ...rendezvous import leave

    world, store, backend, megabytes, iterations, rank = sys.argv[1:7]
    all_reduce_rank(int(world), store, backend, int(megabytes), int(iterations), int(rank))
    leave()  # no teardown of gloo's or NCCL's state, which now and then aborts a rank
