"""The catalog's full profiles as a GPU cluster would run them, checked on CPU: the config a launch
resolves carries the model's whole architecture, the model train.py builds from it on the meta device
has the published parameter count (and allocates nothing, even at 405B), and every collective of a
rank's layout takes its tensors on the layout's device (under NCCL a CPU tensor fails the run).
Persona: tomas, who writes recipes."""

import json
import math
import resource
import types
from types import SimpleNamespace

import pytest
import torch

from recipes.catalog import get_recipe, model_shape, recipes
from recipes.node import distributed, train
from recipes.runs import fit, launch

from .factories import losses, train_on_ranks

# Published totals (each model card's safetensors parameter count on Hugging Face).
PUBLISHED = {
    "llama3.1-8b": 8_030_261_248,
    "llama3.1-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "gemma2-2b": 2_614_341_888,
    "gemma2-9b": 9_241_705_984,
    "gemma2-27b": 27_227_128_320,
}


def full_config(recipe_id, tmp_path, profile_name="full", profile=None):
    """train.py's config for the recipe's full (or other) profile, as a launch resolves it."""
    return launch.offline_config(recipe_id, tmp_path, profile_name=profile_name, profile=profile)[0]


def test_it_prints_a_profiles_config_for_the_memory_trace_without_a_cluster(tmp_path):
    import io
    import json

    from django.core.management import CommandError, call_command

    out, err = io.StringIO(), io.StringIO()
    call_command("recipe_config", "llama3.1-70b-pretrain", "--layers", "2", "--output-dir", str(tmp_path),
                 stdout=out, stderr=err)  # fmt: skip
    config = json.loads(out.getvalue())
    assert config["model"]["layers"] == 2 and config["model"]["hidden_size"] == 8192
    assert config["output_dir"] == str(tmp_path) and config["parallel"]["tensor"] == 4
    assert config["parallel"]["compile"] == "inductor"  # GPU runs compile each decoder layer
    call_command("recipe_config", "llama3.1-70b-pretrain", "--profile", "tiny", stdout=(tiny := io.StringIO()))
    assert json.loads(tiny.getvalue())["parallel"]["compile"] is None  # CPU runs do not
    assert "--ranks 32" in err.getvalue()
    with pytest.raises(CommandError, match="unknown profile; choose one of: tiny, full"):
        call_command("recipe_config", "llama3.1-8b-sft", "--profile", "huge", stdout=out)


def parameters(model):
    return sum(p.numel() for p in model.parameters())  # tied embeddings count once


@pytest.mark.parametrize("recipe_id", sorted(recipes()))
def test_every_full_profile_builds_on_meta_with_its_published_parameter_count(recipe_id, tmp_path):
    config = full_config(recipe_id, tmp_path)
    model = train.build_model(config, device="meta")
    assert all(p.is_meta for p in model.parameters())
    model_name = "-".join(recipe_id.split("-")[:2])
    assert parameters(model) == PUBLISHED[model_name] == get_recipe(recipe_id)["architecture"]["parameters"]
    # and the fit check's own arithmetic (recipes/runs/fit.py) counts the same model
    assert fit.parameters(get_recipe(recipe_id)["profiles"]["full"], config["family"]).total == parameters(model)
    hf = model.config
    assert hf.vocab_size == get_recipe(recipe_id)["architecture"]["vocab_size"]  # not the tiny profiles' 260
    if config["family"] == "llama":
        assert (hf.rope_parameters["rope_type"], hf.rope_parameters["rope_theta"]) == ("llama3", 500000.0)
        assert hf.rms_norm_eps == 1e-5 and not hf.tie_word_embeddings
        assert hf.head_dim == 128
    else:
        assert hf.tie_word_embeddings and hf.rms_norm_eps == 1e-6
        assert (hf.attn_logit_softcapping, hf.final_logit_softcapping) == (50.0, 30.0)
        assert hf.head_dim == (128 if recipe_id.startswith("gemma2-27b") else 256)


def test_the_tiny_profiles_keep_their_byte_vocabulary(tmp_path):
    config = full_config("llama3.1-8b-pretrain", tmp_path)
    config["model"] = model_shape(get_recipe("llama3.1-8b-pretrain")["profiles"]["tiny"])
    assert set(config["model"]) == {"hidden_size", "intermediate_size", "layers", "heads", "kv_heads"}
    assert train.model_config(config).vocab_size == train.ByteTokenizer.vocab_size


def test_building_the_405b_on_meta_allocates_nothing(tmp_path):
    config = full_config("llama3.1-405b-pretrain", tmp_path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the peak so far
    model = train.build_model(config, device="meta")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert parameters(model) == PUBLISHED["llama3.1-405b"]
    assert grown_mib < 256, f"the peak resident memory grew {grown_mib:.0f} MiB building a meta model"  # fp32: 1.6 TB


class Reached(Exception):
    pass


class Mesh:
    def __getitem__(self, name):
        return SimpleNamespace(get_group=lambda: f"group {name}")


def test_every_collective_of_a_layout_takes_tensors_on_the_layouts_device(monkeypatch):
    """A GPU rank's layout lives on cuda:N; this machine has no GPU, so the layout's device is the meta
    device and every collective is wrapped: a tensor anywhere else (a CPU scalar, as Layout.max built
    once) is what NCCL refuses."""
    seen = []

    def collective(tensor, *args, **kwargs):
        seen.append(tensor.device)
        raise Reached  # the meta tensor cannot be read back; the device at the call is what counts

    def gather(found, tensor, *args, **kwargs):
        seen.extend(part.device for part in [*found, tensor])
        raise Reached

    monkeypatch.setattr(torch.distributed, "all_reduce", collective)
    monkeypatch.setattr(torch.distributed, "all_gather", gather)
    layout = distributed.Layout(rank=0, world=4, local_rank=0, tp=2, dp=2, dp_rank=0, mesh=Mesh(), device="meta")
    with pytest.raises(Reached):
        layout.max(1.5)
    with pytest.raises(Reached):
        layout.dp_sum(torch.zeros((), device=layout.device))
    with pytest.raises(Reached):
        layout.gather(2.5)  # the probe's timings (recipes/node/train.py)
    assert seen == [torch.device("meta")] * (2 + 5)


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_tensor_parallelism_splits_the_vocabulary_and_the_sequence_between_blocks(tmp_path, family):
    """torchtitan's plan (on a fake process group of 4 ranks, tensor 2; nothing allocated): the embedding
    and the output layer split by vocabulary (Gemma's still one tied weight), the norms replicated and
    run on a split sequence, the projections column- then row-parallel with the row-parallel ones
    scattering the sequence back."""
    import contextlib

    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    config = json.loads((tiny(tmp_path, family) / "config.json").read_text())
    layout = distributed.init(0, 4, 0, 2, "cpu", backend="fake", store=FakeStore())
    try:
        model = train.build_model(config, device="meta")
        distributed.tensor_parallel(model, layout.mesh["tp"])
        embedding, head = model.model.embed_tokens.weight, model.lm_head.weight
        assert isinstance(embedding, DTensor) and embedding.placements == (Shard(0),)
        assert head.placements == (Shard(0),) and (head is embedding) == (family == "gemma")
        assert model.model.norm.weight.placements == (Replicate(),)
        layer = model.model.layers[0]
        assert layer.input_layernorm.weight.placements == (Replicate(),)
        assert layer.self_attn.q_proj.weight.placements == (Shard(0),)
        assert layer.self_attn.o_proj.weight.placements == (Shard(1),)
        assert layer.mlp.down_proj.weight.placements == (Shard(1),)
        if family == "gemma":
            assert layer.pre_feedforward_layernorm.weight.placements == (Replicate(),)
    finally:
        with contextlib.suppress(Exception):
            torch.distributed.destroy_process_group()


# -- the sharded build, run as the nodes run it (torchrun, gloo ranks on this machine) ---------------


def tiny(folder, family="llama", **changes):
    values = {
        "recipe": "test", "family": family, "kind": "pretrain", "profile": "tiny",
        "model": {"hidden_size": 64, "intermediate_size": 172, "layers": 2, "heads": 4, "kv_heads": 2},
        "seq_len": 64, "micro_batch": 4, "lr": 3e-3, "steps": 6, "precision": "fp32", "checkpoint_every": 6,
        "seed": 7, "data_seed": 1234, "output_dir": str(folder), "log_every": 3, "export_model": False,
        "parallel": {"tensor": 2, "global_batch": 16, "activation_checkpointing": True},
    }  # fmt: skip
    values["parallel"].update(changes.pop("parallel", {}))
    values.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def run(folder, ranks):
    train_on_ranks(folder, ranks)
    return losses(folder)


@pytest.mark.parametrize("family", ["llama", "gemma"])  # gemma: tied embeddings, norms that start at 0
def test_four_ranks_load_a_sharded_hf_folder_to_the_weights_one_process_reads(tmp_path, family):
    hub = tmp_path / "hub"
    model = train.build_model(json.loads((tiny(tmp_path / "shape", family) / "config.json").read_text()))
    model.save_pretrained(hub, max_shard_size="40KB")  # several safetensors files and their index
    assert len(list(hub.glob("model-*.safetensors"))) > 2
    whole = run(tiny(tmp_path / "whole", family, init_from_hf=str(hub), parallel={"tensor": 1}), ranks=1)
    # ... and its loss computed 16 positions at a time, as the full profiles do (loss_chunk)
    sharded_chunked = {"build": "sharded", "loss_chunk": 16}
    sharded = run(tiny(tmp_path / "sharded", family, init_from_hf=str(hub), parallel=sharded_chunked), ranks=4)
    assert abs(whole[0] - sharded[0]) < 1e-5, (whole, sharded)  # the same weights, the same first batch
    assert abs(whole[-1] - sharded[-1]) < 1e-3, (whole, sharded)


def test_a_sharded_build_from_a_seed_starts_where_a_model_initialised_whole_does(tmp_path):
    whole = run(tiny(tmp_path / "whole"), ranks=4)
    sharded = run(tiny(tmp_path / "sharded", parallel={"build": "sharded"}), ranks=4)
    # Other random draws, the same distribution: the first loss of an untrained model is ln(vocabulary)
    # give or take, and both train.
    assert abs(sharded[0] - math.log(train.ByteTokenizer.vocab_size)) < 0.1
    assert abs(sharded[0] - whole[0]) < 0.05 and sharded[-1] < sharded[0] - 0.3


REFERENCE_GPU = {"a3-ultra": "NVIDIA_H200_141GB", "a3-mega": "NVIDIA_H100_MEGA_80GB", "a4": "NVIDIA_B200"}


@pytest.mark.parametrize("recipe_id", sorted(recipes()))
def test_every_full_profile_fits_its_reference_machine_on_the_catalogs_layout(recipe_id):
    recipe = get_recipe(recipe_id)
    full = recipe["profiles"]["full"]
    world = full["nodes"] * full["ranks_per_node"]
    data = world // full["tensor"]
    assert full["global_batch"] % (full["micro_batch"] * data) == 0  # whole micro-batches per rank
    accelerator = REFERENCE_GPU[recipe["hardware"]["architecture"]]
    assert launch.reference_accelerator(recipe) == accelerator
    estimate, checkpointing = launch.fitting_estimate(recipe, full, "full", tensor=full["tensor"], data=data,
                                                      accelerator=accelerator)  # fmt: skip
    assert estimate.fits, estimate.sentence()
    # Selective activation checkpointing wherever it fits: all but gemma2-2b-pretrain's 4 x 8,192 tokens
    # on an 80 GB H100 (81.1 GB with it); TRL's RL recipes checkpoint whole layers.
    assert (checkpointing == "selective") == (recipe["kind"] != "rl" and recipe_id != "gemma2-2b-pretrain")
    assert ("reference model" in estimate.parts) == recipe_id.endswith("-dpo")
    # A planned throughput for what the planning MFU measured (torchtitan's pretraining), none for TRL's RL.
    assert (estimate.tokens_per_s is None) == (recipe["kind"] == "rl")


@pytest.mark.parametrize("family", ["llama", "gemma"])  # gemma: the final softcap
def test_the_chunked_loss_is_the_whole_logits_loss_with_the_same_gradients(tmp_path, family):
    config = json.loads((tiny(tmp_path, family) / "config.json").read_text())
    model = train.build_model(config)
    x = torch.randint(0, 256, (2, 64))
    y = torch.roll(x, -1, dims=1)
    y[0, :10] = -100  # masked positions, as SFT's prompts are

    logits = model(input_ids=x).logits
    whole = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
    whole.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    model.forward = types.MethodType(train.chunked_loss(16), model)
    loss = model(input_ids=x, labels=y)
    loss.backward()
    assert torch.allclose(loss, whole, rtol=1e-5), (loss, whole)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("profile", ["tiny", "full"])
@pytest.mark.parametrize("recipe_id", sorted(r for r, recipe in recipes().items() if recipe["kind"] == "rl"))
def test_every_rl_profile_passes_its_trainers_own_checks(recipe_id, profile, tmp_path):
    """TRL checks its arguments when they are made (GRPO: the generation batch must be a multiple of the
    generations per prompt); the full GRPO profile, one micro-batch on one process, failed that. The
    full profiles shard the policy (and DPO's reference) with FSDP2 per decoder layer over their 8 ranks."""
    config, world = launch.offline_config(recipe_id, tmp_path, profile_name=profile)
    args = train.trl_arguments(config, tmp_path, world)  # raises ValueError on what TRL refuses
    if profile == "full":
        layer = "Gemma2DecoderLayer" if config["family"] == "gemma" else "LlamaDecoderLayer"
        assert world == 8 and args.fsdp_config["transformer_layer_cls_to_wrap"] == [layer]
    # Each of the layout's ranks takes its micro-batches: together, the catalog's global batch, and (GRPO)
    # a generation batch that is a multiple of the generations per prompt, as TRL checks it on `world`
    # processes (here, one process makes the arguments).
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    assert per_step == config["parallel"]["global_batch"]
    if config.get("algorithm") == "grpo":
        assert per_step % args.num_generations == 0


def test_selective_checkpointing_keeps_more_than_whole_layers_and_the_fit_check_counts_it(tmp_path):
    """Two decoder layers of llama3.1-8b-sft at its layout, traced with each kind of checkpointing: what
    selective checkpointing keeps (attention's output and every other matrix product) is there, and the
    estimate's difference between the two is within a fifth of the traced one."""
    from recipes.node import memory

    recipe = get_recipe("llama3.1-8b-sft")
    shallow = {**recipe["profiles"]["full"], "layers": 2}
    config = full_config("llama3.1-8b-sft", tmp_path, profile=shallow)
    world = shallow["nodes"] * shallow["ranks_per_node"]
    traced, estimated = {}, {}
    for mode in ("selective", True):
        config["parallel"]["activation_checkpointing"] = mode
        traced[mode] = memory.trace(config, world)["backward"]  # what the forward kept, at the backward's peak
        estimated[mode] = fit.estimate(shallow, "llama", tensor=1, data=world, micro_batch=shallow["micro_batch"],
                                       seq_len=shallow["seq_len"], checkpointing=mode).parts["activations"]  # fmt: skip
    kept = traced["selective"] - traced[True]
    assert kept > 0
    assert abs((estimated["selective"] - estimated[True]) / kept - 1) <= 0.2, (kept, estimated)


TRAIN_PY_PROFILES = sorted(r for r, recipe in recipes().items() if recipe["kind"] != "rl")  # RL runs in TRL


@pytest.mark.parametrize("recipe_id", TRAIN_PY_PROFILES)
def test_the_fit_check_is_within_a_fifth_of_the_memory_torch_accounts_for_the_step(recipe_id, tmp_path):
    """Every pretraining, continued-pretraining and SFT profile at its layout, two decoder layers deep
    (the layers differ only in number; benchmarks/fit_memory.py traces full depth): the estimate without
    the CUDA context and fragmentation, against FSDPMemTracker's peak of a traced step. It once missed
    Gemma 2's eager attention scores by half (30 of the 40 GiB gemma2-2b-pretrain needs)."""
    from recipes.node import memory

    recipe = get_recipe(recipe_id)
    shallow = {**recipe["profiles"]["full"], "layers": 2}
    config = full_config(recipe_id, tmp_path, profile=shallow)
    world = shallow["nodes"] * shallow["ranks_per_node"]
    traced = memory.trace(config, world)
    estimate = fit.estimate(
        shallow, recipe["family"], tensor=shallow["tensor"], data=world // shallow["tensor"],
        micro_batch=shallow["micro_batch"], seq_len=shallow["seq_len"],
        checkpointing=config["parallel"]["activation_checkpointing"],
    )  # fmt: skip
    expected = estimate.total - estimate.parts["context and fragmentation"]
    measured = max(traced["forward"], traced["backward"])
    assert abs(expected / measured - 1) <= 0.2, (estimate.sentence(), measured / fit.GB, traced["by_kind"])
