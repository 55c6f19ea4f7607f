"""Launching recipes as Slurm jobs.

A launch validates the request against the recipe and the cluster (partition, node count, GPUs, the
memory fit) in the request, then runs as a LAUNCH operation (registered here with the engine; it does
not hold the cluster, so launches run beside each other and beside a scan): stage a registered model
onto the cluster, install the node runtime, resolve the run config recipes/node/train.py reads, render
the sbatch script (the same one a user could submit from the login shell), write both to the cluster's
shared folder and submit, once. Following the job is recipes/runs/follow.py's.
"""

import json
import os
import re
import shlex
import sys
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from django.db import transaction
from django.utils import timezone

from clusters import operations
from clusters import services as clusters
from clusters.choices import ClusterStatus
from clusters.events import record_event
from clusters.slurm import batch
from clusters.spec.validator import ID_RULE, RESOURCE_ID
from clusters.work import Step, as_step_error
from console.errors import Conflict, ConsoleError, FieldErrors
from console.fields import whole_number

from .. import registry
from ..catalog import get_recipe, model_shape, recipes
from ..models import ModelVersion, Run, RunStatus
from ..partitions import gpu_network, partition_shape, smallest_node
from . import fit
from .follow import in_run, latest_checkpoint


def layout_of(recipe, profile, nodes, errors):
    """(ranks per node, tensor, data, accumulation, global batch): one rank per GPU (or per CPU slot of
    the tiny profiles), tensor parallelism from the recipe, the rest data parallel (pipeline stages
    included: recipes/distributed.py), and micro-batches accumulated up to the recipe's global batch."""
    ranks = profile.get("ranks_per_node") or profile.get("gpus_per_node") or 1
    tensor = profile.get("tensor", 1)
    world = nodes * ranks
    heads, kv_heads = profile["heads"], profile.get("kv_heads", profile["heads"])
    if world % tensor or heads % tensor or kv_heads % tensor:
        errors.setdefault("nodes", []).append(
            f"{nodes} node(s) x {ranks} rank(s) cannot split into tensor-parallel groups of {tensor} "
            f"(it must divide the {world} ranks, the {heads} heads and the {kv_heads} key/value heads)"
        )
        return None
    data = world // tensor
    global_batch = profile.get("global_batch") or profile["micro_batch"] * data
    if global_batch % (profile["micro_batch"] * data):
        errors.setdefault("nodes", []).append(
            f"the global batch of {global_batch} sequences does not split into micro-batches of "
            f"{profile['micro_batch']} over {data} data-parallel ranks; choose a node count that divides it"
        )
        return None
    return ranks, tensor, data, global_batch // (profile["micro_batch"] * data), global_batch


def fitting_estimate(recipe, profile, profile_name, *, tensor, data, accelerator):
    """(the memory estimate, the activation checkpointing to train with): GPU pretraining, CPT and SFT keep
    what is dear to recompute (selective checkpointing: less recomputation) where the memory allows it,
    else recompute whole layers, as tiny and RL runs always do. RL runs get no expected throughput."""
    modes = ["selective", True] if profile_name == "full" and recipe["kind"] != "rl" else [True]
    for checkpointing in modes:
        estimate = fit.estimate(
            profile, recipe["family"], tensor=tensor, data=data, micro_batch=profile["micro_batch"],
            seq_len=profile["seq_len"], accelerator_type=accelerator,
            reference=(recipe.get("rl") or {}).get("algorithm") == "dpo", checkpointing=checkpointing,
        )  # fmt: skip
        if estimate.fits:
            break
    if recipe["kind"] == "rl":  # TRL's trainers (and GRPO's generation) are not what the planning MFU measured
        estimate.tokens_per_s = estimate.mfu = None
    return estimate, checkpointing


def reference_accelerator(recipe):
    """The GPU of the recipe's reference machine (its catalog hardware's architecture)."""
    from clusters.spec.catalog import machine_type_info
    from clusters.spec.reference import architectures

    found = architectures().get(recipe["hardware"]["architecture"])
    info = machine_type_info(found.data["machine_type"]) if found else None
    return info.accelerator_type if info else ""


def validate_launch(cluster, data, *, stage=True):
    """The checked launch request, or FieldErrors naming each bad field. With stage=False (a preview)
    nothing is written anywhere: a registered version is read from the registry, not copied."""
    errors = {}
    recipe = get_recipe(data.get("recipe", ""))
    if recipe is None:
        errors["recipe"] = [f"unknown recipe; choose one of: {', '.join(recipes())}"]
    profile_name = data.get("profile") or "tiny"
    profile = recipe["profiles"].get(profile_name) if recipe else None
    if recipe and profile is None:
        errors["profile"] = [f"unknown profile; choose one of: {', '.join(recipe['profiles'])}"]
    default_partition = cluster.partitions.filter(is_default=True).values_list("name", flat=True).first()
    partition = data.get("partition") or default_partition or ""
    shape = partition_shape(cluster, partition)
    if shape is None:
        errors["partition"] = [f"the cluster has no partition '{partition}'"]
    nodes = whole_number(data.get("nodes", profile["nodes"] if profile else 1), "nodes", errors, low=1)
    steps = whole_number(data.get("steps", profile["steps"] if profile else 1), "steps", errors, low=1)
    if shape and nodes is not None and nodes > shape[0]:
        errors.setdefault("nodes", []).append(f"partition '{partition}' has {shape[0]} nodes")
    if shape and profile and profile.get("gpus_per_node", 0) > shape[1]:
        errors.setdefault("profile", []).append(
            f"the {profile_name} profile needs {profile['gpus_per_node']} GPUs per node; "
            f"partition '{partition}' has {shape[1]} (use the tiny profile)"
        )
    init_from = None
    if recipe and recipe["kind"] in ("cpt", "sft", "rl"):
        init_from, problem = checkpoint_source(cluster, recipe, data.get("init_from"), stage)
        if problem:
            errors["init_from"] = [problem]
    if isinstance(init_from, HubFolder) and profile:
        profile = {**profile, **init_from.shape}  # the folder's model is the one trained and laid out
    layout = layout_of(recipe, profile, nodes, errors) if recipe and profile and nodes else None
    estimate, checkpointing = None, True
    if layout and shape:
        _ranks, tensor, data_ranks, _accumulation, _global = layout
        estimate, checkpointing = fitting_estimate(
            recipe, profile, profile_name, tensor=tensor, data=data_ranks, accelerator=shape[2] if shape[1] else ""
        )
        if not estimate.fits:
            errors.setdefault("profile", []).append(
                f"{recipe['name']} on {nodes} node(s) does not fit: it needs {estimate.sentence()}; "
                "use more nodes (a larger data-parallel group shards more of it)"
            )
    register_as = registration(recipe, data, errors) if recipe else None
    alias = alias_option(data, register_as, errors)
    watch = watch_options(data, errors)
    dataset = data.get("dataset") or None  # the page's form sends "" for "the recipe's own"
    if dataset is not None and recipe and not errors:
        problem = dataset_problem(cluster, dataset, recipe["kind"])
        if problem:
            errors["dataset"] = [problem]
    if errors:
        raise FieldErrors(errors)
    ranks, tensor, data_ranks, accumulation, global_batch = layout
    return {
        "cluster": cluster,
        "recipe": recipe,
        "profile_name": profile_name,
        "profile": profile,
        "partition": partition,
        "nodes": nodes,
        "steps": steps,
        "init_from": init_from,
        "ranks_per_node": ranks,
        "gpus_per_node": min(profile.get("gpus_per_node", 0), shape[1]),
        **gpu_job(cluster, partition, ranks, shape[1]),
        "tensor": tensor,
        "data": data_ranks,
        "accumulation": accumulation,
        "global_batch": global_batch,
        "accelerator": shape[2] if shape[1] else "",
        "estimate": estimate.as_dict(),
        "checkpointing": checkpointing,
        "dataset": dataset,
        "register_as": register_as,
        "alias": alias,
        "watch": watch,
    }


def gpu_job(cluster, partition, ranks, gpus):
    """What a GPU run's script needs of its nodes: the GPU network NCCL is set up for, and each rank's
    share of a node's CPUs. Nothing for a run on CPUs."""
    if not gpus:
        return {}
    node = smallest_node(cluster, partition)
    return {"network": gpu_network(cluster, partition), "cpus_per_rank": max(1, node.cpus // ranks) if node else None}


def alias_option(data, register_as, errors):
    """`alias`: the model's alias to move to the version the run registers as (e.g. production, so
    an endpoint that follows it rolls to the new version); only with a registration."""
    alias = (data.get("alias") or "").strip()
    if not alias:
        return ""
    if not registry.ALIAS.match(alias) or alias == "latest":
        errors["alias"] = [registry.ALIAS_RULE]
    elif not register_as and "register" not in errors and "register_as" not in errors:
        errors["alias"] = ["an alias is set on the version the run registers; this run does not register"]
    return alias


def watch_options(data, errors):
    """What the sync watches the run for (recipes/runs/alerts.py): `stall_minutes` without a metrics
    line before an alert (1-1440, default RUN_STALL_MINUTES) and `cancel_on_nonfinite` (default false)."""
    watch = {}
    minutes = data.get("stall_minutes")
    if minutes not in (None, ""):
        if isinstance(minutes, bool) or not str(minutes).isdigit() or not 1 <= int(minutes) <= 1440:
            errors["stall_minutes"] = ["must be a whole number of minutes from 1 to 1440"]
        else:
            watch["stall_minutes"] = int(minutes)
    cancel = str(data.get("cancel_on_nonfinite", "")).strip().lower()
    if cancel not in ("", "true", "false", "1", "0", "yes", "no", "on", "off"):
        errors["cancel_on_nonfinite"] = ["must be true or false"]
    elif cancel in ("true", "1", "yes", "on"):
        watch["cancel_on_nonfinite"] = True
    return watch


def registration(recipe, data, errors):
    """The model a run registers as when it completes: `register_as` (default: the recipe's id as a
    name), unless `register` is false or the recipe opts out (`"register": false` in its catalog entry)."""
    wanted = str(data.get("register", "")).strip().lower()
    if wanted not in ("", "true", "false", "1", "0", "yes", "no", "on", "off"):
        errors["register"] = ["must be true or false"]
        return None
    default = recipe.get("register", True)
    if not (wanted in ("true", "1", "yes", "on") or (wanted == "" and default)):
        return None
    name = (data.get("register_as") or "").strip() or re.sub(r"[^a-z0-9-]+", "-", recipe["id"].lower()).strip("-")
    if not RESOURCE_ID.match(name):
        errors["register_as"] = [ID_RULE]
        return None
    return name


def dataset_problem(cluster, path, kind):
    """Why `path` (a data set in the cluster's shared home) cannot be trained on, or "". Pretraining and
    continued pretraining also read a folder prepared by recipes.node.prepare_data (its index.json)."""
    folders = kind in ("pretrain", "cpt")
    what = "a .jsonl or .parquet file" + (", or a folder prepare_data wrote," if folders else "")
    refused = f"a data set is {what} in the cluster's shared home (a path relative to it)"
    if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
        return refused
    prepared = folders and not path.endswith((".jsonl", ".parquet"))
    if not (prepared or path.endswith((".jsonl", ".parquet"))):
        return refused
    try:
        found = clusters.file_exists(cluster, f"{path.rstrip('/')}/index.json" if prepared else path)
    except ConsoleError as exc:
        return f"it cannot be read: {exc.message}"
    if prepared and not found:
        return (
            f"there is no {path}/index.json in the cluster's shared home: prepare a folder of documents first "
            "(python -m recipes.node.prepare_data SOURCE TARGET), or name a .jsonl or .parquet file"
        )
    return "" if found else f"there is no {path} in the cluster's shared home"


@dataclass(frozen=True)
class HubFolder:
    """A Hugging Face format folder in the cluster's shared home: config.json, safetensors weights and
    a tokenizer (what `save_pretrained` writes); `shape` is its model's, in the catalog's terms."""

    path: str
    shape: dict
    step: int = 0  # a registered version's training step (its tcc.json), which continued pretraining carries on
    version: ModelVersion | None = None  # the registered version it was staged from


HUB_FAMILIES = {"llama": "llama", "gemma": "gemma", "gemma2": "gemma"}  # config.json model_type -> family


def hub_folder(cluster, recipe, path):
    """(HubFolder, problem) for init_from "hf:<folder>"; the folder is read through the cluster agent."""
    path = path.strip("/")
    try:
        if not clusters.file_exists(cluster, f"{path}/config.json"):
            return None, f"there is no {path}/config.json in the cluster's shared home (a Hugging Face format folder)"
        config = json.loads(clusters.read_file(cluster, f"{path}/config.json"))
        weights = clusters.list_files(cluster, path, "*.safetensors")
        tokenizer = clusters.list_files(cluster, path, "tokenizer*.json")
    except (ConsoleError, ValueError) as exc:
        return None, f"{path} cannot be read: {getattr(exc, 'message', exc)}"
    if not weights or not tokenizer:
        return None, f"{path} needs its weights (*.safetensors) and its tokenizer (tokenizer.json)"
    shape, problem = hub_shape(config, recipe, path)
    if problem:
        return None, problem
    step = 0
    try:
        if clusters.file_exists(cluster, f"{path}/tcc.json"):  # a run's export: its step
            step = int(json.loads(clusters.read_file(cluster, f"{path}/tcc.json")).get("step") or 0)
    except (ConsoleError, ValueError, TypeError, AttributeError):
        step = 0
    return HubFolder(path, shape, step), ""


def hub_shape(config, recipe, path):
    """(shape in the catalog's terms, problem) of a Hugging Face config.json's model."""
    family = HUB_FAMILIES.get(config.get("model_type"))
    if family is None:
        return None, f"{path} holds a {config.get('model_type')!r} model; recipes train {', '.join(HUB_FAMILIES)}"
    if family != recipe["family"]:
        return None, f"{path} holds a {family} model; this recipe trains {recipe['family']}"
    heads = config.get("num_attention_heads", 1)
    shape = {
        "hidden_size": config.get("hidden_size"),
        "intermediate_size": config.get("intermediate_size"),
        "layers": config.get("num_hidden_layers"),
        "heads": heads,
        "kv_heads": config.get("num_key_value_heads", heads),
        "vocab_size": config.get("vocab_size"),
        **({"head_dim": config["head_dim"]} if config.get("head_dim") else {}),
    }
    if not all(isinstance(v, int) and v > 0 for v in shape.values()):
        return None, f"{path}/config.json lacks the model's shape (hidden_size, num_hidden_layers, ...)"
    return shape, ""


def registered_source(cluster, recipe, version, stage):
    """(HubFolder, problem) of a registered version: staged onto the cluster when `stage`; a preview
    (stage=False) reads its config.json from the registry and writes nothing anywhere."""
    path = registry.staged_path(version)
    if not stage:
        try:
            config = registry.version_config(version)
        except ConsoleError as exc:
            return None, f"{version.ref} cannot be read from the registry: {exc.message}"
        shape, problem = hub_shape(config, recipe, version.ref)
        return (HubFolder(path, shape, version.step, version) if shape else None), problem
    try:
        path = registry.stage(version, cluster)
    except ConsoleError as exc:
        return None, f"{version.ref} could not be copied onto the cluster: {exc.message}"
    folder, problem = hub_folder(cluster, recipe, path)
    return (replace(folder, version=version) if folder else None), problem


def checkpoint_source(cluster, recipe, source, stage=True):
    """(source, problem): what continued pretraining, SFT or RL starts from (a run id, a registered model
    version "name:vN" or "name@alias", copied from the registry into the cluster's shared home, or a
    Hugging Face format folder "hf:<folder in the shared home>"), or why it cannot."""
    if isinstance(source, str) and source.startswith("hf:"):
        return hub_folder(cluster, recipe, source[3:])
    if isinstance(source, str) and registry.REF.match(source):
        try:
            version = registry.resolve(cluster.project, source)
        except FieldErrors as exc:
            return None, exc.errors["init_from"][0]
        if version.family != recipe["family"]:
            return None, f"{version.ref} is a {version.family} model; this recipe trains {recipe['family']}"
        return registered_source(cluster, recipe, version, stage)
    run = None
    if is_uuid(source):
        run = Run.objects.filter(uuid=source, cluster__project=cluster.project).select_related("cluster").first()
    if run is None:
        what = {"cpt": "continued pretraining", "sft": "fine-tuning", "rl": "RL"}[recipe["kind"]]
        return None, (
            f"{what} starts from a run of this project, a registered model (name:vN or name@alias) or a "
            "Hugging Face format folder (hf:<folder>): give init_from"
        )
    family = get_recipe(run.recipe_id)["family"]
    if family != recipe["family"]:
        return None, f"that checkpoint is a {family} model; this recipe trains {recipe['family']}"
    if run.cluster_id != cluster.pk:
        return kept_source(cluster, run, stage)
    try:
        found = latest_checkpoint(run)
    except ConsoleError as exc:
        return None, f"that run's checkpoints cannot be read: {exc.message}"
    if not found:
        return None, "that run has no checkpoint yet"
    return run, ""


@dataclass(frozen=True)
class KeptCheckpoint:
    """A run's checkpoint that the registry keeps (the run was on another cluster, or on one since
    deleted), staged into this cluster's shared home at `path`."""

    run: Run
    path: str
    step: int


def kept_source(cluster, run, stage):
    """(KeptCheckpoint, problem) for a run of another cluster: its newest checkpoint, kept in the registry
    (registry.keep), copied into this cluster's home when `stage` (a preview reads and writes nothing)."""
    if "step" not in (run.archive or {}):
        return None, registry.not_kept(run)
    if not stage:
        return KeptCheckpoint(run, registry.staged_checkpoint_path(run), run.archive["step"]), ""
    try:
        path, step = registry.stage_checkpoint(run, cluster)
    except ConsoleError as exc:
        return None, f"that run's checkpoint could not be copied onto the cluster from the registry: {exc.message}"
    return KeptCheckpoint(run, path, step), ""


def is_uuid(value):
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def resolve_config(launch, work_dir, runtime):
    recipe, profile = launch["recipe"], launch["profile"]
    config = {
        "recipe": recipe["id"],
        "family": recipe["family"],
        "kind": "pretrain" if recipe["kind"] == "cpt" else recipe["kind"],
        "profile": launch["profile_name"],
        "model": model_shape(profile),  # the whole architecture: vocabulary, RoPE, norms, softcaps
        "seq_len": profile["seq_len"],
        "micro_batch": profile["micro_batch"],
        "parallel": {
            "tensor": launch["tensor"],
            "global_batch": launch["global_batch"],
            "activation_checkpointing": launch.get("checkpointing", True),  # validate_launch's choice
            "loss_chunk": profile.get("loss_chunk"),
            # GPU runs write checkpoints while they train (a 70B's shards take minutes to write), and
            # compile each decoder layer (torchtitan's per-block torch.compile; a CPU run gains nothing
            # for the minute it would spend compiling).
            "async_checkpoint": launch["profile_name"] == "full",
            "compile": "inductor" if launch["profile_name"] == "full" else None,
        },
        "lr": profile.get("lr", 3e-4),
        "steps": launch["steps"],
        "precision": recipe["precision"] if launch["profile_name"] == "full" else "fp32",
        "peak_tflops": fit.peak_tflops(launch["accelerator"], recipe["precision"]) if launch["accelerator"] else None,
        "estimate": launch["estimate"],
        "checkpoint_every": profile.get("checkpoint_every", recipe["checkpoint_every"]),
        "seed": 7,
        "data_seed": 1234,
        "output_dir": str(work_dir),
        "log_every": 10,
    }
    if launch["dataset"]:
        config["dataset"] = f"{clusters.shared_dir(launch['cluster'])}/{launch['dataset']}"
    elif recipe["kind"] in ("sft", "rl"):
        config["dataset"] = f"{runtime.folder}/{recipe['dataset']}"  # shipped with the nodes' runtime
    config.update(recipe.get("rl") or {})  # the RL algorithm (dpo, grpo) and GRPO's reward
    if launch["register_as"]:
        config["register_as"] = launch["register_as"]  # the console's; train.py does not read it
    if launch.get("alias"):
        config["alias"] = launch["alias"]  # moved to the registered version (registry/versions.py)
    if isinstance(launch["init_from"], HubFolder):
        folder = launch["init_from"]
        config["init_from_hf"] = f"{clusters.shared_dir(launch['cluster'])}/{folder.path}"
        config["model"] = folder.shape
        if folder.version is not None:
            config["init_from_ref"] = folder.version.ref
        if recipe["kind"] == "cpt" and folder.step:  # a run's export carries on its step count too
            config.update(steps=folder.step + launch["steps"], continue_steps=True, init_step=folder.step)
    elif launch["init_from"] is not None:
        if isinstance(launch["init_from"], KeptCheckpoint):
            kept = launch["init_from"]
            checkpoint, saved = f"{clusters.shared_dir(launch['cluster'])}/{kept.path}", kept.step
        else:
            checkpoint, saved = latest_checkpoint(launch["init_from"])
        config["init_from"] = str(checkpoint)
        if recipe["kind"] == "cpt":  # continued pretraining carries on the step count: `steps` more
            config.update(steps=saved + launch["steps"], continue_steps=True)
    return config


def offline_config(recipe_id, work_dir, *, profile_name="full", profile=None, layers=None, steps=10):
    """(train.py's config, ranks) for a catalog profile on its own layout, resolved as a launch would but
    without a cluster (no dataset of the user's, no init_from, nothing staged or written): what the memory
    trace (`python -m recipes.node.memory CONFIG --ranks N`), the benchmarks and the catalog's tests
    build models from. `profile` replaces the catalog's; `layers`, its number of decoder layers."""
    recipe = get_recipe(recipe_id)
    if recipe is None:
        raise FieldErrors({"recipe": [f"unknown recipe; choose one of: {', '.join(recipes())}"]})
    if profile is None and profile_name not in recipe["profiles"]:
        raise FieldErrors({"profile": [f"unknown profile; choose one of: {', '.join(recipe['profiles'])}"]})
    profile = profile or recipe["profiles"][profile_name]
    if layers is not None:
        profile = {**profile, "layers": layers}
    ranks = profile["nodes"] * (profile.get("ranks_per_node") or profile.get("gpus_per_node") or 1)
    tensor = profile.get("tensor", 1)
    _estimate, checkpointing = fitting_estimate(recipe, profile, profile_name, tensor=tensor, data=ranks // tensor,
                                                accelerator=reference_accelerator(recipe))  # fmt: skip
    plan = {
        "recipe": recipe, "profile": profile, "profile_name": profile_name, "tensor": tensor,
        "global_batch": profile.get("global_batch") or profile["micro_batch"] * ranks, "steps": steps,
        "accelerator": None, "estimate": None, "dataset": None, "register_as": None, "init_from": None,
        "cluster": None, "checkpointing": checkpointing,
    }  # fmt: skip
    return resolve_config(plan, work_dir, SimpleNamespace(folder=str(work_dir))), ranks


def render_script(run_name, launch, work_dir, runtime):
    """The sbatch script: one task per GPU (or per CPU rank of a tiny profile), requeued on node failure,
    output appended across requeues; it starts the console's training entry point from the runtime in
    the cluster's home."""
    cache = work_dir / ".cache"
    gpus = launch["gpus_per_node"]
    return batch.render(
        {
            "job-name": run_name,
            "partition": launch["partition"],
            "nodes": launch["nodes"],
            "ntasks-per-node": launch["ranks_per_node"],
            "gpus-per-node": gpus or None,
            # A GPU run takes its nodes whole, as Google's examples do: every GPU, NIC and byte of memory
            # (--mem=0), and its share of the CPUs per rank for the data loader and NCCL's proxy threads.
            "exclusive": bool(gpus) or None,
            "mem": "0" if gpus else None,
            "cpus-per-task": launch.get("cpus_per_rank") if gpus else None,
            "output": f"{work_dir}/slurm-%j.out",
            "open-mode": "append",
            "requeue": True,
        },
        # The job runs as its user's account: caches go in the run's folder, not a home it may lack.
        environment={"XDG_CACHE_HOME": cache, "HF_HOME": cache / "huggingface"},
        folder=runtime.folder,
        body=[
            *batch.nccl_lines(launch.get("network", "")),
            f"srun {shlex.quote(runtime.python)} -m recipes.node.train {shlex.quote(str(work_dir / 'config.json'))}",
        ],
    )


def preview(cluster, data):
    """(launch, script) without submitting: what the launch page shows before Submit."""
    launch = validate_launch(cluster, data, stage=False)
    try:
        work_dir = run_dir(cluster, "<run-id>")
        runtime = clusters.node_runtime(cluster, installed=False)
    except ConsoleError as exc:
        raise FieldErrors({"cluster": [exc.message]}) from None
    return launch, render_script(f"{launch['recipe']['id']}", launch, work_dir, runtime)


def run_dir(cluster, run_id):
    return Path(clusters.shared_dir(cluster)) / "runs" / str(run_id)


def interpreter_problem():
    """Why users' accounts could not start this console's Python (a run runs as its user), or ""."""
    real = Path(os.path.realpath(sys.executable))
    blocked = [p for p in [*reversed(real.parents), real] if not os.stat(p).st_mode & 0o001]
    if blocked:
        return (
            f"runs start {sys.executable} as the user's own account, but {blocked[0]} is closed to other "
            "accounts; rebuild the virtualenv from a Python every account can reach (scripts/bootstrap.sh "
            "uses /usr/bin/python3)"
        )
    return ""


def launch_run(*, cluster, data, user=None):
    """Check a launch and start it: the Run row (SUBMITTING) and a LAUNCH operation that stages its model,
    installs the node runtime, writes its files and submits it (launch_steps). Bad fields are FieldErrors
    here, before anything is written; the request does no round trip that writes to the cluster."""
    problem = interpreter_problem() if user is not None else ""
    if problem:
        raise Conflict(f"Cannot launch on this console: {problem}")
    if not cluster.is_usable:
        raise Conflict(
            f"Cluster '{cluster.name}' is {cluster.get_status_display().lower()}; runs start on a ready cluster"
        )
    launch = validate_launch(cluster, data, stage=False)
    with transaction.atomic():
        run = Run.objects.create(
            cluster=cluster,
            recipe_id=launch["recipe"]["id"],
            profile=launch["profile_name"],
            partition=launch["partition"],
            nodes=launch["nodes"],
            steps=launch["steps"],
            config={},
            status=RunStatus.SUBMITTING,
            init_from=source_run(launch["init_from"]),
            init_version=launch["init_from"].version if isinstance(launch["init_from"], HubFolder) else None,
            created_by=user,
            watch=launch["watch"],
        )
        run.launch = operations.start(
            cluster,
            LAUNCH,
            message=f"Launching {run.recipe_id} ({run.profile}) for {user or 'system'}",
            user=user,
            params={"run": str(run.uuid), "request": data},
        )
        run.save(update_fields=["launch"])
    return run


def source_run(init_from):
    """The run a launch starts from (its checkpoint on this cluster or kept in the registry), or None."""
    if isinstance(init_from, KeptCheckpoint):
        return init_from.run
    return init_from if isinstance(init_from, Run) else None


# The operation kind: its steps, each idempotent (a resumed launch runs them all again).

LAUNCH = "LAUNCH"


def run_of(ctx):
    return Run.objects.select_related("cluster__project").get(uuid=ctx.params["run"])


def check_and_stage(ctx):
    """The request checked again as the cluster is now, with a registered version copied onto it."""
    try:
        ctx.launch = validate_launch(ctx.cluster, ctx.params["request"])
    except ConsoleError as exc:
        raise as_step_error(exc) from None


def install_runtime(ctx):
    try:
        ctx.runtime = clusters.node_runtime(ctx.cluster)
    except ConsoleError as exc:
        raise as_step_error(exc) from None


def write_files(ctx):
    run = run_of(ctx)
    try:
        work_dir = run_dir(ctx.cluster, run.uuid)
    except ConsoleError as exc:
        raise as_step_error(exc) from None
    run.work_dir = str(work_dir)
    run.config = resolve_config(ctx.launch, work_dir, ctx.runtime)
    run.script = render_script(job_name(run), ctx.launch, work_dir, ctx.runtime)
    try:
        clusters.write_file(ctx.cluster, in_run(run, "config.json"), json.dumps(run.config, indent=2))
        clusters.write_file(ctx.cluster, in_run(run, "job.sbatch"), run.script)
    except ConsoleError as exc:
        raise as_step_error(exc) from None
    Run.objects.filter(pk=run.pk).update(work_dir=run.work_dir, config=run.config, script=run.script)


def job_name(run):
    return f"{run.recipe_id}-{str(run.uuid)[:8]}"


def submit(ctx):
    """Submit the job once. Its id is stored as soon as Slurm gives it; a launch resumed after its worker
    died between Slurm's answer and that write finds the job by its name in Slurm's queue instead of
    submitting it again."""
    run = run_of(ctx)
    if run.slurm_job_id is not None:
        return
    try:
        found = clusters.jobs_named(ctx.cluster, job_name(run)) if ctx.attempt > 1 else []
        job_id = (
            found[0].job_id
            if found
            else clusters.submit_batch(ctx.cluster, in_run(run, "job.sbatch"), user=ctx.operation.created_by)
        )
    except ConsoleError as exc:
        raise as_step_error(exc) from None
    Run.objects.filter(pk=run.pk, slurm_job_id__isnull=True).update(slurm_job_id=job_id)


def launch_steps(ctx):
    return [
        Step("Check the launch and stage its model", check_and_stage),
        Step("Install the node runtime", install_runtime),
        Step("Write the run's config and script", write_files),
        Step("Submit the job to Slurm", submit),
    ]


def submitted(ctx):
    run = run_of(ctx)
    if run.set_status(RunStatus.QUEUED, expected=[RunStatus.SUBMITTING]):
        record_event(
            run.cluster,
            f"Run {run.recipe_id} ({run.profile}) submitted as Slurm job {run.slurm_job_id} by "
            f"{ctx.operation.created_by or 'system'}",
            operation=ctx.operation,
        )


def not_submitted(ctx, message):
    run = run_of(ctx)
    run.set_status(RunStatus.FAILED, expected=[RunStatus.SUBMITTING], error=message[:2000], finished=timezone.now())


operations.register(
    operations.Kind(
        name=LAUNCH,
        label="Recipe launch",
        metadata_type="GenericOperationMetadata",
        starts_from=frozenset(ClusterStatus.usable()),
        steps=launch_steps,
        on_success=submitted,
        on_failure=not_submitted,
        response="empty",
        exclusive=False,
    )
)
