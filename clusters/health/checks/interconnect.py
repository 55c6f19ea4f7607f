"""Collective bandwidth between the nodes of a scan job: all-reduce over every node, then pairwise.

Every node's agent joins one torch.distributed group (NCCL on GPU nodes, gloo on CPU nodes, the way
the recipes train), measures an all-reduce's bus bandwidth (nccl-tests' definition: algorithm
bandwidth x 2(n-1)/n), then ping-pongs a buffer with every other node in rounds of disjoint pairs
(the circle method: n-1 rounds, all pairs of a round at once). Above `pairwise_max_nodes` each node
only pairs with its ring neighbours, so a scan stays a few rounds long. The console compares the
pairs (scans.evaluate_links): a node slow to every peer has a bad link; one slow pair, a bad path.

On GPU nodes each node's rank uses its first GPU, so this is one GPU's path per node; a full
8-GPU-per-node NCCL run is nccl-tests' job.
"""

import os
import time
from datetime import timedelta

from ...rendezvous import dist_env
from .. import PASS, SKIPPED, Result, check, thresholds

# torch and the libraries on top of it are imported inside the functions that use them (start-up cost:
# torch alone takes about 1.4 s), so `--help`, the health agent and the console's imports stay fast.


def rounds(world, pairwise_max_nodes):
    """Lists of disjoint (a, b) rank pairs; together every pair once (or ring neighbours only)."""
    if world > pairwise_max_nodes:
        # Ring neighbours (i, i+1): even i in one round, odd i in another; with an odd count the
        # wrap-around pair (n-1, 0) would meet pair (0, 1), so it gets a third round.
        last = world - 1 if world % 2 else None
        by_round = [[i for i in range(world) if i % 2 == parity and i != last] for parity in (0, 1)] + [[last]]
        return [[tuple(sorted((i, (i + 1) % world))) for i in r] for r in by_round if r and r != [None]]
    slots = list(range(world)) + ([None] if world % 2 else [])
    n = len(slots)
    found = []
    for _ in range(n - 1):
        pairs = [(slots[i], slots[n - 1 - i]) for i in range(n // 2)]
        found.append([tuple(sorted(p)) for p in pairs if None not in p])
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return found


@check("interconnect")
def interconnect(context):
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    if world < 2:
        return Result(SKIPPED, reason="one node in this partition: no link to measure")
    import torch
    import torch.distributed as dist

    limits = thresholds(context)["interconnect"]
    rank, world, _ = dist_env()
    gpu = context.get("gpus_per_node", 0) > 0 and torch.cuda.is_available()
    device = torch.device("cuda:0" if gpu else "cpu")
    backend = "nccl" if gpu else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=limits["timeout_seconds"]))
    delay = float(context.get("faults", {}).get("slow_link", 0)) * 0.05  # fault injection: a slow NIC
    try:
        names = [None] * world
        dist.all_gather_object(names, os.environ.get("SLURMD_NODENAME", str(rank)))
        size = int(limits["megabytes"] * 2**20)
        buffer = torch.ones(size // 4, dtype=torch.float32, device=device)
        iterations = limits["iterations"]

        def timed(fn):
            """The fastest of `iterations` runs: what the link can do, not a neighbour's burst of load
            (a slow link is slow every time)."""
            fn()  # warm-up: connections are made on first use
            best = float("inf")
            for _ in range(iterations):
                if gpu:
                    torch.cuda.synchronize()
                started = time.perf_counter()
                fn()
                if gpu:
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - started)
            return best

        def all_reduce():
            if delay:
                time.sleep(delay)
            dist.all_reduce(buffer)

        seconds = timed(all_reduce)
        busbw = size / seconds * 2 * (world - 1) / world / 1e9
        pairs = {}
        for pairs_now in rounds(world, limits["pairwise_max_nodes"]):
            dist.barrier()
            mine = next((p for p in pairs_now if rank in p), None)
            if mine is None:
                continue
            peer = mine[1] if mine[0] == rank else mine[0]
            first = rank == mine[0]

            def ping_pong(peer=peer, first=first):
                for sending in (first, not first):
                    if sending:
                        if delay:
                            time.sleep(delay)
                        dist.send(buffer, peer)
                    else:
                        dist.recv(buffer, peer)

            pairs[names[peer]] = round(2 * size / timed(ping_pong) / 1e9, 3)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    values = {"backend": backend, "nodes": world, "busbw_gbps": round(busbw, 3), "pairs": pairs}
    # pass here; the console compares the pairs of every node once all have reported.
    return Result(PASS, values, {"slow_link_fraction": limits["slow_link_fraction"]})
