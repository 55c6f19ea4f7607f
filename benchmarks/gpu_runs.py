"""Tiny recipe runs on this machine's GPUs, as the nodes run them (torchrun, one rank per GPU, NCCL):
a pretraining run in bf16 (tensor parallel 2 x FSDP2 with two or more GPUs, each decoder layer compiled
with inductor) that saves at step 4 and
resumes from it to the same final loss, then DPO on every GPU from its checkpoint (accelerate's FSDP2
over the policy and its reference: the path CPU ranks cannot take), then the model exported and served
by one replica (recipes/node/serve.py: vLLM when it is installed, else the transformers engine) answering
a completion. Prints each run's losses, its seconds and its peak memory, and the replica's time to ready
and first answer. No Django, no Slurm; on a machine without GPUs it says it skipped.

Usage: python benchmarks/gpu_runs.py
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TINY = {"hidden_size": 256, "intermediate_size": 688, "layers": 4, "heads": 8, "kv_heads": 4}


def config(folder, **changes):
    values = {
        "recipe": "gpu-smoke", "family": "llama", "kind": "pretrain", "profile": "tiny", "model": TINY,
        "seq_len": 256, "micro_batch": 4, "lr": 3e-3, "steps": 8, "precision": "bf16", "checkpoint_every": 4,
        "seed": 7, "data_seed": 1234, "output_dir": str(folder), "log_every": 2,
        "parallel": {"tensor": 1, "global_batch": 16, "activation_checkpointing": True},
    }  # fmt: skip
    parallel = changes.pop("parallel", {})
    values.update(changes)
    values["parallel"].update(parallel)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def run(folder, ranks):
    started = time.perf_counter()
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
               "-m", "recipes.node.train", str(folder / "config.json")]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    (folder / "run.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        print(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"{folder.name}: exit {done.returncode} (log: {folder / 'run.log'})")
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    peak = max((line.get("peak_memory_mb", 0) for line in lines), default=0)
    print(f"{folder.name:10} {ranks} GPU(s) {seconds:6.1f} s  losses {[round(line['loss'], 4) for line in lines]}"
          + (f"  peak {peak:.0f} MB" if peak else ""))  # fmt: skip
    return json.loads((folder / "result.json").read_text())


def serve(work, checkpoint, config):
    """The checkpoint exported to a Hugging Face folder and served by one replica; (engine, seconds to
    ready, seconds for one completion, its text)."""
    folder = work / "model"
    export = [sys.executable, "-m", "recipes.node.train", str(config), "--export", str(checkpoint), str(folder)]
    subprocess.run(export, cwd=ROOT, check=True, capture_output=True, timeout=600)
    engine = "vllm" if importlib.util.find_spec("vllm") else "transformers"
    token, announce = work / "token", work / "announce.json"
    token.write_text("gpu-smoke")
    token.chmod(0o600)
    command = [sys.executable, "-m", "recipes.node.serve", "--model", str(folder), "--served-name", "smoke",
               "--version", "smoke:v1", "--announce", str(announce), "--token-file", str(token),
               "--engine", engine]  # fmt: skip
    started = time.perf_counter()
    with (work / "replica.log").open("w") as log:
        replica = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not announce.exists():
            if replica.poll() is not None or time.perf_counter() - started > 900:
                raise SystemExit(f"the replica did not become ready (log: {work / 'replica.log'})")
            time.sleep(0.5)
        ready = time.perf_counter() - started
        where = json.loads(announce.read_text())
        request = urllib.request.Request(
            f"http://{where['host']}:{where['port']}/v1/completions",
            data=json.dumps({"model": "smoke", "prompt": "the model", "max_tokens": 8}).encode(),
            headers={"Authorization": "Bearer gpu-smoke", "Content-Type": "application/json"},
        )
        asked = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            text = json.loads(response.read())["choices"][0]["text"]
        return engine, ready, time.perf_counter() - asked, text
    finally:
        os.killpg(replica.pid, signal.SIGTERM)  # the engine's processes with it
        replica.wait(timeout=60)


def main():
    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU here")
        return 0
    gpus = torch.cuda.device_count()
    tensor = 2 if gpus >= 2 else 1
    ranks = gpus - gpus % tensor
    print(f"{gpus} x {torch.cuda.get_device_name(0)}; pretraining on {ranks} rank(s), tensor {tensor}")
    work = Path(tempfile.mkdtemp(prefix="tcc-gpu-runs-"))
    # Each decoder layer compiled with inductor, as the full profiles train on GPUs (launch.resolve_config).
    whole = run(config(work / "pretrain", parallel={"tensor": tensor, "compile": "inductor"}), ranks)
    again = config(work / "resume", parallel={"tensor": tensor, "compile": "inductor"})
    shutil.copytree(work / "pretrain" / "checkpoints" / "step-4", again / "checkpoints" / "step-4")
    resumed = run(again, ranks)
    print(f"resume from step 4: final loss {resumed['final_loss']:.6f} (whole run {whole['final_loss']:.6f})")
    dpo = config(
        work / "dpo", kind="rl", algorithm="dpo", steps=4, micro_batch=2, seq_len=128,
        parallel={"global_batch": 2 * gpus}, dataset=str(ROOT / "recipes/node/data/preferences.jsonl"),
        init_from=str(work / "pretrain" / "checkpoints" / "step-8"),
    )  # fmt: skip
    result = run(dpo, gpus)
    print(f"dpo on {result['world']} rank(s): final loss {result['final_loss']:.4f}")
    engine, ready, answered, text = serve(
        work, work / "pretrain" / "checkpoints" / "step-8", work / "pretrain" / "config.json"
    )
    print(f"replica ({engine}): ready in {ready:.1f} s, a completion in {answered:.2f} s: {text!r}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if abs(resumed["final_loss"] - whole["final_loss"]) < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
