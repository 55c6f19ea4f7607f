"""Will it fit? The memory one GPU needs to train a recipe on a layout, before anything is submitted.

Per GPU, with FSDP2 over the data-parallel ranks and torchtitan's tensor parallelism (the layout
recipes/node/distributed.py builds: the decoder layers, the embedding and the output layer split over
tp, the sequence split between the blocks; pipeline stages fold into data parallelism), bf16 compute:

- model states, sharded over dp and tp: fp32 master weights
  (4 bytes), fp32 gradients (4) and AdamW's two moments (8): 16 bytes per parameter (the fused AdamW
  train.py uses on GPUs adds no temporaries at the step);
- gathered weights: the bf16 weights of the model's outer group (embeddings, output layer, final norm:
  kept gathered from the forward to the backward) and of two decoder layers (the one computing and the
  one FSDP prefetches);
- the output layer's bf16 gradient (its 1/tp), which waits for the end of the backward pass;
- activations: with activation checkpointing each layer keeps its bf16 input, split along the sequence
  (b x s x h x 2 / tp bytes), and with selective checkpointing some outputs besides (kept_per_layer);
  without it every layer keeps its whole working set;
- the working set, the larger of one layer's backward and the loss. A layer's backward recomputes its
  activations, b x s x h x 34 / tp bytes with sequence parallelism (Korthikanti et al., "Reducing
  Activation Recomputation in Large Transformer Models", 2022, table 2, without the s^2 attention term
  that SDPA's fused kernels do not keep), and holds its unsharded bf16 gradients and their fp32 copy for
  the reduce-scatter (6 bytes per parameter of the layer). The loss, computed before any layer's
  backward, is that of one chunk of loss_chunk positions over the rank's 1/tp of the vocabulary (b x
  chunk x vocabulary / tp x 14 bytes: the bf16 logits, their fp32 copy and softmax, the gradients) with
  the gradient of the hidden states (b x s x h x 4);
- attention that keeps its scores: Gemma 2's logit softcap is not something SDPA takes, so transformers
  runs it with eager attention, which holds b x heads / tp x s^2 scores through the softcap, the mask,
  the fp32 softmax and their gradients: 15 bytes per score, in the layer's working set;
- 2 GB for the CUDA context and communication buffers, and 10% for the allocator's fragmentation.

The byte counts per element (14 for the loss, 15 per attention score) and the parts above are checked
against torch's own accounting: tests/test_full_profiles.py traces a training step of every pretraining,
continued-pretraining and SFT profile at its layout (fake tensors and a fake process group: nothing is
allocated) under torch.distributed._tools' FSDPMemTracker and asserts this estimate is within 20% of its
peak; benchmarks/fit_memory.py prints both at full depth (docs/recipes.md has the figures).

The GPUs' memory and peak throughput come from clusters/data/accelerators.json (with its sources).
"""

import json
from dataclasses import dataclass, field
from functools import cache

from ..catalog import HARDWARE

GB = 1e9
# Model FLOPs utilisation to plan with until a GPU run here measures one, after torchtitan's published
# figures (github.com/pytorch/torchtitan, docs/performance.md): Llama 3.1 8B with FSDP on 8 or 128 H100s in
# bf16 without Float8, 33% to 39% (the higher with torch.compile per block, as train.py now compiles on
# GPUs; we plan with the lower end until a GPU run here measures it); Llama 3.1 405B
# with FSDP and tensor parallelism on 128 H100s, 29.0%. The expected tokens/s of a launch come from these.
PLANNING_MFU = {"fsdp": 0.33, "fsdp+tp": 0.29}
CONTEXT_BYTES = 2 * GB
FRAGMENTATION = 0.10
LOGIT_BYTES = 14  # per logit of a loss chunk, forward and backward
SCORE_BYTES = 15  # per attention score of eager attention, forward and backward


@cache
def hardware():
    data = json.loads(HARDWARE.read_text())
    for name, gpu in data.items():
        if not name.startswith("_") and not {"memory_gb", "bf16_tflops", "fp8_tflops"} <= set(gpu):
            raise ValueError(f"clusters/data/accelerators.json: {name} lacks memory_gb, bf16_tflops or fp8_tflops")
    return {name: gpu for name, gpu in data.items() if not name.startswith("_")}


def gpu(accelerator_type):
    return hardware().get(accelerator_type)


def peak_tflops(accelerator_type, precision):
    """The GPU's dense peak for the precision a run trains in (fp8 recipes train in bf16 here)."""
    found = gpu(accelerator_type)
    return found["bf16_tflops"] if found else None


@dataclass
class Parameters:
    per_layer: int
    layers: int
    outer: int  # embeddings, output layer and final norm: not tensor-parallel

    @property
    def total(self):
        return self.per_layer * self.layers + self.outer


def parameters(shape, family):
    h, heads = shape["hidden_size"], shape["heads"]
    kv = shape.get("kv_heads", heads)
    head_dim = shape.get("head_dim", h // heads)
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
    mlp = 3 * h * shape["intermediate_size"]
    norms = (4 if family == "gemma" else 2) * h
    vocab = shape.get("vocab_size", 260)
    tied = family == "gemma"  # Gemma shares the input embedding with the output layer; Llama 3.1 does not
    return Parameters(attention + mlp + norms, shape["layers"], vocab * h * (1 if tied else 2) + h)


@dataclass
class Estimate:
    parts: dict = field(default_factory=dict)  # name -> bytes
    capacity: float | None = None  # bytes one GPU has, None on CPU
    gpu_name: str = ""
    tokens_per_s: float | None = None  # per GPU, at the planning MFU; None on CPU
    mfu: float | None = None

    @property
    def total(self):
        return sum(self.parts.values())

    @property
    def fits(self):
        return self.capacity is None or self.total <= self.capacity

    def as_dict(self):
        return {
            "total_gb": round(self.total / GB, 1),
            "capacity_gb": round(self.capacity / GB, 1) if self.capacity else None,
            "gpu": self.gpu_name,
            "fits": self.fits,
            "parts_gb": {name: round(value / GB, 2) for name, value in self.parts.items()},
            "tokens_per_s_per_gpu": round(self.tokens_per_s) if self.tokens_per_s else None,
            "planning_mfu": self.mfu,
        }

    def sentence(self):
        parts = ", ".join(f"{name} {value / GB:.1f}" for name, value in self.parts.items())
        where = f" of the {self.capacity / GB:.0f} GB a {self.gpu_name} has" if self.capacity else ""
        return f"{self.total / GB:.1f} GB per GPU{where} ({parts}; GB)"


def estimate(
    shape, family, *, tensor, data, micro_batch, seq_len, accelerator_type="", checkpointing="selective",
    reference=False,
):  # fmt: skip
    """Bytes per GPU for training `shape` with tensor x data ranks at micro_batch x seq_len tokens; with
    reference=True (DPO) also a frozen reference copy of the model, sharded as the policy is (its fp32
    weights: 4 bytes per parameter over the ranks, no gradients or optimizer states), and micro-batches
    of preference pairs: TRL runs each pair's chosen and rejected sequences as one batch of twice the
    sequences."""
    if reference:
        micro_batch *= 2
    p = parameters(shape, family)
    h, vocab = shape["hidden_size"], shape.get("vocab_size", 260)
    head = vocab * h  # the output layer (tied or not, its gradient is vocab x h)
    # Tensor parallelism splits the decoder layers, and the embedding and the output layer by vocabulary
    # (distributed.tensor_parallel), and the sequence between the blocks (sequence parallelism).
    sharded = p.total / tensor / data
    tokens = micro_batch * seq_len
    layer_working = tokens * h * 34 / tensor
    if shape.get("attn_logit_softcapping"):  # eager attention: the scores exist
        layer_working += SCORE_BYTES * micro_batch * shape["heads"] / tensor * seq_len**2
    # A layer's backward also holds its gradients on their way to the reduce-scatter; the loss comes
    # before any layer's backward.
    layer_backward = layer_working + 6 * p.per_layer / tensor
    loss_working = (
        micro_batch * min(seq_len, shape.get("loss_chunk") or seq_len) * vocab / tensor * LOGIT_BYTES + tokens * h * 4
    )
    parts = {
        "model states": 16 * sharded,
        "gathered weights": 2 * (2 * p.per_layer + p.outer) / tensor,
        "output layer's gradient": 2 * head / tensor,
        "activations": p.layers * kept_per_layer(shape, tokens, tensor, checkpointing, layer_working),
        "working set": max(layer_backward, loss_working),
    }
    if reference:
        parts["reference model"] = 4 * sharded
    parts["context and fragmentation"] = CONTEXT_BYTES + FRAGMENTATION * sum(parts.values())
    found = gpu(accelerator_type)
    if not found:
        return Estimate(parts)
    mfu = PLANNING_MFU["fsdp+tp" if tensor > 1 else "fsdp"]
    tokens_per_s = expected_tokens_per_s(shape, family, seq_len, found["bf16_tflops"], mfu)
    return Estimate(parts, found["memory_gb"] * GB, found["name"], tokens_per_s, mfu)


def kept_per_layer(shape, tokens, tensor, checkpointing, layer_working):
    """Bytes one decoder layer keeps from its forward to its backward pass: with activation checkpointing
    its bf16 input, split along the sequence (b x s x h x 2 / tp); selective checkpointing also keeps the
    outputs of attention and of every other matrix product of the layer (q, v, gate and down: q, v and
    gate column-parallel, split over tp; down's before its reduce-scatter, whole); without checkpointing
    its whole working set."""
    if not checkpointing:
        return layer_working
    h = shape["hidden_size"]
    kept = tokens * h * 2 / tensor
    if checkpointing == "selective":
        heads, kv = shape["heads"], shape.get("kv_heads", shape["heads"])
        head_dim = shape.get("head_dim", h // heads)
        # q, v and gate, and attention's output where a fused kernel makes it (not Gemma 2's eager path)
        attention = 0 if shape.get("attn_logit_softcapping") else heads * head_dim
        split = attention + heads * head_dim + kv * head_dim + shape["intermediate_size"]
        kept += tokens * 2 * (split / tensor + h)
    return kept


def expected_tokens_per_s(shape, family, seq_len, peak_tflops, mfu):
    """Tokens one GPU trains per second at `mfu` of its bf16 peak: the FLOPs per token train.py counts
    for its own MFU (6 x parameters + attention's 12 x layers x hidden x sequence)."""
    from types import SimpleNamespace

    from ..node.train import flops_per_token

    architecture = SimpleNamespace(num_hidden_layers=shape["layers"], hidden_size=shape["hidden_size"])
    return mfu * peak_tflops * 1e12 / flops_per_token(architecture, seq_len, parameters(shape, family).total)
