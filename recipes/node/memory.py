"""The peak memory of one rank's training step, traced on the CPU without allocating it.

`trace(config, world)` builds the run's model as train.py builds a sharded run (on the meta device,
tensor parallelism and FSDP2 on the recipe's mesh, the chunked loss), then runs two training steps of
one micro-batch on fake tensors (torch's FakeTensorMode: shapes and dtypes, no storage) over a fake
process group of `world` ranks (collectives do nothing), under torch.distributed._tools'
FSDPMemTracker, which accounts every tensor this rank would hold. It returns the peaks of the forward
and backward passes of the second step (the first has no optimizer states yet): what one GPU needs
before the CUDA context and the allocator's fragmentation. A 405B on 128 ranks traces in minutes on a
laptop; recipes/runs/fit.py's arithmetic is checked against it (tests/test_full_profiles.py,
benchmarks/fit_memory.py).

The trace runs on the "cpu" device: torch's CPU SDPA, like the fused kernels on a GPU, keeps no s^2
scores; the optimizer step is left out of the peaks, as the fused AdamW train.py uses on GPUs holds
nothing but the states the estimate counts.
"""

import contextlib
import types

from . import distributed, train


def trace(config, world):
    """Peak bytes of one rank, {"forward": n, "backward": n, "by_kind": {kind: n}} at the larger peak, for
    the run `config` (train.py's config, parallel.tensor from it) on `world` ranks."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState
    from torch.testing._internal.distributed.fake_pg import FakeStore

    parallel = config.get("parallel") or {}
    if dist.is_initialized():
        raise RuntimeError("trace() makes its own (fake) process group; this process already has one")
    try:
        layout = distributed.init(0, world, 0, parallel.get("tensor", 1), "cpu", backend="fake", store=FakeStore())
        model = train.build_model(config, device="meta")
        model = distributed.parallelize(
            model, layout, mixed_precision=True, activation_checkpointing=parallel.get("activation_checkpointing", True)
        )
        chunk = parallel.get("loss_chunk")
        if chunk:
            model.forward = types.MethodType(train.chunked_loss(chunk), model)
        vocabulary = model.config.vocab_size
        # The meta parameters become fake ones inside the mode (allow_non_fake_inputs: the meta tensors
        # and the mesh's own tensors were made before it).
        with FakeTensorMode(allow_non_fake_inputs=True):
            distributed.materialise(model, "cpu", fill=False)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
            shape = (config["micro_batch"], config["seq_len"])
            x, y = torch.randint(0, vocabulary, shape), torch.randint(0, vocabulary, shape)
            tracker = FSDPMemTracker(mod=model, optm=optimizer)
            tracker.track_inputs((x, y))
            with tracker:
                for step in range(2):
                    with train.loss_context(layout):
                        train.summed_loss(model, x, y, chunked=bool(chunk)).backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if step == 0:
                        tracker.reset_mod_stats()
        snapshots = tracker.memory_tracking[model].snapshots
        peaks = {}
        for name, state in (("forward", _FSDPModState.PEAK_FW), ("backward", _FSDPModState.PEAK_BW)):
            [by_device] = snapshots[state][-1:]
            peaks[name] = {str(kind).rsplit(".", 1)[-1]: n for kind, n in by_device[torch.device("cpu")].items()}
        top = max(peaks.values(), key=lambda kinds: kinds["Total"])
        return {
            "forward": peaks["forward"]["Total"],
            "backward": peaks["backward"]["Total"],
            "by_kind": {kind: n for kind, n in top.items() if n and kind != "Total"},
        }
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def main(argv=None):
    """python -m recipes.node.memory CONFIG.json --ranks N: the traced peak of a run's config (the one a
    launch writes into the run's folder) on N ranks, before a GPU is spent on it."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("config")
    parser.add_argument("--ranks", type=int, required=True)
    args = parser.parse_args(argv)
    with open(args.config) as handle:
        traced = trace(json.load(handle), args.ranks)
    gb = 1e9
    print(f"forward {traced['forward'] / gb:.1f} GB, backward {traced['backward'] / gb:.1f} GB per rank, before the")
    print("CUDA context and fragmentation; at the peak: " + ", ".join(
        f"{kind.lower()} {n / gb:.1f}" for kind, n in sorted(traced["by_kind"].items(), key=lambda kv: -kv[1])
        if n >= 0.05 * gb
    ))  # fmt: skip


if __name__ == "__main__":
    main()
