"""The training entry point itself (recipes/node/train.py with recipes/node/distributed.py), run as the nodes run it
but started with torchrun on this machine: a 2x2 mesh (FSDP2 x tensor parallel) over gloo trains to the
same loss as one rank with the same global batch, its DCP checkpoints resume bit-exactly and load at
another world size, and GRPO raises the reward of the shipped task. Persona: tomas, who writes recipes.
The fit check (recipes/runs/fit.py) refuses what cannot fit before anything is submitted."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from recipes.catalog import get_recipe
from recipes.runs import fit

from .factories import losses, train_on_ranks

ROOT = Path(settings.BASE_DIR)


def config(folder, family="llama", **changes):
    values = {
        "recipe": "test", "family": family, "kind": "pretrain", "profile": "tiny",
        "model": {"hidden_size": 64, "intermediate_size": 172, "layers": 2, "heads": 4, "kv_heads": 2},
        "seq_len": 64, "micro_batch": 4, "lr": 3e-3, "steps": 12, "precision": "fp32", "checkpoint_every": 6,
        "seed": 7, "data_seed": 1234, "output_dir": str(folder), "log_every": 6,
        "parallel": {"tensor": 2, "global_batch": 16, "activation_checkpointing": True},
    }  # fmt: skip
    for key, value in changes.items():
        if key in ("tensor", "global_batch", "async_checkpoint", "activation_checkpointing", "loss_chunk", "compile"):
            values["parallel"][key] = value
        else:
            values[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def train(folder, ranks=1):
    return train_on_ranks(folder, ranks)


def test_a_run_told_not_to_keep_its_last_step_saves_and_exports_nothing(tmp_path):
    """A speed benchmark's 8B run would write a 96 GB checkpoint and a 32 GB export it never reads."""
    result = train(config(tmp_path / "bench", tensor=1, steps=3, checkpoint_every=100, final_checkpoint=False))
    assert result["step"] == 3 and len(losses(tmp_path / "bench")) == 3
    assert not list((tmp_path / "bench" / "checkpoints").glob("step-*")) and not (tmp_path / "bench" / "model").exists()


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_a_2x2_mesh_trains_to_the_loss_of_one_rank_with_the_same_global_batch(tmp_path, family):
    """FSDP2 x tensor (and sequence) parallel on four CPU ranks. Gemma trains as the full profiles do on GPUs:
    the loss in chunks, selective activation checkpointing and every decoder layer compiled (aot_eager here:
    dynamo's capture and AOTAutograd's joint graph as inductor takes them, without generating C++; inductor
    on one CPU rank gives the same losses to 1e-6 but takes 17 s for two layers; Gemma's alternating
    sliding-window layers compile to two graphs). Llama runs the plain mesh."""
    one = train(config(tmp_path / "one", family, tensor=1))
    gpu_like = {"activation_checkpointing": "selective", "loss_chunk": 16, "compile": "aot_eager"}
    four = train(config(tmp_path / "four", family, **(gpu_like if family == "gemma" else {})), ranks=4)
    assert (four["world"], four["tensor"], four["data"], four["accumulation"]) == (4, 2, 2, 2)
    assert (one["world"], one["accumulation"]) == (1, 4)
    for a, b in zip(losses(tmp_path / "one"), losses(tmp_path / "four"), strict=True):
        assert abs(a - b) < 1e-4
    assert abs(one["final_loss"] - four["final_loss"]) < 1e-4
    assert losses(tmp_path / "four")[-1] < losses(tmp_path / "four")[0]
    # The log holds the training lines, not warnings of ours repeated by every rank (the run page
    # showed mostly those): checkpointing with a KV cache on, a deprecated call, two collectives where
    # one does over the 2-D mesh, the export's single-process load and its progress bar.
    log = (tmp_path / "four" / "run.log").read_text()
    for noise in ("Warning", "use_cache=True", "While redistributing", "Writing model shards"):
        assert noise not in log, log
    assert log.count("[train] step") == 2  # every log_every (6) of 12 steps


def test_a_sharded_checkpoint_resumes_bit_exactly_and_loads_on_another_world_size(tmp_path):
    whole = train(config(tmp_path / "whole"), ranks=4)
    step6 = tmp_path / "whole" / "checkpoints" / "step-6"
    assert sorted(p.name for p in step6.glob("__*_0.distcp")) == [f"__{r}_0.distcp" for r in range(4)]  # sharded
    assert json.loads((step6 / "meta.json").read_text()) == {"step": 6, "position": 6, "world": 4, "tp": 2,
                                                              "format": "dcp"}  # fmt: skip
    for name, ranks in (("again", 4), ("smaller", 2)):
        folder = config(tmp_path / name)
        shutil.copytree(step6, folder / "checkpoints" / "step-6")  # as if killed after step 6, then requeued
        result = train(folder, ranks=ranks)
        resumed = json.loads((folder / "events.jsonl").read_text().splitlines()[0])
        assert (resumed["event"], resumed["step"], resumed["from_world"]) == ("resumed", 6, 4)
        if name == "again":  # the same layout: every rank's RNG state too, so exactly the same run
            assert resumed["resharded"] is False
            assert result["final_loss"] == whole["final_loss"]
        else:  # 4 ranks' shards on 2 ranks (DCP reshards), the same data and batch: the same loss
            assert resumed["resharded"] is True and result["world"] == 2
            assert abs(result["final_loss"] - whole["final_loss"]) < 1e-4
    assert not list((tmp_path / "whole" / "checkpoints").glob(".tmp-*"))  # written atomically


def test_an_asynchronous_save_trains_as_a_blocking_one_and_resumes_bit_exactly(tmp_path):
    """The full profiles' saves are written while training goes on (dcp.async_save over a gloo group of
    their own): the same steps, whole step-N folders once the run ends, and one resumes exactly."""
    changes = {"steps": 8, "checkpoint_every": 4, "log_every": 4}
    blocking = train(config(tmp_path / "blocking", **changes), ranks=2)
    behind = train(config(tmp_path / "behind", async_checkpoint=True, **changes), ranks=2)
    assert losses(tmp_path / "behind") == losses(tmp_path / "blocking")
    assert behind["final_loss"] == blocking["final_loss"]
    saved = [json.loads(line) for line in (tmp_path / "behind" / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"], e["asynchronous"]) for e in saved] == [("checkpoint_saved", 4, True),
                                                                           ("checkpoint_saved", 8, True)]  # fmt: skip
    kept = tmp_path / "behind" / "checkpoints"
    assert sorted(p.name for p in kept.iterdir()) == ["step-4", "step-8"]  # renamed whole, no .tmp left
    assert json.loads((kept / "step-4" / "meta.json").read_text())["position"] == 4
    again = config(tmp_path / "again", **changes)
    shutil.copytree(kept / "step-4", again / "checkpoints" / "step-4")  # as if killed after step 4
    assert train(again, ranks=2)["final_loss"] == blocking["final_loss"]


def test_selective_checkpointing_trains_to_the_losses_of_whole_layer_checkpointing(tmp_path):
    """Keeping some activations instead of recomputing them changes no number (one rank; the 2 x 2 mesh test
    above trains with it)."""
    whole = train(config(tmp_path / "whole", tensor=1, steps=6))
    kept = train(config(tmp_path / "kept", tensor=1, steps=6, activation_checkpointing="selective"))
    assert losses(tmp_path / "kept") == losses(tmp_path / "whole") and kept["final_loss"] == whole["final_loss"]


def test_an_asynchronous_save_returns_before_its_folder_is_written_and_finish_makes_it_whole(tmp_path):
    import torch

    from recipes.node import distributed

    model = torch.nn.Linear(512, 512)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 512)).sum().backward()
    optimizer.step()
    saver = distributed.Checkpointer(tmp_path, distributed.Layout(0, 1, 0, 1, 1, 0), asynchronous=True)
    saver.save(3, model, optimizer, {"position": 3})
    step, folder, _, _, writing = saver.pending
    assert (step, folder.name) == (3, ".tmp-step-3") and not (tmp_path / "step-3").exists()
    saver.finish()
    assert writing.done() and saver.pending is None and not folder.exists()
    assert json.loads((tmp_path / "step-3" / "meta.json").read_text())["step"] == 3
    assert list((tmp_path / "step-3").glob("*.distcp"))


def test_grpo_raises_the_mean_reward_of_the_shipped_task(tmp_path):
    pretrained = train(config(tmp_path / "pre", tensor=1, steps=60, checkpoint_every=60))
    assert pretrained["step"] == 60
    recipe = get_recipe("llama3.1-8b-grpo")
    grpo = config(
        tmp_path / "grpo", kind="rl", steps=60, lr=1e-2, micro_batch=8, global_batch=8,
        dataset=str(ROOT / recipe["dataset"]), init_from=str(tmp_path / "pre" / "checkpoints" / "step-60"),
        **recipe["rl"],
    )  # fmt: skip
    train(grpo)
    rewards = [json.loads(line)["reward"] for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    assert len(rewards) == 60
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, rewards
    assert json.loads((grpo / "checkpoints" / "step-60" / "meta.json").read_text())["format"] == "dcp"


def test_dpo_on_two_ranks_has_the_losses_and_weights_of_one_rank_with_the_same_global_batch(tmp_path):
    """RL trains on every rank of its layout (it ran on rank 0 alone, the other ranks exiting, so an 8B
    policy and its reference had to fit one GPU): each rank takes half of every global batch."""
    import torch

    from recipes.node import distributed
    from recipes.node.train import build_model

    recipe = get_recipe("llama3.1-8b-dpo")
    changes = {"kind": "rl", "steps": 4, "log_every": 1, "lr": 1e-3, "tensor": 1, "global_batch": 8,
               "dataset": str(ROOT / recipe["dataset"]), **recipe["rl"]}  # fmt: skip
    one = train(config(tmp_path / "one", micro_batch=8, **changes))
    two = train(config(tmp_path / "two", micro_batch=4, **changes), ranks=2)
    assert (one["world"], two["world"]) == (1, 2)
    assert len(losses(tmp_path / "two")) == 4  # rank 0 writes the metrics, once a step
    for a, b in zip(losses(tmp_path / "one"), losses(tmp_path / "two"), strict=True):
        assert abs(a - b) < 1e-4
    assert losses(tmp_path / "two")[-1] < losses(tmp_path / "two")[0]
    # The checkpoint rank 0 writes from the gathered weights is the one-rank run's.
    weights = []
    for folder in ("one", "two"):
        model = build_model(json.loads((tmp_path / folder / "config.json").read_text()))
        assert distributed.load_weights(tmp_path / folder / "checkpoints" / "step-4", model) == 4
        weights.append(model.state_dict())
    for name, value in weights[0].items():
        assert torch.allclose(value, weights[1][name], atol=1e-5), name
    assert (tmp_path / "two" / "model" / "model.safetensors").exists()
    log = (tmp_path / "two" / "run.log").read_text()
    assert "[train] dpo on 2 rank(s), 1 micro-batch(es) of 4 per rank a step" in log
    for noise in ("is deprecated", "examples/s", "find_unused_parameters"):
        assert noise not in log, log


def test_grpo_generates_and_trains_on_two_ranks(tmp_path):
    recipe = get_recipe("llama3.1-8b-grpo")
    grpo = config(
        tmp_path / "grpo", kind="rl", steps=3, log_every=1, tensor=1, micro_batch=4, global_batch=8,
        dataset=str(ROOT / recipe["dataset"]), **recipe["rl"],
    )  # fmt: skip
    assert train(grpo, ranks=2)["world"] == 2
    lines = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3] and all(0 <= line["reward"] <= 1 for line in lines)
    assert (grpo / "checkpoints" / "step-3" / "meta.json").exists()


@pytest.mark.parametrize("recipe_id", ["gemma2-2b-dpo", "gemma2-2b-grpo"])
def test_gemma_takes_preference_and_reward_tuning_from_its_pretrained_checkpoint(tmp_path, recipe_id):
    """The catalog's Gemma RL recipes (tied embeddings, softcapped logits) run TRL's trainers from a
    Gemma checkpoint as the Llama ones do: each step logged, a checkpoint and the export written."""
    recipe = get_recipe(recipe_id)
    tiny = recipe["profiles"]["tiny"]
    shape = {k: tiny[k] for k in ("hidden_size", "intermediate_size", "layers", "heads", "kv_heads")}
    train(config(tmp_path / "pre", "gemma", model=shape, tensor=1, steps=6, checkpoint_every=6))
    tuned = config(
        tmp_path / "rl", "gemma", kind="rl", model=shape, steps=4, checkpoint_every=4, log_every=1,
        micro_batch=tiny["micro_batch"], global_batch=tiny["micro_batch"], dataset=str(ROOT / recipe["dataset"]),
        init_from=str(tmp_path / "pre" / "checkpoints" / "step-6"), **recipe["rl"],
    )  # fmt: skip
    train(tuned)
    lines = [json.loads(line) for line in (tuned / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    assert all(math.isfinite(line["loss"]) for line in lines)
    assert (tuned / "checkpoints" / "step-4" / "meta.json").exists() and (tuned / "model" / "config.json").exists()
    assert json.loads((tuned / "model" / "config.json").read_text())["model_type"] == "gemma2"


def test_the_fit_check_refuses_70b_on_one_a3_ultra_node_and_takes_the_catalogs_layout():
    recipe = get_recipe("llama3.1-70b-pretrain")
    full = recipe["profiles"]["full"]
    assert (full["tensor"], full["ranks_per_node"], full["nodes"]) == (4, 8, 4)

    def on(nodes):
        ranks = nodes * full["ranks_per_node"]
        return fit.estimate(full, "llama", tensor=full["tensor"], data=ranks // full["tensor"],
                            micro_batch=1, seq_len=8192, accelerator_type="NVIDIA_H200_141GB")  # fmt: skip

    one, layout = on(1), on(4)
    assert fit.parameters(full, "llama").total == pytest.approx(70.55e9, rel=1e-3)  # the published 70B
    assert not one.fits and one.total > 141e9 and one.parts["model states"] > 141e9
    assert layout.fits and layout.total < 141e9
    assert one.sentence().startswith(f"{one.total / 1e9:.1f} GB per GPU of the 141 GB a H200 141GB has")


@pytest.mark.django_db
def test_a_launch_that_cannot_fit_is_refused_with_the_numbers(alpha, alice, settings, client):
    """On a gce cluster of A3 Ultra nodes (provisioned: nothing runs here), 70B on one node is a 400."""
    from clusters import services
    from clusters.spec.reference import build_spec
    from console.errors import FieldErrors
    from recipes import runs

    from .conftest import provisioned

    settings.GCE_REACH_CLUSTERS = False
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    spec = build_spec("a3-ultra", display_name="ultra", zone="us-central1-b", nodes=4, backend="gce")
    cluster = services.create_cluster(project=alpha, name="ultra", spec=spec, user=alice).cluster
    provisioned(pk=cluster.pk)
    body = {"recipe": "llama3.1-70b-pretrain", "profile": "full", "partition": "a3ultra"}
    with pytest.raises(FieldErrors) as refused:
        runs.validate_launch(cluster, {**body, "nodes": 1})
    (message,) = refused.value.errors["profile"]
    assert message.startswith("Llama 3.1 70B pretraining on 1 node(s) does not fit: it needs 164.9 GB per GPU")
    assert "of the 141 GB a H200 141GB has" in message
    launch = runs.validate_launch(cluster, {**body, "nodes": 4})
    assert (launch["ranks_per_node"], launch["tensor"], launch["data"], launch["accumulation"]) == (8, 4, 8, 16)
    assert (
        launch["estimate"]["fits"] and launch["estimate"]["total_gb"] == 76.9
    )  # the loss in chunks of vocabulary-split logits: 0.3 GB, not 11.8; the sequence split between blocks
    # Its throughput to expect, at torchtitan's published MFU for a tensor-parallel Llama 3.1 (29%): about
    # 588 tokens/s per H200; the run page sets it beside what the run measures (16,000 over 32 GPUs).
    assert (launch["estimate"]["tokens_per_s_per_gpu"], launch["estimate"]["planning_mfu"]) == (588, 0.29)
    from django.urls import reverse

    from recipes.models import Run, RunMetric

    config = {"parallel": {"tensor": 4, "global_batch": 128}, "micro_batch": 1, "estimate": launch["estimate"]}
    run = Run.objects.create(cluster=cluster, recipe_id=body["recipe"], profile="full", partition="a3ultra", nodes=4,
                             steps=10, config=config, script="", work_dir="/home/runs/x")  # fmt: skip
    RunMetric.objects.create(run=run, line=1, step=1, values={"step": 1, "loss": 11.0, "tokens_per_s": 16000.0})
    client.force_login(alice)
    page = client.get(reverse("run-detail", args=["alpha", "ultra", run.uuid])).content.decode()
    assert "500 measured · about 588 expected at 29% MFU (torchtitan's published figures)" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("architecture", "recipe_id", "nodes", "cpus", "network"),
    [
        ("a3-ultra", "llama3.1-8b-pretrain", 2, 28, [
            "source /usr/local/gib/scripts/set_nccl_env.sh", "export NCCL_NET=gIB",
            "export NCCL_SOCKET_IFNAME=enp0s19,enp192s20"]),
        ("a3-mega", "gemma2-2b-pretrain", 1, 26, [
            "NCCL_LIB_DIR=/var/lib/tcpxo/lib64 source /var/lib/tcpxo/lib64/nccl-env-profile.sh",
            "export NCCL_FASTRAK_CTRL_DEV=enp0s12", "export NCCL_SOCKET_IFNAME=enp0s12"]),
    ],
)  # fmt: skip
def test_a_gpu_runs_script_takes_whole_nodes_and_sets_nccl_up_for_the_machines_network(
    alpha, alice, settings, tmp_path, architecture, recipe_id, nodes, cpus, network
):
    """A full-size run's script as Google's Slurm examples write theirs: whole nodes, all their memory,
    each rank's share of the CPUs, and NCCL pointed at the machine type's GPU network and plugin (gIB
    for RDMA on A3 Ultra, GPUDirect-TCPXO on A3 Mega). Without them NCCL ran over the system NIC's TCP."""
    from types import SimpleNamespace

    from clusters import services
    from clusters.spec.reference import build_spec
    from recipes import runs
    from recipes.runs.launch import render_script

    from .conftest import provisioned

    settings.GCE_REACH_CLUSTERS = False
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    spec = build_spec(architecture, display_name="big", zone="us-central1-b", nodes=nodes, backend="gce")
    cluster = services.create_cluster(project=alpha, name="big", spec=spec, user=alice).cluster
    provisioned(pk=cluster.pk)
    launch = runs.validate_launch(cluster, {"recipe": recipe_id, "profile": "full", "nodes": nodes}, stage=False)
    runtime = SimpleNamespace(python="/opt/tcc/venv/bin/python", folder=str(tmp_path))
    script = render_script("run", launch, tmp_path, runtime)
    for directive in ("--exclusive", "--mem=0", f"--cpus-per-task={cpus}", "--gpus-per-node=8", "--ntasks-per-node=8"):
        assert f"#SBATCH {directive}\n" in script
    prelude = script[: script.index("srun ")]
    assert all(line in prelude for line in network), prelude
    # The prelude runs under the script's strict mode: on a node without the plugin it says so and goes on.
    lines = prelude.splitlines()
    after = lines[lines.index("set -euo pipefail") + 1 :]
    runnable = "\n".join(["set -euo pipefail", *after, "env | grep -E '^(NCCL_|LD_LIBRARY_PATH)' | sort"])
    done = subprocess.run(
        ["bash", "-c", runnable], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}
    )
    assert done.returncode == 0, done.stderr
    assert "NCCL uses TCP sockets" in done.stderr
    exported = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert exported["NCCL_SOCKET_IFNAME"] == network[-1].split("=", 1)[1]
    assert exported["LD_LIBRARY_PATH"].startswith(("/usr/local/gib/lib64:", "/var/lib/tcpxo/lib64:"))


def test_padding_never_counts_as_tokens_read():
    """SFT pads each example to the sequence length; tokens/s (and MFU from it) counted the padding."""
    from recipes.node import train as node

    tokenizer = node.ByteTokenizer()
    examples = [{"prompt": "Name a colour", "response": "blue"}, {"prompt": "Hi", "response": "hello there"}]
    _, x, _ = next(node.sft_batches(examples, tokenizer, 64, 2, 0))
    # BOS and the prompt, the response, its EOS: each example's real tokens; the rest of its 64 is padding.
    lengths = [len(node.sft_prompt(tokenizer, e["prompt"])) + len(e["response"].encode()) + 1 for e in examples]
    assert node.tokens_read("sft", x, tokenizer) == sum(lengths) < x.numel() == 2 * 64
    assert node.tokens_read("pretrain", x, tokenizer) == x.numel()


def test_a_hugging_face_folder_starts_a_run_exactly_as_the_checkpoint_it_was_exported_from(tmp_path):
    pretrained = config(tmp_path / "pre", tensor=1, steps=20, checkpoint_every=20)
    train(pretrained)
    checkpoint, folder = pretrained / "checkpoints" / "step-20", tmp_path / "hub" / "tiny-llama"
    # Every run exports its final model in this format by itself (what the registry stores), with its step.
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (pretrained / "model").iterdir()}
    assert json.loads((pretrained / "model" / "tcc.json").read_text())["step"] == 20
    command = [sys.executable, "-m", "recipes.node.train", str(pretrained / "config.json")]
    exported = subprocess.run(
        [*command, "--export", str(checkpoint), str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    dataset = str(ROOT / "recipes" / "node" / "data" / "instructions.jsonl")
    runs = {}
    for name, start in (
        ("from-checkpoint", {"init_from": str(checkpoint)}),
        ("from-folder", {"init_from_hf": str(folder)}),
    ):
        runs[name] = config(tmp_path / name, kind="sft", seq_len=96, steps=4, dataset=dataset, **start)
        train(runs[name], ranks=4)
    first = {name: losses(path)[0] for name, path in runs.items()}
    assert abs(first["from-checkpoint"] - first["from-folder"]) < 1e-5, first  # the same weights, the same tokens
    kept = runs["from-folder"] / "checkpoints" / "step-4"
    assert json.loads((kept / "config.json").read_text())["model_type"] == "llama"  # it keeps its architecture
    assert (kept / "tokenizer.json").exists()


class Payload:
    """What mallory's job can pickle into a checkpoint of hers that a colleague continues from."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_checkpoint_that_would_run_code_when_loaded_is_refused_not_run(tmp_path):
    import pickle
    import random

    import numpy as np
    import torch

    from recipes.node import distributed

    marker = tmp_path / "ran"
    torch.save({"scheduler": {}, "position": Payload(str(marker))}, tmp_path / "train_state.pt")
    torch.save({"model": Payload(str(marker))}, tmp_path / "state.pt")
    for name in ("train_state.pt", "state.pt"):
        with pytest.raises(pickle.UnpicklingError):
            distributed.read_state(tmp_path / name)
    assert not marker.exists()
    # What the console's own checkpoints hold reads back: every generator's state, exactly.
    torch.save(distributed.rng_state(), tmp_path / "rng-0.pt")
    before = (torch.rand(3), np.random.rand(3).tolist(), random.random())
    distributed.set_rng_state(distributed.read_state(tmp_path / "rng-0.pt"))
    after = (torch.rand(3), np.random.rand(3).tolist(), random.random())
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]
    # An RNG file from before numpy's state was a list (an array in it) still resumes.
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               tmp_path / "rng-old.pt")  # fmt: skip
    before = np.random.rand(3).tolist()
    distributed.set_rng_state(distributed.read_state(tmp_path / "rng-old.pt"))
    assert np.random.rand(3).tolist() == before


def documents_folder(folder):
    """Five documents in the three formats prepare_data reads."""
    import pyarrow
    import pyarrow.parquet

    folder.mkdir(parents=True)
    (folder / "a.jsonl").write_text(json.dumps({"text": "the first document"}) + "\n" +
                                    json.dumps({"text": "the second one"}) + "\n")  # fmt: skip
    (folder / "b.txt").write_text("a whole text file is one document")
    table = pyarrow.table({"text": ["parquet row one", "and row two"]})
    pyarrow.parquet.write_table(table, folder / "c.parquet")
    return ["the first document", "the second one", "a whole text file is one document", "parquet row one",
            "and row two"]  # fmt: skip


def test_prepare_data_writes_token_shards_with_an_eos_per_document_read_without_loading_them(tmp_path):
    from recipes.node import prepare_data
    from recipes.node.train import ByteTokenizer

    texts = documents_folder(tmp_path / "docs")
    done = subprocess.run([sys.executable, "-m", "recipes.node.prepare_data", str(tmp_path / "docs"),
                           str(tmp_path / "corpus"), "--shard-tokens", "40"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("5 documents, ")
    index = json.loads((tmp_path / "corpus" / "index.json").read_text())
    expected = [t for text in texts for t in ByteTokenizer().encode(text)]  # BOS, the bytes, EOS each
    assert (index["documents"], index["tokens"], index["tokenizer"]) == (5, len(expected), "bytes")
    assert len(index["shards"]) == -(-len(expected) // 40)  # split every 40 tokens, across documents
    tokens = prepare_data.Tokens(tmp_path / "corpus")
    assert list(tokens[0 : len(tokens)]) == expected and list(tokens[35:45]) == expected[35:45]  # across a shard
    assert list(tokens[:]).count(ByteTokenizer.eos) == 5


def test_pretraining_on_a_prepared_data_set_resumes_exactly_where_it_stopped(tmp_path):
    """The position in the data is in every checkpoint, and each epoch's order comes from the seed and
    the epoch: a run requeued after step 6 reads the same batches and ends with the same losses."""
    from recipes.node import prepare_data
    from recipes.node.train import ByteTokenizer

    documents_folder(tmp_path / "docs")
    prepare_data.prepare(tmp_path / "docs", tmp_path / "corpus", ByteTokenizer())
    settings = {"tensor": 1, "global_batch": 4, "micro_batch": 4, "seq_len": 16, "steps": 12, "checkpoint_every": 6,
                "dataset": str(tmp_path / "corpus")}  # fmt: skip
    whole = config(tmp_path / "whole", **settings)
    train(whole)
    again = config(tmp_path / "again", **settings)
    shutil.copytree(whole / "checkpoints" / "step-6", again / "checkpoints" / "step-6")
    train(again)
    assert losses(again) == losses(whole)[6:]  # 10 sequences of 16: more than one epoch in 12 steps


def test_each_epoch_reads_every_sequence_once_in_an_order_of_its_own():
    from recipes.node.train import batches

    tokens = list(range(8 * 10 + 1))  # 10 sequences of 8
    stream = batches(tokens, 8, 5, 0, seed=3)
    rows = [int(x[0]) // 8 for _ in range(4) for x in next(stream)[1]]  # 4 batches of 5: two epochs
    first, second = rows[:10], rows[10:]
    assert sorted(first) == sorted(second) == list(range(10)) and first != second


def test_a_rank_on_a_slowed_node_shows_in_the_probe_each_rank_logs(tmp_path):
    """Rank 1 is throttled from outside (stopped 4 ms of every 5, as a busy or throttled node is):
    every rank's step takes as long, since each collective waits for it, but the probe of the same local
    work on each rank (distributed.Probe) is slower on rank 1 only, and rank 0 logs it with the nodes."""
    import contextlib
    import os
    import signal
    import socket
    import threading
    import time

    from clusters import processes

    folder = config(tmp_path / "run", tensor=1, steps=8, probe_every=1, checkpoint_every=8, log_every=8)
    done = threading.Event()

    def throttle():
        with contextlib.suppress(OSError):  # real-time: the stops come on time though both ranks are busy
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        target = None
        while not (folder / "metrics.jsonl").exists() and not done.is_set():  # both ranks started training
            time.sleep(0.02)
        while target is None and not done.is_set():
            for pid, argv in processes.command_lines():
                if str(folder / "config.json") in argv and processes.environ(pid).get("RANK") == "1":
                    target = pid
            time.sleep(0.05)
        while not done.is_set():
            try:
                os.kill(target, signal.SIGSTOP)
                time.sleep(0.004)
                os.kill(target, signal.SIGCONT)
                time.sleep(0.001)
            except ProcessLookupError:
                return
        if target is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGCONT)

    throttler = threading.Thread(target=throttle, daemon=True)
    throttler.start()
    try:
        train_on_ranks(folder, 2)
    finally:
        done.set()
        throttler.join(timeout=5)
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    probes = [line["probe"] for line in lines if "probe" in line]
    assert [line["step"] for line in lines if "probe" in line] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert all(p["nodes"] == [socket.gethostname()] * 2 for p in probes)
    slower = [p["ms"][1] / p["ms"][0] for p in probes]
    assert sum(ratio > 1.5 for ratio in slower) >= 6, slower  # most: a probe may fall between two stops
