"""How often a multi-rank run of recipes/node/train.py ends badly: the 2 x 2 mesh (4 ranks, gloo, CPU)
of the tiny Llama profile is trained N times to its end (checkpoint, model export, result.json) and
every rank's exit is counted. A rank that aborts at its end (SIGABRT, "terminate called without an
active exception") fails the whole Slurm job after every step trained; issue #26 asks for 0 in 20.

Usage: .venv/bin/python benchmarks/training_exits.py [runs, default 20]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def config(folder, steps=6):
    folder.mkdir(parents=True, exist_ok=True)
    values = {
        "recipe": "bench", "family": "llama", "kind": "pretrain", "profile": "tiny",
        "model": {"hidden_size": 64, "intermediate_size": 172, "layers": 2, "heads": 4, "kv_heads": 2},
        "seq_len": 64, "micro_batch": 2, "lr": 3e-3, "steps": steps, "precision": "fp32", "checkpoint_every": 3,
        "seed": 7, "data_seed": 1234, "output_dir": str(folder), "log_every": 3,
        "parallel": {"tensor": 2, "global_batch": 8, "activation_checkpointing": True},
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def launch(folder, port, ranks=4):
    """The ranks as srun starts them: one process each with SLURM_PROCID/SLURM_NTASKS, rank 0 hosting
    the rendezvous store (clusters/rendezvous.py), not torchrun's agent. Returns each rank's exit code
    (a negative one is the signal that ended it) and their stderr."""
    env = {**os.environ, "SLURM_NTASKS": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_NODELIST"):
        env.pop(name, None)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "recipes.node.train", str(folder / "config.json")],
            cwd=ROOT,
            env={**env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    errors = [process.communicate(timeout=600)[1] for process in processes]
    codes = [process.returncode for process in processes]
    return codes, "\n".join(error for code, error in zip(codes, errors, strict=True) if code)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    work = Path(tempfile.mkdtemp(prefix="tcc-exits-"))
    failed, seconds = [], []
    try:
        for n in range(runs):
            folder = config(work / f"run-{n}")
            started = time.perf_counter()
            codes, errors = launch(folder, port=29600 + n % 50)
            seconds.append(time.perf_counter() - started)
            ok = not any(codes) and (folder / "result.json").exists()
            if not ok:
                failed.append((n, codes, errors.splitlines()[-12:]))
            print(f"run {n + 1:>2}/{runs}: {'ok' if ok else f'FAILED (exit codes {codes})'} "
                  f"in {seconds[-1]:.1f} s", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{runs - len(failed)} of {runs} runs ended cleanly; {len(failed)} failed")
    for n, code, tail in failed:
        print(f"  run {n + 1}: exit codes {code}, the failed ranks' stderr ends:")
        print("\n".join(f"    {line}" for line in tail))
    print(f"mean {sum(seconds) / len(seconds):.1f} s a run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
