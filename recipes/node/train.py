"""The one training entry point every recipe runs through, under Slurm (`srun python -m recipes.node.train`).

It reads the resolved run config (a JSON file the console writes), builds the recipe's model from
transformers' Llama / Gemma config classes, and trains with torch.distributed: NCCL when GPUs exist,
gloo on CPU. Ranks come from torchrun's variables or, under plain srun, from Slurm's
(SLURM_PROCID, SLURM_NTASKS; see clusters/rendezvous.py for the rendezvous host and port).

Checkpoints are atomic (written to a temporary folder, then renamed) every `checkpoint_every` steps
and hold the model, optimizer, scheduler, every rank's RNG states, the step and the data position,
so a requeued job resumes bit-exactly from the latest one; with `parallel.async_checkpoint` (the full
profiles) a save is written while training goes on (distributed.Checkpointer). `init_from` starts continued pretraining
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
import types
from pathlib import Path

from clusters.rendezvous import dist_env, leave
from recipes.node import chat, distributed, prepare_data

# torch and the libraries on top of it are imported inside the functions that use them (start-up cost:
# torch alone takes about 1.4 s), so `--help`, the health agent and the console's imports stay fast.

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


class FolderTokenizer:
    """A Hugging Face format folder's tokenizer with ByteTokenizer's interface (BOS, text, EOS)."""

    def __init__(self, folder):
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.bos = self.hf.bos_token_id if self.hf.bos_token_id is not None else self.hf.eos_token_id
        self.eos = self.hf.eos_token_id
        self.pad = self.hf.pad_token_id if self.hf.pad_token_id is not None else self.eos

    def encode(self, text):
        return [self.bos, *self.hf(text, add_special_tokens=False)["input_ids"], self.eos]


def architecture_folder(config):
    """The Hugging Face format folder a run's model comes from (config.json; weights and tokenizer
    beside it), when it has one: `init_from_hf`, or the checkpoint it starts from, which keeps the
    config.json and tokenizer of an HF-born model. None for the recipe's own architecture."""
    for key in ("init_from_hf", "init_from"):
        folder = config.get(key)
        if folder and (Path(folder) / "config.json").exists():
            return Path(folder)
    return None


def tokenizer_for(config):
    folder = architecture_folder(config)
    if folder is not None and any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return FolderTokenizer(folder)
    return ByteTokenizer()


def read_rows(path):
    """The rows of a data set on the cluster's shared storage: JSON lines, or a Parquet file."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet

        return pyarrow.parquet.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


HF_NAMES = {"layers": "num_hidden_layers", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads"}


def model_config(config):
    """The Hugging Face config of the recipe's own shape (config["model"], the catalog's architecture:
    recipes/catalog ARCHITECTURE): every field the catalog gives (vocabulary, head_dim, RoPE and its
    scaling, norm epsilon, tied embeddings, Gemma 2's softcaps and sliding window), the rest the
    transformers defaults of the family."""
    from transformers import Gemma2Config, LlamaConfig

    fields = {HF_NAMES.get(key, key): value for key, value in config["model"].items()}
    # The tiny profiles use bytes as tokens; the real ones keep the model's own vocabulary size, and
    # the byte ids are a subset of it.
    fields.setdefault("vocab_size", ByteTokenizer.vocab_size)
    fields.setdefault("num_key_value_heads", fields["num_attention_heads"])
    fields.setdefault("max_position_embeddings", config["seq_len"])
    ids = {"bos_token_id": ByteTokenizer.bos, "eos_token_id": ByteTokenizer.eos, "pad_token_id": ByteTokenizer.pad}
    if config["family"] == "gemma":
        fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
        return Gemma2Config(**fields, **ids)
    return LlamaConfig(**fields, **ids)


def build_model(config, device=None):
    """The recipe's model: from a Hugging Face format folder (its architecture, and its safetensors
    weights when the run starts from that folder), or the recipe's own shape from a seed. With
    device="meta" the parameters have shapes and no storage (a 405B builds in seconds and allocates
    nothing): what the parameter counts are checked on, and what a sharded build starts from."""
    import contextlib

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Gemma2ForCausalLM, LlamaForCausalLM

    folder = architecture_folder(config)
    torch.manual_seed(config["seed"])
    if folder is not None and config.get("init_from_hf") and device != "meta":
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, local_files_only=True)
        return model.train()  # from_pretrained leaves the model in eval(): no dropout, no checkpointing
    with torch.device(device) if device else contextlib.nullcontext():
        if folder is not None:
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, local_files_only=True))
        family = Gemma2ForCausalLM if config["family"] == "gemma" else LlamaForCausalLM
        return family(model_config(config))


def summed_loss(model, x, y, chunked):
    """The micro-batch's summed cross-entropy (positions labelled -100 left out): from the model's chunked
    forward (chunked_loss) when it has one, else from its whole logits. Under tensor parallelism the
    logits are split by vocabulary and the loss is computed on them in place: call it, and the backward
    pass, inside loss_context()."""
    import torch

    if chunked:
        return model(input_ids=x, labels=y)  # chunked_loss: the summed loss, never the whole logits
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100, reduction="sum"
    )


def loss_context(layout):
    """Where the loss and its backward pass run: torch's loss_parallel under tensor parallelism (the
    cross-entropy of vocabulary-split logits without gathering them), else nothing."""
    import contextlib

    if layout.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def plain(value):
    """A loss as a plain tensor (under tensor parallelism it is a DTensor, the same on every tensor rank)."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def chunked_loss(chunk):
    """A causal LM's forward that returns the summed cross-entropy of (input_ids, labels) and never
    holds the whole logits: the decoder's hidden states go through the output layer `chunk` positions
    at a time, each chunk's logits recomputed in the backward pass (activation checkpointing) instead of
    kept. It replaces the model's own forward, so FSDP2's hooks on the model still gather the output
    layer around it. Gemma 2's final softcap is applied as transformers applies it."""

    def forward(self, input_ids, labels):
        import torch
        from torch.utils.checkpoint import checkpoint

        hidden = self.model(input_ids=input_ids).last_hidden_state
        if hasattr(hidden, "redistribute"):  # split along the sequence (tensor parallelism): gather it once
            from torch.distributed.tensor import Replicate

            hidden = hidden.redistribute(placements=[Replicate()])
        cap = getattr(self.config, "final_logit_softcapping", None)

        def piece(states, targets):
            logits = self.lm_head(states).float()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="sum"
            )

        total = None
        for start in range(0, input_ids.size(1), chunk):
            end = start + chunk
            part = checkpoint(piece, hidden[:, start:end], labels[:, start:end], use_reentrant=False)
            total = part if total is None else total + part
        return total

    return forward


def batches(tokens, seq_len, global_batch, position, seed):
    """An endless, deterministic stream of (position, inputs, labels) global batches of packed sequences
    (`tokens`: a list, or a prepared data set's Tokens); `position` counts the global batches already
    taken, so the stream is the same whatever the world size, and a run resumed from a checkpoint (which
    keeps the position) reads exactly what it would have. Each epoch visits every sequence once, in an
    order drawn from the seed and the epoch."""
    import torch

    count = (len(tokens) - 1) // seq_len
    orders = {}

    def order(epoch):
        if epoch not in orders:
            orders.clear()  # one epoch's order at a time: a billion-token set has millions of sequences
            shuffled = list(range(count))
            random.Random(f"{seed}-{epoch}").shuffle(shuffled)
            orders[epoch] = shuffled
        return orders[epoch]

    def row(start, stop):
        return torch.as_tensor(tokens[start:stop], dtype=torch.long)

    while True:
        taken = [position * global_batch + i for i in range(global_batch)]
        rows = [order(n // count)[n % count] for n in taken]
        x = torch.stack([row(r * seq_len, r * seq_len + seq_len) for r in rows])
        y = torch.stack([row(r * seq_len + 1, r * seq_len + seq_len + 1) for r in rows])
        position += 1
        yield position, x, y


def sft_prompt(tokenizer, prompt):
    """An SFT example's prompt ids: the question in the model's chat format up to the answer's cue
    (recipes/node/chat.py), as a replica renders a chat request, BOS first."""
    messages = [{"role": "user", "content": prompt}]
    if isinstance(tokenizer, FolderTokenizer):
        return chat.prompt_ids(tokenizer.hf, messages)[1]
    return tokenizer.encode(chat.render(messages))[:-1]  # ByteTokenizer: BOS, the bytes (no EOS)


def pretraining_tokens(config, tokenizer):
    """What pretraining reads: a folder prepared by recipes.node.prepare_data (memory-mapped shards), or a
    .jsonl/.parquet data set of {"text"} rows tokenized here, each document BOS ... EOS, or else the
    corpus generated from the run's seed."""
    dataset = config.get("dataset")
    if dataset and prepare_data.is_prepared(dataset):
        tokens = prepare_data.Tokens(dataset)
        prepared_with = tokens.index.get("tokenizer")
        if (prepared_with == "bytes") != isinstance(tokenizer, ByteTokenizer):
            raise SystemExit(
                f"{dataset} was prepared with the {prepared_with} tokenizer, not this model's: prepare it again "
                "with --tokenizer set to the model's folder (or none for bytes)"
            )
        return tokens
    if dataset:
        return [token for row in read_rows(dataset) for token in tokenizer.encode(row["text"])]
    return tokenizer.encode(corpus(seed=config["data_seed"]))


def tokens_read(kind, x, tokenizer):
    """The tokens a global batch `x` gives the model: every position of pretraining's packed rows, an SFT
    batch's but the padding after each example (no work done: it never counts in tokens/s or MFU)."""
    if kind != "sft":
        return x.numel()
    return int((x != tokenizer.pad).sum())


def sft_batches(examples, tokenizer, seq_len, global_batch, position):
    """Instruction data with the loss on the response only: prompt tokens are labelled -100."""
    import torch

    while True:
        xs, ys = [], []
        for i in range(global_batch):
            example = examples[(position * global_batch + i) % len(examples)]
            prompt = sft_prompt(tokenizer, example["prompt"])
            answer = tokenizer.encode(example["response"])[1:]
            ids = (prompt + answer)[: seq_len + 1]
            ids += [tokenizer.pad] * (seq_len + 1 - len(ids))
            labels = ([-100] * len(prompt) + answer)[: seq_len + 1]
            labels += [-100] * (seq_len + 1 - len(labels))
            xs.append(torch.tensor(ids[:-1]))
            ys.append(torch.tensor(labels[1:]))
        position += 1
        yield position, torch.stack(xs), torch.stack(ys)


def flops_per_token(architecture, seq_len, parameters):
    """Training FLOPs per token: 6 x the parameters a token passes through, plus attention's
    12 x layers x hidden x sequence (PaLM, Chowdhery et al. 2022, appendix B)."""
    return 6 * parameters + 12 * architecture.num_hidden_layers * architecture.hidden_size * seq_len


def train(config):
    """Pretraining, continued pretraining and SFT on the recipe's mesh (recipes/node/distributed.py): each
    global batch is split over the data-parallel ranks and accumulated in micro-batches; the loss is
    the mean over the global batch's tokens, the same at any world size."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    rank, world, local_rank = dist_env()
    use_gpu = torch.cuda.is_available() and config.get("device", "auto") != "cpu"
    if use_gpu:
        torch.cuda.set_device(local_rank)
    parallel = config.get("parallel") or {}
    layout = distributed.init(rank, world, local_rank, parallel.get("tensor", 1), "cuda" if use_gpu else "cpu")
    device = torch.device(f"cuda:{local_rank}" if use_gpu else "cpu")
    mixed = use_gpu and config.get("precision") in ("bf16", "fp8")
    torch.set_num_threads(max(1, config.get("threads", 1)))

    out = Path(config["output_dir"])
    checkpoints = out / "checkpoints"
    if rank == 0:
        checkpoints.mkdir(parents=True, exist_ok=True)
    layout.barrier()
    asynchronous = bool(parallel.get("async_checkpoint", False))
    checkpointer = distributed.Checkpointer(checkpoints, layout, asynchronous=asynchronous)
    # "sharded" (the full profiles): built on the meta device, sharded, then each rank allocates and
    # fills only its shards (recipes/node/distributed.materialise). "whole" (the tiny profiles): every
    # rank builds the same seeded model and shards it, so any layout starts from the very weights one
    # rank does (the tests compare layouts' losses exactly).
    strategy = parallel.get("strategy", "fsdp")
    build = parallel.get("build") or ("sharded" if config.get("profile") == "full" else "whole")
    sharded = build == "sharded" and strategy != "ddp"
    model = build_model(config, device="meta") if sharded else build_model(config).to(device)
    parameters = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    architecture = model.config  # kept: the wrapped model below no longer has .config
    model = distributed.parallelize(
        model,
        layout,
        mixed_precision=mixed,
        activation_checkpointing=parallel.get("activation_checkpointing", True),
        strategy=strategy,
        compile=parallel.get("compile"),
    )
    loss_chunk = parallel.get("loss_chunk") if strategy != "ddp" else None
    if loss_chunk:
        model.forward = types.MethodType(chunked_loss(loss_chunk), model)
    if sharded:
        torch.manual_seed(config["seed"])
        distributed.materialise(
            model, device, hf_folder=architecture_folder(config) if config.get("init_from_hf") else None
        )
    # On GPUs the fused AdamW: one kernel per parameter group, and none of the foreach implementation's
    # temporaries (a copy of the second moments: +4 bytes per parameter at the step, more than the fit
    # check counts). On CPU torch's default, which the layout tests' exact losses were taken with.
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.0, fused=use_gpu or None)
    warmup = max(1, config["steps"] // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, config["steps"]) / config["steps"]))
        ),
    )
    step, position = 0, 0
    resume = distributed.latest(checkpoints)
    loading = time.perf_counter()
    if resume is not None:
        meta, state, resharded = distributed.load(resume, model, optimizer, layout)
        scheduler.load_state_dict(state["scheduler"])
        step, position = meta["step"], state["position"]
        log(
            rank,
            f"resumed from {resume.name} at step {step}"
            + (f" (resharded from {meta['world']} ranks)" if resharded else ""),
        )
        seconds = round(time.perf_counter() - loading, 4)
        event(out, rank, "resumed", step=step, seconds=seconds, from_world=meta["world"], resharded=resharded)
    else:
        torch.manual_seed(config["seed"] + rank)
        random.seed(config["seed"] + rank)
        if config.get("init_from"):
            saved = distributed.load_weights(config["init_from"], model)
            log(rank, f"starting from {config['init_from']} (its step {saved})")
            if config.get("continue_steps"):  # continued pretraining carries on the step count
                step = saved
        elif config.get("init_from_hf") and config.get("continue_steps"):
            step = config.get("init_step", 0)  # a registered version's step (its tcc.json)
    tokenizer = tokenizer_for(config)
    seq_len, micro_batch = config["seq_len"], config["micro_batch"]
    global_batch = parallel.get("global_batch", micro_batch * layout.dp)
    if global_batch % (micro_batch * layout.dp):
        raise SystemExit(
            f"global batch {global_batch} is not a multiple of micro batch {micro_batch} x {layout.dp} ranks"
        )
    accumulation = global_batch // (micro_batch * layout.dp)
    if config["kind"] == "sft":
        stream = sft_batches(read_rows(config["dataset"]), tokenizer, seq_len, global_batch, position)
    else:
        stream = batches(pretraining_tokens(config, tokenizer), seq_len, global_batch, position, config["data_seed"])
    folder = architecture_folder(config)

    def keep_architecture(target):
        """An HF-born model's checkpoints keep its config.json and tokenizer: what loads them later."""
        if folder is not None:
            for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if (folder / name).exists():
                    shutil.copy(folder / name, target / name)

    precision = ("bf16" if mixed else "fp32") if use_gpu else "fp32"
    if config.get("precision") == "fp8" and rank == 0:
        # FP8 training needs torchao's float8 linear layers, which this runtime does not have.
        log(rank, f"precision: the recipe asks for fp8; trained in {precision} (float8 training needs torchao)")
    per_rank = global_batch // layout.dp
    # Every probe_every steps each rank times the same local work (distributed.Probe) and rank 0 logs
    # all of them with the ranks' nodes: the console names a node whose rank is much slower.
    probe_every = config.get("probe_every", 10) if world > 1 else 0
    probe = distributed.Probe(device) if probe_every else None
    nodes = layout.names(distributed.node_name()) if probe_every else None
    peak_tflops = config.get("peak_tflops")
    writer = SummaryWriter(str(out / "tensorboard")) if rank == 0 else None
    metrics = (out / "metrics.jsonl").open("a") if rank == 0 else None
    started, tokens_done = time.perf_counter(), 0
    # A run saves its last step (what resumes it and what is exported) unless told not to: a speed
    # benchmark (benchmarks/gpu_recipe.py), whose 8B checkpoint would be 96 GB of disk for nothing.
    save_last = config.get("final_checkpoint", True)
    while step < config["steps"]:
        position, x_all, y_all = next(stream)
        total = int((y_all != -100).sum())  # the global batch's tokens the loss is averaged over
        mine_x = x_all[layout.dp_rank * per_rank : (layout.dp_rank + 1) * per_rank]
        mine_y = y_all[layout.dp_rank * per_rank : (layout.dp_rank + 1) * per_rank]
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        for micro in range(accumulation):
            if world > 1 and not sharded and hasattr(model, "set_requires_gradient_sync"):
                # One reduction per step (FSDP2), at the cost of unsharded gradients between micro-batches:
                # the tiny profiles' choice. A sharded build reduce-scatters every micro-batch, so its
                # gradients stay sharded (unsharded fp32 gradients of a 70B over tp 4 would add 70 GB).
                model.set_requires_gradient_sync(micro == accumulation - 1)
            x = mine_x[micro * micro_batch : (micro + 1) * micro_batch].to(device)
            y = mine_y[micro * micro_batch : (micro + 1) * micro_batch].to(device)
            with loss_context(layout):
                part = summed_loss(model, x, y, chunked=bool(loss_chunk))
                # FSDP averages gradients over the data-parallel ranks: x dp makes it the global sum / total.
                (part * (layout.dp / total)).backward()
            loss_sum += plain(part.detach())
        grad_norm = distributed.clip_grad_norm(list(model.parameters()), 1.0)
        optimizer.step()
        scheduler.step()
        step += 1
        tokens_done += tokens_read(config["kind"], x_all, tokenizer)
        value = layout.dp_sum(loss_sum) / total
        probed = layout.gather(probe.ms()) if probe_every and step % probe_every == 0 else None
        if rank == 0:
            elapsed = time.perf_counter() - started
            tokens_per_s = tokens_done / elapsed if elapsed else 0.0
            record = {
                "step": step,
                "loss": round(value.item(), 6),
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": round(float(grad_norm), 6),
                "tokens_per_s": round(tokens_per_s, 1),
                "peak_memory_mb": round(distributed.peak_memory_mb(), 1),
                "time": time.time(),
            }
            if probed:
                record["probe"] = {"ms": [round(ms, 3) for ms in probed], "nodes": nodes}
            if peak_tflops:
                record["mfu"] = round(
                    tokens_per_s * flops_per_token(architecture, seq_len, parameters) / (peak_tflops * 1e12 * world), 4
                )
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
                if key in record:
                    writer.add_scalar(f"train/{key}", record[key], step)
            if step % config.get("log_every", 10) == 0 or step == config["steps"]:
                log(rank, f"step {step} loss {record['loss']:.4f} tokens/s {record['tokens_per_s']}")
        if step % config["checkpoint_every"] == 0 or (step == config["steps"] and save_last):
            train_state = {"scheduler": scheduler.state_dict(), "position": position}
            seconds = checkpointer.save(step, model, optimizer, train_state, extra=keep_architecture)
            event(out, rank, "checkpoint_saved", step=step, seconds=round(seconds, 4), asynchronous=asynchronous)
    checkpointer.finish()  # the last checkpoint is whole before the run ends (and its model is exported)
    peak = layout.max(distributed.peak_memory_mb())
    if rank == 0:
        writer.close()
        metrics.close()
        elapsed = time.perf_counter() - started
        result = {
            "step": step,
            "final_loss": value.item(),
            "world": world,
            "tensor": layout.tp,
            "data": layout.dp,
            "accumulation": accumulation,
            "global_batch": global_batch,
            "precision": precision,
            "peak_memory_mb": round(peak, 1),
            "tokens_per_s": round(tokens_done / elapsed, 1) if elapsed else 0.0,
        }
    layout.barrier()  # rank 0 once aborted at exit without it (see shared reference)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    if rank == 0:
        # The run's model in Hugging Face format, what the registry stores and servers load, written
        # before result.json: a run that has a result has its model.
        if config.get("export_model", True) and save_last:
            export(config, checkpoints / f"step-{step}", out / "model", step=step, final_loss=result["final_loss"])
        (out / "result.json").write_text(json.dumps(result))
    if world > 1:
        leave()  # before this function's locals (the sharded model, its device mesh) are freed: see train_rl
    return world


def event(out, rank, name, **values):
    """One line in events.jsonl (rank 0): checkpoint saves and resumes, with their durations."""
    if rank == 0:
        with (out / "events.jsonl").open("a") as handle:
            handle.write(json.dumps({"event": name, "time": time.time(), **values}) + "\n")


def log(rank, message):
    if rank == 0:
        print(f"[train] {message}", flush=True)


def hf_tokenizer():
    """ByteTokenizer as a transformers tokenizer (TRL's trainers take one): byte b is token b, as in
    the pretraining runs, so a checkpoint of any recipe continues under RL. A BPE with no merges over
    GPT-2's byte-to-character table, and nothing from a hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    vocab = {table[b]: b for b in range(256)} | {"<s>": ByteTokenizer.bos, "</s>": ByteTokenizer.eos,
                                                  "<pad>": ByteTokenizer.pad, "<unk>": 259}  # fmt: skip
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    made = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    made.chat_template = chat.TEMPLATE  # saved with every export: each engine asks in the trained format
    return made


def word_reward(completions, answers, **kwargs):
    """The shipped verifiable reward of the tiny GRPO task (recipes/node/data/colours.jsonl: "name a
    colour"), from 0 to 1: 1 for an answer that starts with one of the accepted words, else how much of
    the closest one it starts with, character by character (a gradient from the first letter on)."""
    rewards = []
    for completion, accepted in zip(completions, answers, strict=True):
        text = (completion if isinstance(completion, str) else completion[0]["content"]).lstrip()
        best = 0.0
        for word in accepted:
            matched = 0
            while matched < len(word) and matched < len(text) and text[matched] == word[matched]:
                matched += 1
            best = max(best, matched / len(word))
        rewards.append(round(best, 6))
    return rewards


REWARDS = {"word_prefix": word_reward}


def trl_arguments(config, out, world=1):
    """TRL's arguments for the recipe's RL algorithm on `world` ranks: DPOConfig, or GRPOConfig with the
    recipe's number of generations per prompt. Each rank takes micro-batches of `micro_batch` and
    accumulates them up to the layout's global batch (parallel.global_batch: micro-batch x data ranks x
    accumulation, as train() splits it), which also makes GRPO's generation batch (micro-batch x ranks x
    accumulation) a multiple of its generations, as TRL's own check requires. Over several ranks the
    policy (and DPO's reference model) is sharded with FSDP2 per decoder layer, as train() shards its
    models; on GPUs the full profiles compute in bf16 with activation checkpointing."""
    import torch

    parallel = config.get("parallel") or {}
    micro = config["micro_batch"]
    global_batch = parallel.get("global_batch") or micro * world
    if global_batch % (micro * world):
        raise SystemExit(
            f"the global batch of {global_batch} does not split into micro-batches of {micro} over {world} ranks"
        )
    use_gpu = torch.cuda.is_available() and config.get("device", "auto") != "cpu"
    checkpointing = bool(parallel.get("activation_checkpointing", True))
    common = {
        "output_dir": str(out / "trl"),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": global_batch // (micro * world),
        "max_steps": config["steps"],
        "learning_rate": config["lr"],
        "use_cpu": not use_gpu,
        "bf16": use_gpu and config.get("precision") in ("bf16", "fp8"),
        # Each decoder layer recomputed in the backward pass (TRL's default too), as train() does; over
        # several ranks by FSDP's own wrapper (below), which spares the trainer's a second all-gather.
        "activation_checkpointing": checkpointing and world == 1,
        "activation_checkpointing_kwargs": {"use_reentrant": False},
        "ddp_find_unused_parameters": False,  # every parameter takes part (DDP, on CPU ranks)
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": config["seed"],
        "disable_tqdm": True,
    }
    if world > 1:
        layer = "Gemma2DecoderLayer" if config.get("family") == "gemma" else "LlamaDecoderLayer"
        # On GPUs accelerate shards with FSDP2; on CPUs (gloo) it takes no FSDP and runs DDP.
        common["fsdp"] = True
        common["fsdp_config"] = {
            "version": 2,
            "transformer_layer_cls_to_wrap": [layer],
            "reshard_after_forward": True,
            "activation_checkpointing": checkpointing,
        }
    if config.get("algorithm", "dpo") == "grpo":
        from trl import GRPOConfig

        return GRPOConfig(
            **common,
            num_generations=config.get("generations", 4),
            max_completion_length=config.get("completion_length", 12),
            temperature=1.0,
            beta=0.0,
        )
    from trl import DPOConfig

    return DPOConfig(**common, beta=0.1, max_length=config["seq_len"])


def rl_ranks():
    """(rank, world) of an RL run, with the variables accelerate (under TRL) reads to join the process
    group set from Slurm's when srun, not torchrun, started the ranks."""
    rank, world, local_rank = dist_env()  # sets MASTER_ADDR and MASTER_PORT under Slurm
    if world > 1:
        local_world = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE") or "1"
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
        os.environ.setdefault("LOCAL_WORLD_SIZE", local_world)
    return rank, world


def train_rl(config):
    """RL from a checkpoint with TRL on the shipped data, on every rank of the layout: DPO on preference
    pairs, or GRPO (online: the policy samples, the recipe's reward function scores) on prompts. Each
    rank takes its share of every global batch (GRPO generates for its own prompts); over several ranks
    the policy and DPO's reference are sharded (trl_arguments). Rank 0 writes the metrics, the
    checkpoint and the export from the gathered weights."""
    import copy
    import warnings

    import datasets
    from datasets import Dataset
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerCallback

    rank, world = rl_ranks()
    datasets.disable_progress_bars()  # bars drawn with carriage returns, by every rank, in the job's log
    # TRL calls transformers' old names for activation checkpointing; each rank warned of each, each run.
    warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed in v6", category=FutureWarning)
    out = Path(config["output_dir"])
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    rows = read_rows(config["dataset"])
    folder_tokenizer = tokenizer_for(config)
    tokenizer = folder_tokenizer.hf if isinstance(folder_tokenizer, FolderTokenizer) else hf_tokenizer()
    model = build_model(config)
    if config.get("init_from") and not config.get("init_from_hf"):
        step = distributed.load_weights(config["init_from"], model)
        if rank == 0:
            log(0, f"starting from {config['init_from']} (its step {step})")
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, config["seq_len"] * 2)
    args = trl_arguments(config, out, world)  # joins the process group over several ranks
    writer = SummaryWriter(str(out / "tensorboard")) if rank == 0 else None
    metrics = (out / "metrics.jsonl").open("a") if rank == 0 else None
    started = time.perf_counter()
    algorithm = config.get("algorithm", "dpo")
    if rank == 0:
        print(f"[train] {algorithm} on {world} rank(s), {args.gradient_accumulation_steps} micro-batch(es) "
              f"of {args.per_device_train_batch_size} per rank a step", flush=True)  # fmt: skip

    class Metrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs or metrics is None:
                return
            elapsed = time.perf_counter() - started
            record = {
                "step": state.global_step,
                "loss": round(float(logs["loss"]), 6),
                "lr": float(logs.get("learning_rate", 0)),
                "grad_norm": round(float(logs.get("grad_norm", 0)), 6),
                "tokens_per_s": round(float(logs.get("num_tokens", 0)) / elapsed, 1) if elapsed else 0.0,
                "time": time.time(),
            }
            if algorithm == "dpo":
                record["reward_margin"] = round(float(logs.get("rewards/margins", 0)), 6)
            else:
                record["reward"] = round(float(logs.get("reward", 0)), 6)
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            for key in ("loss", "lr", "grad_norm", "reward_margin", "reward"):
                if key in record:
                    writer.add_scalar(f"train/{key}", record[key], record["step"])
            if record["step"] % config.get("log_every", 10) == 0:
                extra = {k: record[k] for k in ("reward_margin", "reward") if k in record}
                print(f"[train] step {record['step']} loss {record['loss']:.4f} {extra}", flush=True)

    if algorithm == "grpo":
        from trl import GRPOTrainer

        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[REWARDS[config["reward"]]],
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[Metrics()],
        )
    else:
        from trl import DPOTrainer

        trainer = DPOTrainer(
            model=model,
            ref_model=copy.deepcopy(model),  # an in-memory model needs its reference passed (see shared reference)
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[Metrics()],
        )
    result = trainer.train()
    # Every rank takes part in gathering the sharded weights; rank 0 receives them (on the host).
    state = trainer.accelerator.get_state_dict(trainer.model)
    if rank == 0:
        whole = model
        if world > 1:  # the ranks' model is sharded: the gathered weights go into a whole one
            whole = distributed.materialise(build_model(config, device="meta"), "cpu", fill=False)
            whole.load_state_dict(state)
        distributed.save_weights(out / "checkpoints" / f"step-{config['steps']}", config["steps"], whole)
        writer.close()
        metrics.close()
        if config.get("export_model", True):
            save_model(whole, config, out / "model", step=config["steps"], final_loss=result.training_loss)
        (out / "result.json").write_text(
            json.dumps({"step": config["steps"], "final_loss": result.training_loss, "world": world})
        )
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # rank 0's files are whole before any rank's step ends
        dist.destroy_process_group()
        # Here, not after returning: the trainer's DDP reducer still holds the gloo process group, and
        # freeing this function's locals destroys it while holding the GIL, joining gloo's thread, which
        # may itself wait for the GIL to free the last barrier's work: rank 1 of the two-rank DPO test
        # hung so after its run had ended (gdb: ~ProcessGroupGloo joining pt_gloo_runloop in
        # ~AsyncBarrierWork -> gil_scoped_acquire). Every file is written and closed by now.
        leave()


def export(config, checkpoint, folder, **about):
    """A checkpoint of a run as a Hugging Face format folder (config.json, model.safetensors and the
    tokenizer): what `init_from: "hf:<folder>"` reads, what the registry stores, and what transformers
    and vLLM load. One process holds the whole model (in fp32): fine for the tiny profiles; a 70B
    exports from its sharded checkpoint with `--export` on a node with the memory for it."""

    model = build_model(config)
    step = distributed.load_weights(checkpoint, model)
    return save_model(model, config, folder, **{"step": step, **about})


def save_model(model, config, folder, **about):
    """The model, its tokenizer and tcc.json (step, final loss, recipe: what a registered version's
    lineage and continued pretraining read) into `folder`, which appears whole (written beside it)."""
    folder = Path(folder)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar drawn with carriage returns, in a log file
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer = tokenizer_for(config)
    (tokenizer.hf if isinstance(tokenizer, FolderTokenizer) else hf_tokenizer()).save_pretrained(staging)
    about = {"recipe": config.get("recipe"), "family": config.get("family"), "seq_len": config.get("seq_len"), **about}
    (staging / "tcc.json").write_text(json.dumps(about))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the run's resolved config (JSON)")
    parser.add_argument(
        "--export", nargs=2, metavar=("CHECKPOINT", "FOLDER"), help="write CHECKPOINT as a Hugging Face format FOLDER"
    )
    args = parser.parse_args(argv)
    config = json.loads(Path(args.config).read_text())
    if args.export:
        export(config, *args.export)
        return
    if config["kind"] == "rl":
        train_rl(config)  # a rank of several leaves from inside (it does not return)
        return
    train(config)  # a rank of several leaves from inside (it does not return)


if __name__ == "__main__":
    sys.exit(main())
