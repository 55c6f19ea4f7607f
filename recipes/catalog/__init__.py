"""The recipe catalog: one JSON file per recipe in this folder, validated when first loaded, beside
hardware.json (the GPUs' memory and peak throughput, with sources; recipes/runs/fit.py reads it)."""

import json
from functools import cache
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
HARDWARE = FOLDER / "hardware.json"
KINDS = ("pretrain", "cpt", "sft", "rl")
FAMILIES = ("llama", "gemma")
REQUIRED = {
    "id", "name", "family", "size", "kind", "hardware", "parallelism", "batch", "precision",
    "dataset", "checkpoint_every", "throughput_target", "source", "profiles", "architecture",
}  # fmt: skip
TINY = {"hidden_size", "intermediate_size", "layers", "heads", "seq_len", "micro_batch", "lr", "nodes", "steps"}


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


def get_recipe(recipe_id):
    return recipes().get(recipe_id)
