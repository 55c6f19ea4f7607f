"""Tokens/s of the tiny Llama profile under each layout recipes/node/train.py offers, at 4 ranks on this
machine (gloo, CPU), against one rank; and DCP checkpoint save and load (resume) time per layout.

Layouts: 1 rank; 4 ranks DDP (every rank the whole model; the baseline); 4 ranks FSDP2 (data parallel
4); 4 ranks FSDP2 x tensor parallel (2 x 2, what the tiny profiles run). The same global batch (16
sequences of 64 tokens) everywhere, 20 steps. On this 2-core machine 4 ranks share 2 cores, so the
figures compare the layouts' overheads, not their scaling. Usage: .venv/bin/python benchmarks/training_layouts.py
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = [  # (name, ranks, tensor, strategy)
    ("1 rank", 1, 1, "fsdp"),
    ("4 ranks DDP", 4, 1, "ddp"),
    ("4 ranks FSDP2 (dp 4)", 4, 1, "fsdp"),
    ("4 ranks FSDP2 x TP (2 x 2)", 4, 2, "fsdp"),
]


def config(folder, tensor, strategy, steps=20):
    folder.mkdir(parents=True, exist_ok=True)
    values = {
        "recipe": "bench", "family": "llama", "kind": "pretrain", "profile": "tiny",
        "model": {"hidden_size": 64, "intermediate_size": 172, "layers": 2, "heads": 4, "kv_heads": 2},
        "seq_len": 64, "micro_batch": 4, "lr": 3e-3, "steps": steps, "precision": "fp32", "checkpoint_every": 10,
        "seed": 7, "data_seed": 1234, "output_dir": str(folder), "log_every": 10,
        "parallel": {"tensor": tensor, "global_batch": 16, "activation_checkpointing": True, "strategy": strategy},
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def train(folder, ranks):
    command = [sys.executable, "-m", "recipes.node.train", str(folder / "config.json")]
    if ranks > 1:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
                   "-m", "recipes.node.train", str(folder / "config.json")]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=600)
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return json.loads((folder / "result.json").read_text()), events


def main():
    work = Path(tempfile.mkdtemp(prefix="tcc-layouts-"))
    print("layout                        | tokens/s | final loss | save s (mean) | resume s")
    try:
        for name, ranks, tensor, strategy in LAYOUTS:
            slug = name.replace(" ", "-").replace("(", "").replace(")", "")
            result, events = train(config(work / slug, tensor, strategy), ranks)
            saves = [e["seconds"] for e in events if e["event"] == "checkpoint_saved"]
            again = config(work / f"{slug}-resume", tensor, strategy)
            shutil.copytree(work / slug / "checkpoints" / "step-10", again / "checkpoints" / "step-10")
            _result, resumed = train(again, ranks)
            load = next(e["seconds"] for e in resumed if e["event"] == "resumed")
            print(f"{name:<29} | {result['tokens_per_s']:>8.0f} | {result['final_loss']:>10.6f} | "
                  f"{sum(saves) / len(saves):>13.3f} | {load:>8.3f}")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
