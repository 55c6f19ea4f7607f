"""The one training entry point every recipe runs through, under Slurm (`srun python -m recipes.train`).

It reads the resolved run config (a JSON file the console writes), builds the recipe's model from
transformers' Llama / Gemma config classes, and trains with torch.distributed: NCCL when GPUs exist,
gloo on CPU. Ranks come from torchrun's variables or, under plain srun, from Slurm's
(SLURM_PROCID, SLURM_NTASKS; see clusters/rendezvous.py for the rendezvous host and port).

Checkpoints are atomic (written to a temporary folder, then renamed) every `checkpoint_every` steps
and hold the model, optimizer, scheduler, every rank's RNG states, the step and the data position,
so a requeued job resumes bit-exactly from the latest one. `init_from` starts continued pretraining
from another run's checkpoint: its weights and its step count, with a fresh optimizer.

Metrics go to `metrics.jsonl` (one JSON object per logged step) and TensorBoard event files.
Nothing is downloaded: the corpus is generated from a fixed seed and the tokenizer is byte-level.
"""

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

WORDS = (
    "the",
    "model",
    "data",
    "cluster",
    "node",
    "gpu",
    "train",
    "step",
    "loss",
    "token",
    "batch",
    "layer",
    "weight",
    "gradient",
    "learn",
    "fast",
    "slow",
    "small",
    "large",
    "checkpoint",
    "resume",
    "job",
    "queue",
    "slurm",
    "partition",
    "memory",
    "compute",
    "network",
    "storage",
    "file",
    "read",
    "write",
    "run",
    "test",
    "pass",
    "fail",
    "green",
    "red",
    "blue",
    "river",
    "mountain",
    "city",
    "garden",
    "light",
    "dark",
    "morning",
    "evening",
)


def corpus(seed=1234, sentences=4000):
    """A deterministic toy corpus with enough structure for a loss that falls."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        length = rng.randint(5, 12)
        start = rng.randrange(len(WORDS))
        # Mostly consecutive words: a pattern the model can learn quickly.
        words = [WORDS[(start + i * rng.choice((1, 1, 1, 2))) % len(WORDS)] for i in range(length)]
        lines.append(" ".join(words) + ".")
    return "\n".join(lines)


class ByteTokenizer:
    """Bytes as tokens, plus BOS/EOS: no vocabulary to download or train."""

    bos, eos, pad = 256, 257, 258
    vocab_size = 260

    def encode(self, text):
        return [self.bos, *text.encode("utf-8"), self.eos]


def build_model(config):
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    shape = config["model"]
    # The tiny profiles use bytes as tokens; the real ones keep the model's own vocabulary size, and
    # the byte ids are a subset of it.
    common = {
        "vocab_size": shape.get("vocab_size", ByteTokenizer.vocab_size),
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["intermediate_size"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape.get("kv_heads", shape["heads"]),
        "max_position_embeddings": config["seq_len"],
        "bos_token_id": ByteTokenizer.bos,
        "eos_token_id": ByteTokenizer.eos,
        "pad_token_id": ByteTokenizer.pad,
    }
    torch.manual_seed(config["seed"])
    if config["family"] == "gemma":
        return Gemma2ForCausalLM(
            Gemma2Config(**common, head_dim=shape.get("head_dim", shape["hidden_size"] // shape["heads"]))
        )
    return LlamaForCausalLM(LlamaConfig(**common))


def rng_state():
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state):
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def latest_checkpoint(folder):
    found = sorted(folder.glob("step-*"), key=lambda p: int(p.name.split("-")[1])) if folder.exists() else []
    return found[-1] if found else None


def save_checkpoint(folder, step, model, optimizer, scheduler, position, rank, world, barrier):
    """Every rank writes its RNG state; rank 0 writes the rest and renames the folder into place."""
    import torch

    tmp = folder / f".tmp-step-{step}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    torch.save(rng_state(), tmp / f"rng-{rank}.pt")
    barrier()
    if rank == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        torch.save(state, tmp / "state.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "position": position, "world": world}))
        os.replace(tmp, folder / f"step-{step}")
        for old in sorted(folder.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()


def batches(tokens, seq_len, micro_batch, rank, world, position, seed):
    """An endless, deterministic stream of (inputs, labels); `position` counts batches already taken."""
    import torch

    count = (len(tokens) - 1) // seq_len
    order = list(range(count))
    random.Random(seed).shuffle(order)
    step_size = micro_batch * world
    while True:
        start = (position * step_size) % max(1, count - step_size)
        rows = [order[(start + rank * micro_batch + i) % count] for i in range(micro_batch)]
        x = torch.stack([torch.tensor(tokens[r * seq_len : r * seq_len + seq_len]) for r in rows])
        y = torch.stack([torch.tensor(tokens[r * seq_len + 1 : r * seq_len + seq_len + 1]) for r in rows])
        position += 1
        yield position, x, y


def sft_batches(examples, tokenizer, seq_len, micro_batch, rank, world, position):
    """Instruction data with the loss on the response only: prompt tokens are labelled -100."""
    import torch

    step_size = micro_batch * world
    while True:
        xs, ys = [], []
        for i in range(micro_batch):
            example = examples[(position * step_size + rank * micro_batch + i) % len(examples)]
            prompt = tokenizer.encode(f"### Question: {example['prompt']}\n### Answer: ")[:-1]
            answer = tokenizer.encode(example["response"])[1:]
            ids = (prompt + answer)[: seq_len + 1]
            ids += [ByteTokenizer.pad] * (seq_len + 1 - len(ids))
            labels = ([-100] * len(prompt) + answer)[: seq_len + 1]
            labels += [-100] * (seq_len + 1 - len(labels))
            xs.append(torch.tensor(ids[:-1]))
            ys.append(torch.tensor(labels[1:]))
        position += 1
        yield position, torch.stack(xs), torch.stack(ys)


def train(config):
    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    from clusters.rendezvous import dist_env

    rank, world, local_rank = dist_env()
    use_gpu = torch.cuda.is_available() and config.get("device", "auto") != "cpu"
    dtype = torch.bfloat16 if use_gpu and config.get("precision") in ("bf16", "fp8") else torch.float32
    if world > 1:
        dist.init_process_group("nccl" if use_gpu else "gloo", rank=rank, world_size=world)
    device = torch.device(f"cuda:{local_rank}" if use_gpu else "cpu")
    torch.set_num_threads(max(1, config.get("threads", 1)))

    def barrier():
        if world > 1:
            dist.barrier()

    out = Path(config["output_dir"])
    checkpoints = out / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    model = build_model(config).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.0)
    warmup = max(1, config["steps"] // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, config["steps"]) / config["steps"]))
        ),
    )
    step, position = 0, 0
    resume = latest_checkpoint(checkpoints)
    loading = time.perf_counter()
    if resume is not None:
        state = torch.load(resume / "state.pt", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        meta = json.loads((resume / "meta.json").read_text())
        step, position = meta["step"], meta["position"]
        set_rng_state(torch.load(resume / f"rng-{rank}.pt", weights_only=False))
        log(rank, f"resumed from {resume.name} at step {step}")
        event(out, rank, "resumed", step=step, seconds=round(time.perf_counter() - loading, 4))
    else:
        torch.manual_seed(config["seed"] + rank)
        random.seed(config["seed"] + rank)
        if config.get("init_from"):
            source = Path(config["init_from"])
            model.load_state_dict(torch.load(source / "state.pt", weights_only=False)["model"])
            step = json.loads((source / "meta.json").read_text())["step"]
            log(rank, f"continued pretraining from {source} at step {step}")
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    tokenizer = ByteTokenizer()
    seq_len, micro_batch = config["seq_len"], config["micro_batch"]
    if config["kind"] == "sft":
        examples = [json.loads(line) for line in Path(config["dataset"]).read_text().splitlines() if line.strip()]
        stream = sft_batches(examples, tokenizer, seq_len, micro_batch, rank, world, position)
    else:
        tokens = tokenizer.encode(corpus(seed=config["data_seed"]))
        stream = batches(tokens, seq_len, micro_batch, rank, world, position, config["data_seed"])
    writer = SummaryWriter(str(out / "tensorboard")) if rank == 0 else None
    metrics = (out / "metrics.jsonl").open("a") if rank == 0 else None
    started, tokens_done = time.perf_counter(), 0
    while step < config["steps"]:
        position, x, y = next(stream)
        x, y = x.to(device), y.to(device)
        logits = ddp(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        step += 1
        tokens_done += x.numel() * world
        value = loss.detach()
        if world > 1:
            dist.all_reduce(value)
            value /= world
        if rank == 0:
            elapsed = time.perf_counter() - started
            record = {
                "step": step,
                "loss": round(value.item(), 6),
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": round(float(grad_norm), 6),
                "tokens_per_s": round(tokens_done / elapsed, 1) if elapsed else 0.0,
                "time": time.time(),
            }
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
                writer.add_scalar(f"train/{key}", record[key], step)
            if step % config.get("log_every", 10) == 0 or step == config["steps"]:
                log(rank, f"step {step} loss {record['loss']:.4f} tokens/s {record['tokens_per_s']}")
        if step % config["checkpoint_every"] == 0 or step == config["steps"]:
            saving = time.perf_counter()
            save_checkpoint(checkpoints, step, model, optimizer, scheduler, position, rank, world, barrier)
            event(out, rank, "checkpoint_saved", step=step, seconds=round(time.perf_counter() - saving, 4))
    if rank == 0:
        writer.close()
        metrics.close()
        (out / "result.json").write_text(json.dumps({"step": step, "final_loss": value.item()}))
    barrier()  # rank 0 once aborted at exit without it (see shared reference)
    if world > 1:
        dist.destroy_process_group()


def event(out, rank, name, **values):
    """One line in events.jsonl (rank 0): checkpoint saves and resumes, with their durations."""
    if rank == 0:
        with (out / "events.jsonl").open("a") as handle:
            handle.write(json.dumps({"event": name, "time": time.time(), **values}) + "\n")


def log(rank, message):
    if rank == 0:
        print(f"[train] {message}", flush=True)


def train_rl(config):
    """DPO with TRL on the shipped preference set: one process (the tiny RL profile runs on one node)."""
    import copy

    import torch
    from datasets import Dataset
    from tokenizers import ByteLevelBPETokenizer
    from torch.utils.tensorboard import SummaryWriter
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    out = Path(config["output_dir"])
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in Path(config["dataset"]).read_text().splitlines() if line.strip()]
    # A byte-level BPE trained on the shipped text: nothing comes from a hub.
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [corpus(seed=config["data_seed"]), *(r["prompt"] + r["chosen"] for r in rows)],
        vocab_size=512,
        min_frequency=2,
        special_tokens=["<s>", "</s>", "<pad>"],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    shape = config["model"]
    torch.manual_seed(config["seed"])
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=512,
            hidden_size=shape["hidden_size"],
            intermediate_size=shape["intermediate_size"],
            num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"],
            num_key_value_heads=shape.get("kv_heads", shape["heads"]),
            max_position_embeddings=config["seq_len"] * 2,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    writer = SummaryWriter(str(out / "tensorboard"))
    metrics = (out / "metrics.jsonl").open("a")
    started = time.perf_counter()

    class Metrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            elapsed = time.perf_counter() - started
            record = {
                "step": state.global_step,
                "loss": round(float(logs["loss"]), 6),
                "lr": float(logs.get("learning_rate", 0)),
                "grad_norm": round(float(logs.get("grad_norm", 0)), 6),
                "reward_margin": round(float(logs.get("rewards/margins", 0)), 6),
                "tokens_per_s": round(float(logs.get("num_tokens", 0)) / elapsed, 1) if elapsed else 0.0,
                "time": time.time(),
            }
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            for key in ("loss", "lr", "grad_norm", "reward_margin"):
                writer.add_scalar(f"train/{key}", record[key], record["step"])
            if record["step"] % config.get("log_every", 10) == 0:
                print(
                    f"[train] step {record['step']} loss {record['loss']:.4f} margin {record['reward_margin']:.4f}",
                    flush=True,
                )

    args = DPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=config["micro_batch"],
        max_steps=config["steps"],
        learning_rate=config["lr"],
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        beta=0.1,
        max_length=config["seq_len"],
        seed=config["seed"],
        disable_tqdm=True,
    )
    trainer = DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),  # an in-memory model needs its reference passed (see shared reference)
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Metrics()],
    )
    result = trainer.train()
    final = out / "checkpoints" / f"step-{config['steps']}"
    final.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict()}, final / "state.pt")
    (final / "meta.json").write_text(json.dumps({"step": config["steps"], "position": 0, "world": 1}))
    tokenizer.save_pretrained(final / "tokenizer")
    writer.close()
    metrics.close()
    (out / "result.json").write_text(json.dumps({"step": config["steps"], "final_loss": result.training_loss}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the run's resolved config (JSON)")
    args = parser.parse_args(argv)
    config = json.loads(Path(args.config).read_text())
    if config["kind"] == "rl":
        if int(os.environ.get("SLURM_PROCID", "0")) == 0:
            train_rl(config)
        return
    train(config)


if __name__ == "__main__":
    sys.exit(main())
