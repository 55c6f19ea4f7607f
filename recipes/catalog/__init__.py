"""The recipe catalog: one JSON file per recipe in this folder, validated when first loaded. The GPUs'
memory and peak throughput (with sources) are the clusters' data: clusters/data/accelerators.json,
which recipes/runs/fit.py reads."""

import json
from functools import cache
from pathlib import Path

from clusters.spec.catalog import ACCELERATORS

FOLDER = Path(__file__).resolve().parent
HARDWARE = ACCELERATORS
KINDS = ("pretrain", "cpt", "sft", "rl")
FAMILIES = ("llama", "gemma")
REQUIRED = {
    "id", "name", "family", "size", "kind", "hardware", "parallelism", "batch", "precision",
    "dataset", "checkpoint_every", "throughput_target", "source", "profiles", "architecture",
}  # fmt: skip
TINY = {"hidden_size", "intermediate_size", "layers", "heads", "seq_len", "micro_batch", "lr", "nodes", "steps"}
# A model's architecture in the catalog's terms: layers, heads and kv_heads are Hugging Face's
# num_hidden_layers, num_attention_heads and num_key_value_heads; every other key is the HF config's own.
ARCHITECTURE = {
    "hidden_size", "intermediate_size", "layers", "heads", "kv_heads", "head_dim", "vocab_size",
    "rope_theta", "rope_scaling", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings",
    "hidden_act", "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping",
    "query_pre_attn_scalar", "sliding_window",
}  # fmt: skip


LOSS_CHUNK = 1024


class CatalogError(ValueError):
    pass


def check(recipe, path):
    missing = REQUIRED - set(recipe)
    if missing:
        raise CatalogError(f"{path.name}: missing {sorted(missing)}")
    if recipe["id"] != path.stem:
        raise CatalogError(f"{path.name}: id {recipe['id']!r} must match the file name")
    if recipe["kind"] not in KINDS or recipe["family"] not in FAMILIES:
        raise CatalogError(f"{path.name}: kind must be one of {KINDS}, family one of {FAMILIES}")
    tiny = recipe["profiles"].get("tiny")
    if not tiny or TINY - set(tiny):
        raise CatalogError(f"{path.name}: the tiny profile needs {sorted(TINY)}")
    if tiny["hidden_size"] % tiny["heads"]:
        raise CatalogError(f"{path.name}: tiny hidden_size must divide by heads")
    hardware = recipe["hardware"]
    # The real profile is the recipe's own hardware, batch and parallelism.
    architecture = recipe["architecture"]
    unknown = set(architecture) - ARCHITECTURE - {"parameters", "source"}
    if unknown:
        raise CatalogError(f"{path.name}: the architecture has fields no model config takes: {sorted(unknown)}")
    if architecture["hidden_size"] % architecture["heads"] and "head_dim" not in architecture:
        raise CatalogError(f"{path.name}: architecture hidden_size must divide by heads, or give head_dim")
    recipe["profiles"]["full"] = {
        **{k: v for k, v in architecture.items() if k != "source"},
        "lr": 3e-4,
        "nodes": hardware["nodes"],
        "gpus_per_node": hardware["gpus_per_node"],
        "ranks_per_node": hardware["gpus_per_node"],  # one rank per GPU
        "tensor": recipe["parallelism"]["tensor"],  # pipeline stages fold into data parallelism
        "global_batch": recipe["batch"]["global_batch"],
        "seq_len": recipe["batch"]["seq_len"],
        "micro_batch": recipe["batch"]["micro_batch"],
        "steps": 1000,
        "checkpoint_every": recipe["checkpoint_every"],
        # The loss over 1,024 positions of the sequence at a time: a 256,000-word vocabulary's logits
        # for 4 x 8,192 tokens would take 84 GB by themselves (recipes/node/train.py chunked_loss).
        # TRL's trainers (RL) compute their own loss.
        "loss_chunk": LOSS_CHUNK if recipe["kind"] != "rl" else None,
    }
    for name, profile in recipe["profiles"].items():
        tensor = profile.get("tensor", 1)
        if profile["heads"] % tensor or profile.get("kv_heads", profile["heads"]) % tensor:
            raise CatalogError(f"{path.name}: the {name} profile's tensor parallelism must divide its heads")
    return recipe


@cache
def recipes():
    """{id: recipe}, sorted by id."""
    return {
        path.stem: check(json.loads(path.read_text()), path)
        for path in sorted(FOLDER.glob("*.json"))
        if path != HARDWARE
    }


def model_shape(profile):
    """The architecture fields of a profile (a tiny one's few, a full one's all): what train.py builds."""
    return {key: profile[key] for key in sorted(ARCHITECTURE) if key in profile}


def get_recipe(recipe_id):
    return recipes().get(recipe_id)
