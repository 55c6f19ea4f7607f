"""Will it fit? The memory one GPU needs to train a recipe on a layout, before anything is submitted.

Per GPU, with FSDP2 over the data-parallel ranks and tensor parallelism inside each decoder layer (the
layout recipes/distributed.py builds; pipeline stages fold into data parallelism):

- model states, sharded over dp (the decoder layers' weights over tp as well): fp32 master weights
  (4 bytes), fp32 gradients (4) and AdamW's two moments (8): 16 bytes per parameter;
- gathered for compute: the bf16 weights and gradients of two decoder layers at a time (FSDP prefetches
  the next) and of the embedding and output layers;
- activations: with activation checkpointing each layer keeps its bf16 input (b x s x h x 2 bytes) and
  one layer at a time recomputes its working set, b x s x h x (10 + 24 / tp) bytes (Korthikanti et al.,
  "Reducing Activation Recomputation in Large Transformer Models", 2022, table 2, without the s^2
  attention term that flash attention does not keep); without checkpointing every layer keeps it;
- the logits: b x s x vocabulary x 10 bytes (bf16 logits, their fp32 copy for the loss, its gradient),
  or b x loss_chunk x vocabulary x 10 when the profile computes the loss loss_chunk positions at a
  time (the full profiles: recipes/node/train.py chunked_loss);
- 2 GB for the CUDA context and communication buffers, and 10% for the allocator's fragmentation.

The GPUs' memory and peak throughput come from clusters/data/accelerators.json (with its sources).
"""

import json
from dataclasses import dataclass, field
from functools import cache

from ..catalog import HARDWARE

GB = 1e9
CONTEXT_BYTES = 2 * GB
FRAGMENTATION = 0.10


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
        }

    def sentence(self):
        parts = ", ".join(f"{name} {value / GB:.1f}" for name, value in self.parts.items())
        where = f" of the {self.capacity / GB:.0f} GB a {self.gpu_name} has" if self.capacity else ""
        return f"{self.total / GB:.1f} GB per GPU{where} ({parts}; GB)"


def estimate(shape, family, *, tensor, data, micro_batch, seq_len, accelerator_type="", checkpointing=True):
    """Bytes per GPU for training `shape` with tensor x data ranks at micro_batch x seq_len tokens."""
    p = parameters(shape, family)
    h, vocab = shape["hidden_size"], shape.get("vocab_size", 260)
    sharded = (p.per_layer * p.layers / tensor + p.outer) / data
    tokens = micro_batch * seq_len
    layer_working = tokens * h * (10 + 24 / tensor)
    parts = {
        "model states": 16 * sharded,
        "gathered weights and gradients": 2 * 2 * (2 * p.per_layer / tensor + p.outer),
        "activations": p.layers * tokens * h * 2 + layer_working if checkpointing else p.layers * layer_working,
        "logits": micro_batch * min(seq_len, shape.get("loss_chunk") or seq_len) * vocab * 10,
    }
    parts["context and fragmentation"] = CONTEXT_BYTES + FRAGMENTATION * sum(parts.values())
    found = gpu(accelerator_type)
    return Estimate(parts, found["memory_gb"] * GB if found else None, found["name"] if found else "")
