"""torch.distributed for recipes/node/train.py, on the nodes (torch only; no Django): one rank per GPU (or per
CPU slot on the tiny profiles), a 2-D device mesh of data x tensor parallelism from the recipe, tensor
parallelism as torchtitan plans it (every decoder layer's attention and MLP, sequence parallelism between
them, the vocabulary split in the embedding and the output layer), FSDP2 (`fully_shard`) per decoder layer and on
the model, activation checkpointing, gradient clipping across both meshes, and checkpoints written with
torch.distributed.checkpoint (DCP): sharded (each rank writes its own shards), atomic (a temporary
folder renamed into place once every rank has written), resumable bit-exactly at the same layout (every
rank's RNG state is kept) and loadable at another world size (DCP reshards).

Pipeline parallelism is not implemented: a recipe's pipeline stages are folded into the data-parallel
dimension, where FSDP2 shards the model instead (recipes/runs/fit.py counts memory that way).
"""

import contextlib
import json
import os
import random
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

# torch and the libraries on top of it are imported inside the functions that use them (start-up cost:
# torch alone takes about 1.4 s), so `--help`, the health agent and the console's imports stay fast.

TP_PLAN = {  # Megatron-style: column-parallel in, row-parallel out, so each block needs one all-reduce
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


@dataclass
class Layout:
    rank: int
    world: int
    local_rank: int
    tp: int
    dp: int
    dp_rank: int
    mesh: object = None  # DeviceMesh ("dp", "tp") when world > 1
    device: object = "cpu"  # where this rank's tensors live: every collective takes its tensors here (NCCL: the GPU)

    def barrier(self):
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def dp_sum(self, tensor):
        """Sum a tensor over the data-parallel ranks (tensor-parallel ranks of one group hold the same)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.mesh["dp"].get_group())
        return tensor

    def max(self, value):
        if self.world == 1:
            return value
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(float(value), device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.item()

    def gather(self, value):
        """Every rank's number, in rank order: one all_gather of a float on the layout's device."""
        if self.world == 1:
            return [float(value)]
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(value)], device=self.device)
        found = [torch.empty_like(tensor) for _ in range(self.world)]
        dist.all_gather(found, tensor)
        return [part.item() for part in found]

    def names(self, name):
        """Every rank's name (the node it runs on), in rank order."""
        if self.world == 1:
            return [name]
        import torch.distributed as dist

        found = [None] * self.world
        dist.all_gather_object(found, name)
        return found


class Probe:
    """The same fixed chain of matrix products on every rank's device, timed without any collective, so
    that a rank much slower than the others is on a slow node (a throttled or failing GPU, a CPU taken by
    something else) even though the step time, which waits for the slowest rank at every collective, is
    the same on all of them. About 1 ms on an H100 (8 products of 4096 x 4096 in bf16), about 15 ms on
    one CPU thread (256 x 256 in fp32). `ms()` is the median of `repeats` timings."""

    def __init__(self, device):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        size, dtype = (4096, torch.bfloat16) if self.cuda else (256, torch.float32)
        self.matrix = torch.full((size, size), 1.0 / size, dtype=dtype, device=self.device)  # stays 1/size
        self.chain()  # warm up: the first product pays for the library's set-up

    def chain(self):
        x = self.matrix
        for _ in range(8):
            x = x @ self.matrix
        return x

    def ms(self, repeats=3):
        import statistics

        import torch

        times = []
        for _ in range(repeats):
            if self.cuda:
                torch.cuda.synchronize(self.device)
            started = time.perf_counter()
            self.chain()
            if self.cuda:
                torch.cuda.synchronize(self.device)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)


def node_name():
    """The Slurm node this rank runs on (the host's name outside Slurm)."""
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def init(rank, world, local_rank, tensor, device_type, backend=None, store=None):
    """Join the process group and build the (dp, tp) mesh; tensor parallelism must divide the world. The
    backend is NCCL on GPUs and gloo on CPUs unless given (recipes/node/memory.py: "fake", with its store)."""
    import torch.distributed as dist

    if world % tensor:
        raise SystemExit(f"tensor parallelism {tensor} does not divide the {world} ranks")
    dp = world // tensor
    device = f"cuda:{local_rank}" if device_type == "cuda" else "cpu"
    if world == 1:
        return Layout(rank, 1, local_rank, 1, 1, 0, device=device)
    from torch.distributed.device_mesh import init_device_mesh

    backend = backend or ("nccl" if device_type == "cuda" else "gloo")
    dist.init_process_group(backend, rank=rank, world_size=world, **({"store": store} if store else {}))
    mesh = init_device_mesh(device_type, (dp, tensor), mesh_dim_names=("dp", "tp"))
    # A reduction over both dimensions (the gradient norm of tensor-parallel weights) then runs as one
    # collective over the flattened mesh, not two in a row: faster, and the same order on every rank
    # (torch warned of it on every rank at every step).
    mesh["dp", "tp"]._flatten("dp_tp")
    return Layout(rank, world, local_rank, tensor, dp, mesh["dp"].get_local_rank(), mesh, device)


def parallelize(model, layout, mixed_precision, activation_checkpointing, strategy="fsdp", compile=None):
    """Tensor parallelism (tensor_parallel), then each decoder layer compiled (`compile`: a torch.compile
    backend, "inductor" on GPUs; None: not compiled), then FSDP2 per layer and on the whole model:
    torchtitan's order. With strategy "ddp" (no tensor parallelism) every rank keeps the whole model and
    DDP averages gradients: the baseline the benchmark compares with."""
    import torch

    if activation_checkpointing:
        # Recompute each decoder layer in the backward pass instead of keeping its activations (a KV
        # cache is for generation: off, as checkpointing requires); "selective": keep some of them.
        model.config.use_cache = False
        kwargs = {"use_reentrant": False}
        if activation_checkpointing == "selective":
            kwargs["context_fn"] = selective_context
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    if strategy == "ddp" and layout.tp > 1:
        raise SystemExit("DDP keeps the whole model on every rank: it takes no tensor parallelism")
    layers = model.model.layers
    if layout.world > 1 and layout.tp > 1:
        tensor_parallel(model, layout.mesh["tp"])
    compile_layers(layers, compile)
    if layout.world == 1:
        return model
    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    for layer in layers:
        fully_shard(layer, mesh=layout.mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=layout.mesh["dp"], mp_policy=policy)
    return model


def compile_layers(layers, backend):
    """Compile each decoder layer on its own, in place (torchtitan's per-block compile: one graph per layer
    kind, reused by every layer of that kind; the module and its state dict keys stay as they are, so
    checkpoints and FSDP2 see the same model). Activation checkpointing stays outside the compiled
    forward, and FSDP2's hooks are not traced (dynamo's skip_fsdp_hooks). fullgraph: a graph break is an
    error at the first step, not a silent slowdown."""
    if not backend:
        return
    for layer in layers:
        layer.compile(backend=backend, fullgraph=True)


def saved_ops():
    """What selective activation checkpointing keeps instead of recomputing (torchtitan's "selective op"
    list): matrix products, attention's fused kernels and the sequence-parallel reduce-scatters."""
    import torch

    aten = torch.ops.aten
    names = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")  # fmt: skip
    found = {aten.mm.default, torch.ops._c10d_functional.reduce_scatter_tensor.default}
    return found | {getattr(aten, name).default for name in names if hasattr(aten, name)}


def selective_context():
    """Contexts for one layer's checkpoint under selective activation checkpointing, as torchtitan's
    "selective op" policy: every op of saved_ops() keeps its output, except every second matrix
    product (in the forward and again in the recomputation, counted apart), which is recomputed with
    the rest. Less recomputation than whole-layer checkpointing for more memory (fit.py counts it)."""
    from collections import Counter

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep, count = saved_ops(), Counter()

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            count[mode] += 1
            if count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def tensor_parallel(model, mesh):
    """torchtitan's tensor-parallel plan for Llama on a transformers model: the vocabulary split over
    the tensor ranks in the embedding and the output layer (whose logits stay split: the loss is
    computed on them in place, loss_parallel), and sequence parallelism between the blocks: the
    residual stream, the norms and their activations are split along the sequence, gathered before
    each attention and MLP (whose projections are column- then row-parallel: TP_PLAN) and scattered
    again after. Each rank then keeps 1/tp of what activation checkpointing keeps and of every norm's
    work. Gemma's tied output layer is tied again to the split embedding (both split by vocabulary)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tied = model.config.tie_word_embeddings and model.get_output_embeddings() is not None
    # The residual stream stays a DTensor (global shapes): transformers builds the attention mask and
    # the positions from the embeddings' shape, which a local slice of the sequence would get wrong.
    parallelize_module(
        model,
        mesh,
        {
            "model.embed_tokens": RowwiseParallel(
                input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
            ),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        },
    )
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    for layer in model.model.layers:
        plan = {
            name: SequenceParallel()
            for name in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            )
            if hasattr(layer, name)
        }
        plan["self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        )
        plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        for name, style in TP_PLAN.items():
            if style == "colwise":
                plan[name] = ColwiseParallel()
            else:
                plan[name] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        parallelize_module(layer, mesh, plan)


def materialise(model, device, hf_folder=None, fill=True):
    """Storage for a model built on the meta device and sharded (parallelize): each rank allocates only
    its own shards, then fills them: from a Hugging Face folder's safetensors, each rank reading only
    the slices of its shards (DCP's HuggingFaceStorageReader), or with the model's initialisation
    drawn per shard. A 70B or 405B never exists whole on any rank or host. Non-persistent buffers (the
    rotary embedding's frequencies) are computed again on the device. fill=False leaves the weights
    unfilled (recipes/node/memory.py traces a step on fake tensors, which hold no values)."""
    import torch

    tied = model.config.tie_word_embeddings and model.get_output_embeddings() is not None
    model.to_empty(device=device)
    if tied:  # to_empty gives each module its own tensor; tie them again as the model was built
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    with torch.no_grad():
        if hf_folder is not None:
            load_hf(model, hf_folder)
        elif fill:
            initialise(model)
        recompute_buffers(model, device)
    return model


def recompute_buffers(model, device):
    """The buffers a checkpoint does not hold (non-persistent), which transformers computes from the
    config when a module is built: the rotary embedding's frequencies and Gemma's embedding scale. Any
    other is refused here rather than left as the garbage to_empty leaves."""
    import torch

    for module in model.modules():
        names = set(getattr(module, "_non_persistent_buffers_set", ()))
        if not names:
            continue
        if type(module).__name__.endswith("RotaryEmbedding"):
            with torch.device(device):
                fresh = type(module)(config=module.config)
            for name, buffer in fresh.named_buffers(recurse=False):
                setattr(module, name, buffer)
        elif names == {"embed_scale"} and hasattr(module, "scalar_embed_scale"):
            module.embed_scale = torch.tensor(module.scalar_embed_scale, device=device)
        else:
            raise RuntimeError(f"{type(module).__name__} has buffers {sorted(names)} that a sharded build cannot fill")


def initialise(model):
    """What transformers' _init_weights draws (normal(0, initializer_range) for linear and embedding
    weights, zero biases, norms at their identity: 1, or 0 where the norm multiplies by 1 + weight, as
    Gemma 2's does), done on each rank's shards (DTensor's random ops draw per shard)."""
    import torch

    std = model.config.initializer_range
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)
        elif type(module).__name__.endswith("RMSNorm"):
            gemma = type(module).__name__.startswith("Gemma")
            (torch.nn.init.zeros_ if gemma else torch.nn.init.ones_)(module.weight)


def load_hf(model, folder):
    """A Hugging Face folder's safetensors into a sharded model: each rank reads the slices it holds."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    state = get_model_state_dict(model)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: the folder holds the embedding once
    dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(path=str(folder)))
    set_model_state_dict(model, state, options=StateDictOptions(strict=False))


def clip_grad_norm(parameters, max_norm):
    """The global gradient norm, clipped to `max_norm`. Parameters live on two meshes (dp for the
    replicated-across-tp ones, dp x tp for the tensor-parallel ones), so norms are summed per mesh and
    then together; torch's own clip_grad_norm_ cannot stack DTensors of different meshes."""
    import torch
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    groups = {}
    for grad in grads:
        key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
        groups.setdefault(key, []).append(grad)
    total = torch.zeros((), dtype=torch.float32, device=grads[0].device if grads else "cpu")
    for members in groups.values():
        squares = torch.stack([torch.linalg.vector_norm(g, 2, dtype=torch.float32) for g in members]).pow(2).sum()
        if isinstance(squares, DTensor):
            squares = squares.full_tensor()
        total = total + squares
    norm = total.sqrt()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    # A DTensor takes a Python number, not a plain tensor: one device sync per step, not one per gradient.
    number = scale.item() if any(isinstance(grad, DTensor) for grad in grads) else None
    for grad in grads:
        grad.mul_(number if isinstance(grad, DTensor) else scale.to(grad.dtype))
    return norm


# -- checkpoints ------------------------------------------------------------------------------------


def rng_state():
    """Every generator's state in types torch.load(weights_only=True) reads back: tuples, lists, numbers,
    tensors (numpy's key array becomes a list)."""
    import numpy as np
    import torch

    name, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), position, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    import numpy as np
    import torch

    random.setstate(state["python"])
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_state(path):
    """A .pt file of a checkpoint, tensors and plain values only. Checkpoints are written by users' jobs
    and read by other users' (continued pretraining and SFT start from a colleague's run), so a pickle
    that would run code when loaded is refused (UnpicklingError), never run."""
    import numpy as np
    import torch

    # numpy uint32 arrays rebuild from these without running code: RNG files written before the numpy
    # state was saved as a list still load.
    with torch.serialization.safe_globals(
        [np.dtype, np.ndarray, np._core.multiarray._reconstruct, np.dtypes.UInt32DType]
    ):
        return torch.load(path, weights_only=True)


def steps_in(folder):
    return sorted((p for p in folder.glob("step-*") if p.name[5:].isdigit()), key=lambda p: int(p.name.split("-")[1]))


def latest(folder):
    found = steps_in(folder) if folder.exists() else []
    return found[-1] if found else None


class Checkpointer:
    """A run's step-N checkpoints: DCP shards of the model and optimizer, train_state.pt (scheduler, data
    position), meta.json and rng-<rank>.pt (and what `extra(folder)` writes, on rank 0), written to
    .tmp-step-N and renamed into place once every rank has written, so a step-N folder is always whole.

    With `asynchronous` (the full profiles on GPUs), a save blocks the training loop only while each
    rank's shards are copied to host memory (torch.distributed.checkpoint.async_save); they are written
    in a thread while training goes on, over a gloo group of their own (no NCCL collective runs off the
    main stream), and the folder is renamed at the next save or at finish(). A run that dies with a save
    in flight resumes from the one before: its .tmp folder never becomes step-N."""

    def __init__(self, folder, layout, keep=2, asynchronous=False):
        self.folder, self.layout, self.keep, self.asynchronous = folder, layout, keep, asynchronous
        self.pending = None  # (step, tmp folder, train_state, extra, the async save's future or None)
        self.group = None
        if asynchronous and layout.world > 1:
            import torch.distributed as dist

            self.group = dist.new_group(backend="gloo")  # every rank makes it, in the same order

    def save(self, step, model, optimizer, train_state, extra=None):
        """Save step `step`; returns the seconds the training loop waited (the whole save when not
        asynchronous)."""
        import copy

        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        started = time.perf_counter()
        self.finish()  # the save before is whole before this one starts
        tmp = self.folder / f".tmp-step-{step}"
        if self.layout.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.layout.barrier()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        torch.save(rng_state(), tmp / f"rng-{self.layout.rank}.pt")
        if self.asynchronous:
            future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self.group)
            self.pending = (step, tmp, copy.deepcopy(train_state), extra, future)
        else:
            dcp.save(state, checkpoint_id=str(tmp))
            self.pending = (step, tmp, train_state, extra, None)
            self.finish()
        return time.perf_counter() - started

    def finish(self):
        """Wait for the save in flight, if any, and rename it into place (every rank calls it)."""
        import torch

        if self.pending is None:
            return
        step, tmp, train_state, extra, future = self.pending
        self.pending = None
        if future is not None:
            future.result()
        self.layout.barrier()
        if self.layout.rank == 0:
            if extra is not None:
                extra(tmp)
            torch.save(train_state, tmp / "train_state.pt")
            meta = {"step": step, "position": train_state["position"], "world": self.layout.world,
                    "tp": self.layout.tp, "format": "dcp"}  # fmt: skip
            (tmp / "meta.json").write_text(json.dumps(meta))
            os.replace(tmp, self.folder / f"step-{step}")
            for old in steps_in(self.folder)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        self.layout.barrier()


def load(source, model, optimizer, layout):
    """Resume from a checkpoint of this run: (meta, train_state, resharded). At the same world size and
    tensor parallelism every rank's RNG state comes back too (bit-exact); at another, DCP reshards the
    model and optimizer and the RNG states are left as seeded (said in the run's events)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = json.loads((source / "meta.json").read_text())
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(source))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    train_state = read_state(source / "train_state.pt")
    same = meta["world"] == layout.world and meta.get("tp", 1) == layout.tp
    if same:
        set_rng_state(read_state(source / f"rng-{layout.rank}.pt"))
    return meta, train_state, not same


@contextlib.contextmanager
def one_process():
    """DCP in this process alone, on purpose (an export's load, the RL trainers' rank 0's save), without the
    warning torch gives each time it does so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def load_weights(source, model):
    """A model's weights only (continued pretraining, SFT, RL from a checkpoint), whatever layout wrote
    it: a DCP checkpoint (resharded), or an older one with the whole model in state.pt. (A Hugging Face
    format folder's safetensors are loaded when the model is built: train.build_model.)"""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    source = Path(source)
    if (source / "state.pt").exists():
        full = read_state(source / "state.pt")["model"]
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
    else:
        state = {"model": get_model_state_dict(model)}
        with one_process():
            dcp.load(state, checkpoint_id=str(source), no_dist=not dist.is_initialized())
        set_model_state_dict(model, state["model"])
    return json.loads((source / "meta.json").read_text())["step"]


def save_weights(folder, step, model):
    """A whole model's weights as a DCP checkpoint written by this process alone (the RL trainers' rank 0,
    while the other ranks wait), loadable like any other."""
    import torch.distributed.checkpoint as dcp

    tmp = folder.parent / f".tmp-{folder.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with one_process():
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp), no_dist=True)
    (tmp / "meta.json").write_text(json.dumps({"step": step, "position": 0, "world": 1, "tp": 1, "format": "dcp"}))
    os.replace(tmp, folder)


def peak_memory_mb():
    """This process's peak memory: allocated GPU memory on a GPU, else the resident set size."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
