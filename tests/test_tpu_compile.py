"""Ahead-of-time TPU compilation (specdec_jax.jobs.tpu.aot, tpu_programs, tpu_compile) with
libtpu on a CPU-only machine: tiny generate functions compile for one v5e chip
with no host communication inside their loops, a Megatron-sharded toy runs two
all-reduces per layer on 4 chips (one, and no other collective, where the model
axis does not divide the KV heads), and the job writes, resumes and refuses
mismatched settings; a model kept in its GGUF file's blocks compiles with them as
uint8 arguments. Skipped without libtpu (``pip install -e ".[tpu]"``)."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import compile_job as tpu_compile
from specdec_jax.jobs.tpu import hlo_stats
from specdec_jax.jobs.tpu import programs as tpu_programs
from specdec_jax.models.decoder_only import DecoderConfig, DecoderOnlyLM
from specdec_jax.runtime import timing
from tests import tpu_topology

TOPOLOGY = "v5e:2x2"
tpu_topology.require(TOPOLOGY)

TINY = tpu_programs.Shapes(target="tiny-target", drafter="tiny-drafter", cache_length=80,
                           prompt_len=4, max_new_tokens=4, gamma=2)
# One generate function per method family (the job's ``generate`` group adds the
# token and block-seed verifiers, which share specdecode's loop): autoregressive
# decoding, speculative rounds (block verification), a speculative cascade's target
# function, CS Drafting's nested loops over Max-Gram, SpecDec++'s data-dependent draft
# loop, the feature head's drafting on the target's hidden states, and token trees (the
# drafter's dynamic tree, Max-Gram's best-first tree).
FAMILIES = ["generate_autoregressive", "generate_specdecode_block", "generate_cascade_token_v3",
            "generate_csd_maxgram", "generate_specdecpp", "generate_feature",
            "generate_tree_dynamic", "generate_tree_maxgram"]


@pytest.fixture(scope="module")
def family_records():
    """Every family's record, compiled by two worker processes at once (one
    compile uses one core; the six take ~30 CPU seconds)."""
    return tpu_compile.compile_in_processes(FAMILIES, TINY, TOPOLOGY,
                                            workers=min(2, os.cpu_count() or 1))


def test_the_families_cover_every_method_of_the_job():
    methods = {tpu_programs.GENERATE[name][:2] for name in FAMILIES}
    assert methods == {(m, kind) for m, kind, _ in tpu_programs.GENERATE.values()}


@pytest.mark.parametrize("name", FAMILIES)
def test_tiny_generate_functions_compile_with_no_host_ops_in_loops(name, family_records):
    record = family_records[name]
    assert record["status"] == "compiled", record.get("error")
    assert record["fits"] and record["hbm_bytes"] > 0
    assert record["hlo"]["while_loops"] >= 1
    assert record["hlo"]["host_ops_in_loops"] == []


def test_tree_calls_compile_with_the_cache_updated_in_place():
    """The target's tree call (score the nodes, commit the accepted path), the
    drafter's one-depth call and Max-Gram's best-first tree: compiled, the KV
    cache donated and aliased (no copy of it per round), no host communication."""
    names = ["target_tree_w17", "drafter_tree_w8", "maxgram_trie"]
    assert set(names) <= set(tpu_programs.TREE_CALLS)
    records = tpu_compile.compile_in_processes(names, TINY, TOPOLOGY,
                                               workers=min(2, os.cpu_count() or 1))
    for name, record in records.items():
        assert record["status"] == "compiled", (name, record.get("error"))
        assert record["hlo"]["host_ops_in_loops"] == []
    for name in names[:2]:
        assert records[name]["memory"]["alias"] > 0, name


def test_a_round_compiles_as_one_program_with_each_draft_step_visible():
    """One round at G = 3 (draft, score, verify, commit) as one program, beside
    the drafter's headless catch-up call it contains: the loop state's caches
    donated and updated in place, no host communication, and one loop only (the
    catch-up's): the draft steps are unrolled, so the cost analysis, which
    counts a loop body once, counts each of them."""
    names = ["round_specdecode_g3", "drafter_k1_no_head", "drafter_k1"]
    assert set(names[:1]) <= set(tpu_programs.ROUNDS) and set(names[1:]) <= set(
        tpu_programs.PER_CALL)
    records = tpu_compile.compile_in_processes(names, TINY, TOPOLOGY,
                                               workers=min(2, os.cpu_count() or 1))
    for name, record in records.items():
        assert record["status"] == "compiled", (name, record.get("error"))
    whole = records["round_specdecode_g3"]
    assert whole["kind"] == "round"
    assert whole["hlo"]["while_loops"] == 1
    assert whole["hlo"]["host_ops_in_loops"] == []
    assert whole["memory"]["alias"] >= 0.9 * whole["cache_bytes"]
    # Its temporaries named from the compiler's buffer assignment, largest first.
    sizes = [v["bytes"] for v in whole["temp_buffers"]]
    assert sizes and sizes == sorted(sizes, reverse=True)
    assert whole["hbm_temporaries"]["bytes"] >= sizes[0]
    assert "temp_buffers" not in records["drafter_k1"]  # per-call programs are not dumped
    # No output head: fewer flops than the drafter's step.
    assert records["drafter_k1_no_head"]["flops"] < records["drafter_k1"]["flops"]


def sharded_step_collectives(layers: int, num_heads: int = 4, num_kv_heads: int = 4) -> dict:
    """Collectives of one step (K = 1) of a toy decoder sharded over 4 chips."""
    config = DecoderConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_layers=layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                           dtype="bfloat16", param_dtype="bfloat16")
    model, params = tpu_programs.abstract_decoder(DecoderOnlyLM(config))
    shapes = tpu_programs.Shapes(target="toy", drafter="toy", cache_length=64, model=4)
    mesh = tpu_aot.make_mesh(TOPOLOGY, model=4)
    program = tpu_programs.model_step(model, params, shapes, mesh, 1)
    compiled, _, _ = tpu_aot.compile_abstract(program.fn, program.args,
                                              donate_argnums=program.donate_argnums)
    return hlo_stats.summarize(compiled.as_text())["collectives"]


def sharded_step_all_reduces(layers: int) -> int:
    return sharded_step_collectives(layers)["all-reduce"]


def test_megatron_sharding_runs_two_all_reduces_per_layer():
    """Attention and MLP each end in a row-split matmul whose partial sums are
    all-reduced (two per layer), plus one for the token's embedding row, read
    from the table split by vocabulary."""
    assert sharded_step_all_reduces(1) == 2 * 1 + 1
    assert sharded_step_all_reduces(3) == 2 * 3 + 1


def test_grouped_query_attention_stays_whole_where_the_model_axis_splits_kv_heads():
    """2 KV heads over a model axis of 4 (the real pair's case): q/k/v and the
    cache are replicated, and so is the attention output kernel, so attention
    runs whole on every chip and only the MLP's partial sums are all-reduced.
    With the output kernel split by rows into whole query heads (8 heads over
    4), the partitioner split attention by heads against the replicated q/k/v
    and cache: collective-permutes, an extra all-reduce and all-gathers of
    each layer's whole cache every step (the 1.5B on v5e:4x4)."""
    collectives = sharded_step_collectives(2, num_heads=8, num_kv_heads=2)
    assert collectives["all-reduce"] == 2 * 1 + 1
    assert collectives["collective-permute"] == 0
    assert collectives["all-gather"] == 0


def test_job_writes_resumes_and_refuses_other_settings(tmp_path, monkeypatch):
    out = tmp_path / "report.json"
    args = dict(topology=TOPOLOGY, programs=["target_k1", "maxgram_step"], out=str(out),
                target="random:tiny-target:0", drafter="tiny-drafter", cache_length=64)
    report = tpu_compile.run_tpu_compile(**args)
    assert list(report["programs"]) == ["target_k1", "maxgram_step"]
    step = report["programs"]["target_k1"]
    assert step["status"] == "compiled" and step["memory"]["alias"] > 0  # cache donated
    assert step["floor_s"] > 0 and step["hlo"]["fusions"] > 0
    assert step["commit"] == report["environment"]["commit"] == timing.checkout_commit()
    assert json.loads(out.read_text())["settings"]["topology"] == TOPOLOGY
    text = (tmp_path / "report.md").read_text()
    assert tpu_aot.ESTIMATE in text and "`target_k1`" in text

    def fail(*_, **__):
        raise AssertionError("a program already in the report was compiled again")

    monkeypatch.setattr(tpu_compile, "compile_one", fail)
    assert tpu_compile.run_tpu_compile(**args)["programs"] == report["programs"]
    with pytest.raises(ValueError, match="other settings"):
        tpu_compile.run_tpu_compile(**{**args, "cache_length": 128})


def test_a_model_kept_in_its_files_blocks_compiles_with_them_as_uint8(tmp_path, monkeypatch):
    """``weights="stored"``: the matrices of a block type are the GGUF file's
    bytes in the file's layout (not the CPU kernel's interleaved one; not row
    by row), every other leaf bfloat16; the step compiles, dequantising inside
    the program, and its weight bytes count the blocks as stored."""
    from specdec_jax.checkpoints import registry  # noqa: PLC0415
    from tests.hf_peer import small_hf_decoder  # noqa: PLC0415
    from tests.test_checkpoints import write_gguf  # noqa: PLC0415

    hf_model, config = small_hf_decoder("qwen2")
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, arch="qwen2", quantize_ffn=True)
    monkeypatch.setattr(registry, "local_path", lambda name: path)
    shapes = dataclasses.replace(TINY, weights="stored")
    models = tpu_programs.abstract_models(shapes)
    model, params = models["target"]
    up = params["layers_0"]["mlp"]["wi_1"]
    assert list(up) == ["kernel_q8_0"] and up["kernel_q8_0"].dtype == np.uint8
    assert up["kernel_q8_0"].shape == (config["intermediate_size"],
                                       config["hidden_size"] // 32 * 34)
    assert not model.config.row_independent and model.config.prefill_chunk == 0
    others = {leaf.dtype for leaf in jax.tree.leaves(params) if leaf.dtype != np.uint8}
    assert others == {jnp.dtype(jnp.bfloat16)}
    record = tpu_compile.compile_one("target_k2", shapes, tpu_aot.make_mesh(TOPOLOGY), models,
                                     tpu_aot.chip_of(TOPOLOGY), {})
    assert record["status"] == "compiled", record.get("error")
    floats = sum(2 * leaf.size for leaf in jax.tree.leaves(params) if leaf.dtype != np.uint8)
    blocks = config["num_hidden_layers"] * config["intermediate_size"] * 34  # a q8_0 block a row
    assert record["weight_bytes"] - floats == blocks
    with pytest.raises(ValueError, match="weights='int4'"):
        tpu_programs.abstract_models(dataclasses.replace(TINY, weights="int4"))


def test_topologies_have_one_device_per_chip():
    """As a TPU VM shows them: a v4 chip's two TensorCores are one (megacore)
    device, and a v4 report records that it was compiled so."""
    assert len(tpu_aot.topology_devices("v4:2x2x1")) == 4
    assert len(tpu_aot.topology_devices("v4:2x2x4")) == 16
    assert len(tpu_aot.topology_devices("v5p:2x2x1")) == 4
    shapes = tpu_programs.Shapes(target="t", drafter="d")
    settings = lambda topology: tpu_compile.settings_of(  # noqa: E731
        topology=topology, target="t", drafter="d", shapes=shapes, compiler_options={})
    assert settings("v4:2x2x1")["chip_config"] == "megacore"
    assert "chip_config" not in settings("v5e:2x2")  # reports before it still resume


def test_unknown_names_fail_before_compiling():
    with pytest.raises(ValueError, match="unknown program"):
        tpu_programs.expand(["per_call", "nope"])
    with pytest.raises(ValueError, match="generation"):
        tpu_aot.chip_of("v9:2x2")
    assert hlo_stats.summarize("")["fusions"] == 0


def test_the_suite_keeps_jax_on_the_cpu_beside_libtpu():
    """tests/conftest.py: libtpu installed, no TPU chips: this process's jax runs on
    the CPU (no TPU runtime started), and topologies are still described."""
    import glob  # noqa: PLC0415

    import jax  # noqa: PLC0415

    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        pytest.skip("a TPU VM: the suite runs on its chips")
    if os.environ.get("JAX_PLATFORMS") != "cpu":
        pytest.skip(f"JAX_PLATFORMS was set to {os.environ.get('JAX_PLATFORMS')!r} outside")
    assert jax.default_backend() == "cpu"
    assert len(tpu_aot.topology_devices(TOPOLOGY)) == 4


TINY_TRAINING = ["train_distill_qwen", "train_acceptance_head", "train_feature_head"]


def test_training_steps_compile_data_parallel_and_model_sharded():
    """One optimizer step of the tiny pair's distillation and of both heads,
    on a 2 (data) x 2 (model) mesh: compiled, the train state donated, the
    gradients all-reduced. (The T5 programs have the pair's fixed sizes: the
    job compiles them, ``-m long`` here.)"""
    shapes = tpu_programs.Shapes(target="tiny-target", drafter="tiny-drafter", data=2,
                                 model=2, train_batch=4, train_length=16)
    records = tpu_compile.compile_in_processes(TINY_TRAINING, shapes, TOPOLOGY,
                                               workers=min(2, os.cpu_count() or 1))
    for name, record in records.items():
        assert record["status"] == "compiled", (name, record.get("error"))
        assert record["kind"] == "training" and record["memory"]["alias"] > 0, name
        assert record["hlo"]["collectives"]["all-reduce"] > 0, name
        assert record["collective_bytes"]["all-reduce"] > 0, name


@pytest.mark.long
def test_t5_training_steps_compile():
    shapes = tpu_programs.Shapes(target="tiny-target", drafter="tiny-drafter", data=2,
                                 model=2, train_batch=4)
    names = ["train_t5_small", "train_distill_t5"]
    records = tpu_compile.compile_in_processes(names, shapes, TOPOLOGY,
                                               workers=min(2, os.cpu_count() or 1))
    assert all(r["status"] == "compiled" for r in records.values()), records


def test_optimizer_moments_are_sharded_like_their_parameters():
    from specdec_jax.jobs.tpu import training_steps as tpu_training  # noqa: PLC0415
    from specdec_jax.runtime import sharding  # noqa: PLC0415

    mesh = tpu_aot.make_mesh(TOPOLOGY, data=2, model=2)
    model, params = tpu_training.decoder("tiny-target", "bfloat16")
    rules = sharding.rules_for(model)
    state = tpu_training.abstract_state(params, tpu_training.DISTILL_OPTIMIZER, mesh, rules)
    kernel = state.params["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert tuple(kernel.sharding.spec) == (None, sharding.MODEL)
    adam = state.opt_state[1][0]  # clip_by_global_norm, then AdamW's scale_by_adam
    assert adam.mu["layers_0"]["mlp"]["wi_0"]["kernel"].sharding == kernel.sharding
    assert tuple(adam.count.sharding.spec) == ()
