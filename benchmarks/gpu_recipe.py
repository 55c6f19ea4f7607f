"""Llama 3.1 8B at full width on this machine's GPUs, trained as a node trains it: tokens/s per GPU, MFU
and peak memory on 1 GPU and on all of them (#26's speed figure).

The catalog's llama3.1-8b-pretrain full profile (recipes/runs/launch.offline_config: its architecture,
8192-token sequences in micro-batches of 2, selective activation checkpointing, the chunked loss, each
decoder layer compiled with inductor, FSDP2 over the GPUs with tensor 1 as the catalog lays the 8B out)
in bf16 under torchrun, one rank per GPU, NCCL; one micro-batch per rank per step (no accumulation,
as torchtitan measures), no checkpoint and no export. Per run: tokens/s per GPU in steady state (the
steps after the warm-up, which compiles), MFU against the GPU's dense bf16 peak
(clusters/data/accelerators.json) by train.py's own FLOPs per token, and the peak memory.

The whole model's fp32 weights, gradients and AdamW moments are about 128 GB: where they do not fit
(one 80 GB H100), the run keeps the 8B's width and as many of its 32 layers as recipes/runs/fit.py says
fit with a tenth to spare (8 on an H100, 19 on an H200, 26 on a B200), and says so. Each layer's work
per token is the 8B's; the embedding and output layers weigh more in a shorter model, and the FLOPs
count includes them.

Goal (#26): MFU >= 40% on H100/H200; torchtitan reports 33-39% for Llama 3 8B in bf16 on 8 H100s
without float8 (github.com/pytorch/torchtitan, docs/performance.md). Without a GPU it says it skipped;
--cpu runs the same path on two CPU ranks (gloo) with the tiny profile, to check the script itself.

Usage: .venv/bin/python benchmarks/gpu_recipe.py [--steps 12] [--warmup 4] [--cpu]
"""

import argparse
import json
import subprocess
import sys
import time

from _setup import ROOT, WORK, scratch_django

try:
    scratch_django()
except ImportError as missing:  # the catalog and the fit check are the console's: its virtualenv
    print(f"skipped: {missing.name} is missing (run it with the console's .venv)")
    sys.exit(0)

from clusters.health.checks.gpu_inventory import accelerator_type
from recipes.runs import fit
from recipes.runs.launch import offline_config

RECIPE = "llama3.1-8b-pretrain"


def layers_that_fit(config, ranks, accelerator):
    """The most decoder layers (up to the model's) whose training fits one GPU by the fit check, with a tenth
    of its memory to spare."""
    parallel = config["parallel"]
    for layers in range(config["model"]["layers"], 0, -1):
        shape = {**config["model"], "layers": layers, "loss_chunk": parallel.get("loss_chunk")}
        found = fit.estimate(shape, config["family"], tensor=1, data=ranks, micro_batch=config["micro_batch"],
                             seq_len=config["seq_len"], accelerator_type=accelerator,
                             checkpointing=parallel.get("activation_checkpointing") or "none")  # fmt: skip
        if found.total <= 0.9 * found.capacity:  # a tenth spare: the check is within a fifth of torch's count
            return layers, found
    return 0, None


def run(name, ranks, steps, warmup, accelerator, cpu):
    folder = WORK / name
    profile = "tiny" if cpu else "full"
    config, _ = offline_config(RECIPE, folder, profile_name=profile, steps=steps)
    whole = config["model"]["layers"]
    layers, estimate = (whole, None) if cpu else layers_that_fit(config, ranks, accelerator)
    if not layers:
        print(f"{name}: not even one layer of {RECIPE} fits {ranks} x {accelerator}")
        return
    config["model"]["layers"] = layers
    config["parallel"].update(tensor=1, global_batch=config["micro_batch"] * ranks)
    config.update(precision="fp32" if cpu else "bf16", checkpoint_every=steps + 1, final_checkpoint=False,
                  export_model=False, log_every=1, probe_every=0,
                  peak_tflops=None if cpu else fit.peak_tflops(accelerator, "bf16"))  # fmt: skip
    if cpu:
        config["parallel"]["compile"] = None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
               "-m", "recipes.node.train", str(folder / "config.json")]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    (folder / "run.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        print(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"{name}: exit {done.returncode} (log: {folder / 'run.log'})")
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    first, last = lines[warmup - 1], lines[-1]
    tokens = (last["step"] - first["step"]) * config["parallel"]["global_batch"] * config["seq_len"]
    per_gpu = tokens / (last["time"] - first["time"]) / ranks
    # train.py's MFU is over the run so far (warm-up included); in steady state it scales with tokens/s.
    mfu = last["mfu"] * per_gpu * ranks / last["tokens_per_s"] if last.get("mfu") else None
    peak = max(line["peak_memory_mb"] for line in lines) / 1024
    shape = f"{layers} of {whole} layers" if layers < whole else f"all {whole} layers"
    print(f"{name}: {ranks} x {accelerator or 'CPU rank'}, {shape}, {time.perf_counter() - started:.0f} s: "
          f"{per_gpu:,.0f} tokens/s per {'rank' if cpu else 'GPU'} in steps {first['step'] + 1}-{last['step']}, "
          + (f"MFU {mfu:.1%}, " if mfu else "")
          + f"peak {peak:.1f} GB" + (f" (fit check {estimate.total / fit.GB:.1f} GB)" if estimate else ""))  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of the figures (compiling)")
    parser.add_argument("--cpu", action="store_true", help="two CPU ranks and the tiny profile: checks the script")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps <= args.warmup:
        parser.error("--warmup must be at least 1 and under --steps")
    if args.cpu:
        run("cpu", 2, args.steps, args.warmup, "", cpu=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU here (--cpu checks the script on CPU ranks)")
        return 0
    gpus, name = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    accelerator = accelerator_type(name)
    if not accelerator:
        print(f"skipped: no bf16 peak known for {name} (clusters/data/accelerators.json)")
        return 0
    print(f"{gpus} x {name} ({accelerator}, {fit.peak_tflops(accelerator, 'bf16')} bf16 TFLOPS dense)")
    for ranks in sorted({1, gpus}):
        run(f"{ranks}-gpu", ranks, args.steps, args.warmup, accelerator, cpu=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
