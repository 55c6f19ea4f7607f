"""recipes/runs/fit.py's memory estimate against the peak torch accounts for one training step, for every
catalog profile train.py runs (pretraining, continued pretraining, SFT), at full depth on the catalog's
layout. recipes/node/memory.py traces the step on fake tensors over a fake process group (nothing is
allocated: a 405B on 128 ranks runs on this CPU), under FSDPMemTracker; the estimate is compared without
its CUDA context and fragmentation allowance, which the trace does not see.

Usage: .venv/bin/python benchmarks/fit_memory.py [--layers N] [recipe ...]
"""

import argparse
import tempfile
import time
from pathlib import Path

from _setup import scratch_django

GB = 1e9  # as recipes/runs/fit.py counts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, help="trace this many decoder layers instead of the model's")
    parser.add_argument("recipes", nargs="*")
    args = parser.parse_args()
    scratch_django()
    from recipes.catalog import get_recipe, recipes
    from recipes.node import memory
    from recipes.runs import fit, launch

    chosen = args.recipes or sorted(r for r, recipe in recipes().items() if recipe["kind"] != "rl")
    print("Peak GB per GPU of one traced training step (forward, backward) and the fit check's estimate without")
    print("its CUDA context and fragmentation allowance.")
    print(f"{'profile':24} {'layout':>12} {'checkpoint':>10} {'forward':>8} {'backward':>9} {'fit':>7} {'fit/peak':>9} "
          f"{'seconds':>8}")  # fmt: skip
    for recipe_id in chosen:
        recipe = get_recipe(recipe_id)
        profile = dict(recipe["profiles"]["full"])
        if args.layers:
            profile["layers"] = args.layers
        tensor = profile.get("tensor", 1)
        folder = Path(tempfile.mkdtemp(prefix="tcc-fit-"))
        config, world = launch.offline_config(recipe_id, folder, profile=profile)
        started = time.perf_counter()
        traced = memory.trace(config, world)
        seconds = time.perf_counter() - started
        estimate = fit.estimate(
            profile, recipe["family"], tensor=tensor, data=world // tensor, micro_batch=profile["micro_batch"],
            seq_len=profile["seq_len"], checkpointing=config["parallel"]["activation_checkpointing"],
        )  # fmt: skip
        expected = estimate.total - estimate.parts["context and fragmentation"]
        peak = max(traced["forward"], traced["backward"])
        layout = f"tp{tensor} x dp{world // tensor}"
        mode = "selective" if config["parallel"]["activation_checkpointing"] == "selective" else "layers"
        print(
            f"{recipe_id:24} {layout:>12} {mode:>10} {traced['forward'] / GB:8.1f} {traced['backward'] / GB:9.1f} "
            f"{expected / GB:7.1f} {expected / peak - 1:+9.0%} {seconds:8.1f}"
        )


if __name__ == "__main__":
    main()
