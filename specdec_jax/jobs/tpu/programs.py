"""The programs the TPU compile job compiles, built from shapes alone.

Each program is a function plus abstract arguments (``jax.ShapeDtypeStruct``
with a ``NamedSharding`` over a TPU mesh): models come from the registry's
architectures (``registry.ARCHITECTURES``) in the decode layout
(``models.decoder.with_kernel_layout``), in bfloat16, through ``jax.eval_shape``,
so no weight is ever made. Two kinds:

- *per-call* programs, one model call each, the units a cost model prices:
  ``target_k<K>`` (the target's ``extend`` of K tokens: K = 1 is the
  autoregressive step, K = G + 1 a round's scoring call), ``drafter_k1``,
  ``feature_draft_step`` (the EAGLE-style head: step, logits, argmax),
  ``acceptance_head`` (SpecDec++'s head on one hidden state) and
  ``maxgram_step`` (one Max-Gram proposal over the cache's room of text);
  the token-tree calls ``target_tree_w<W>`` (the target's ``score_tree`` of
  W nodes, the pending token and a tree of W - 1, then ``commit_path`` of
  the accepted path: one tree round's target work) and ``drafter_tree_w<W>``
  (the drafter scoring one depth of W nodes), and ``maxgram_trie`` (Max-Gram's
  best-first tree ``TREE_TRIE`` grown over the cache's room of text: its node
  budget of sequential suffix matches); ``drafter_k1_no_head`` is the
  drafter's catch-up call (one token fed, no logits). Calls that update a KV
  cache donate it, as a decoding loop's body does;
- *round* programs ``round_specdecode_g<G>``: one whole round of chain
  speculative decoding with the drafter model (draft G, score G + 1, verify,
  commit), its draft steps unrolled, so its estimate can be set against the
  sum of the calls it makes: what a round costs between priced calls shows;
- *generate* programs, whole ``api.make_generate_fn`` functions (prefill and
  every round inside one program): ``generate_<name>`` in ``GENERATE``;
- *training* programs, one optimizer step of each training recipe
  (``jobs.tpu_training``): ``TRAINING``.

``cost_analysis`` of a whole generate program is not per-call cost (a while
loop's body is counted once, not per iteration): read it for memory, host
communication and collectives; price calls with the per-call programs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from specdec_jax import api, precision
from specdec_jax.checkpoints import gguf, registry
from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf
from specdec_jax.decode import methods
from specdec_jax.decode.tree import make_tree_drafter
from specdec_jax.drafting import make_drafter
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
from specdec_jax.drafting.adaptive import AdaptiveDrafter, small_target_widths, target_widths
from specdec_jax.drafting.feature import FeatureDrafter
from specdec_jax.drafting.maxgram import DEFAULT_MAX_NGRAM, longest_match_next
from specdec_jax.drafting.model_drafter import ModelDrafter, default_catch_up_widths
from specdec_jax.drafting.tree import MaxGramTrieDrafter
from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import training_steps as tpu_training
from specdec_jax.jobs.tpu.aot import Program
from specdec_jax.models import feature_head
from specdec_jax.models.decoder_only import DecoderOnlyLM, with_kernel_layout
from specdec_jax.models.interface import Prompt
from specdec_jax.models.layers import OUT_IN
from specdec_jax.runtime import sharding

DTYPE = "bfloat16"
WEIGHTS = ("bf16", "stored")  # every leaf in DTYPE, or the GGUF files' blocks kept
MAX_SCORING_WIDTH = 9  # K = G + 1 for G = 1..8
FEATURE = "feature"
ADAPTIVE_HEAD_DEPTH = 3  # SpecDec++'s recommended head
CSD_K_MATRIX = ((2, 10), (0, 10))  # CS Drafting's decoder-only setting
# Tree generate programs: the best trees of the CPU-counted benchmark (issue 44).
TREE_DYNAMIC = "dynamic:5,2,3"  # 27 nodes
TREE_TRIE_NODES, TREE_TRIE_DEPTH = 16, 8  # Max-Gram's best-first tree ...
TREE_TRIE = f"trie:{TREE_TRIE_NODES},{TREE_TRIE_DEPTH}"  # ... as the benchmarks name it
TRIE_COLUMNS = 8  # bigram continuations per token it reads
# Tree call widths: the pending token and a tree of 16 / 32 / 64 nodes (target), one
# depth of up to 8 nodes (drafter); a tree's commit moves a path of up to TREE_PATH.
TREE_TARGET_WIDTHS = (17, 33, 65)
TREE_DRAFTER_WIDTHS = (8,)
TREE_PATH = 8
# generate program -> make_generate_fn arguments (method, drafter kind, verifier).
GENERATE = {
    "generate_autoregressive": ("autoregressive", None, "token"),
    "generate_specdecode_token": ("specdecode", "model", "token"),
    "generate_specdecode_block": ("specdecode", "model", "block"),
    "generate_specdecode_block_seed": ("specdecode", "model", "block-seed"),
    "generate_cascade_token_v3": ("token-v3", "model", "token"),
    "generate_csd_maxgram": ("specdecode", "csd", "token"),
    "generate_specdecpp": ("specdecode", "adaptive", "token"),
    "generate_feature": ("specdecode", FEATURE, "token"),
    # Token trees: the 0.5B's dynamic (EAGLE-2) tree and Max-Gram's best-first trie.
    "generate_tree_dynamic": ("specdecode", TREE_DYNAMIC, "token"),
    "generate_tree_maxgram": ("specdecode", TREE_TRIE, "token"),
}
PER_CALL = (*(f"target_k{k}" for k in range(1, MAX_SCORING_WIDTH + 1)), "drafter_k1",
            "drafter_k1_no_head", "feature_draft_step", "acceptance_head", "maxgram_step")
ROUND_GAMMAS = tuple(range(3, MAX_SCORING_WIDTH))  # the draft lengths the prices cover
ROUND = "round_specdecode_g"
ROUNDS = tuple(f"{ROUND}{g}" for g in ROUND_GAMMAS)
TREE_CALLS = (*(f"target_tree_w{w}" for w in TREE_TARGET_WIDTHS),
              *(f"drafter_tree_w{w}" for w in TREE_DRAFTER_WIDTHS), "maxgram_trie")
TRAINING = tpu_training.TRAINING
PROGRAMS = (*PER_CALL, *TREE_CALLS, *ROUNDS, *GENERATE, *TRAINING)
GROUPS = {"per_call": PER_CALL, "tree_calls": TREE_CALLS, "rounds": ROUNDS,
          "generate": tuple(GENERATE), "training": TRAINING}


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What every program is built for: the pair, the batch, the room."""

    target: str  # registry architecture, e.g. "qwen2.5-coder-1.5b"
    drafter: str
    batch: int = 1
    cache_length: int = 2048  # KV-cache room of the per-call programs
    prompt_len: int = 512  # generate programs: prompt width ...
    max_new_tokens: int = 128  # ... and new tokens
    gamma: int = 5
    data: int = 1  # mesh: batch split over `data` chips,
    model: int = 1  # weights and KV heads over `model` chips (Megatron style)
    train_batch: int = 32  # training programs: rows per step (over `data`) ...
    train_length: int = 1024  # ... and tokens per row of the decoder-only ones
    weights: str = "bf16"  # "stored": the models' GGUF blocks (``abstract_stored_model``)


def expand(names) -> list[str]:
    """Program names with the groups (``per_call``, ``generate``) spelled out,
    checked, in order, each once."""
    out: list[str] = []
    for name in names:
        for item in GROUPS.get(name, (name,)):
            if item not in PROGRAMS:
                raise ValueError(f"unknown program {item!r}; choose from "
                                 f"{', '.join([*GROUPS, *PROGRAMS])}.")
            if item not in out:
                out.append(item)
    return out


def abstract_models(shapes: Shapes) -> dict:
    """``{"target": (model, params), "drafter": ...}`` of ``shapes``'s pair, in
    bfloat16 or kept in their files' blocks (``shapes.weights``)."""
    if shapes.weights not in WEIGHTS:
        raise ValueError(f"weights={shapes.weights!r}; choose one of {', '.join(WEIGHTS)}.")
    build = abstract_stored_model if shapes.weights == "stored" else abstract_model
    return {"target": build(shapes.target), "drafter": build(shapes.drafter)}


def abstract_stored_model(name: str, dtype: str = DTYPE) -> tuple[DecoderOnlyLM, dict]:
    """``(model, abstract params)`` of a registry model with its matrices kept
    in its GGUF file's blocks as an accelerator holds them (the file's layout,
    not the CPU kernel's: ``gguf.load_stored(platform="tpu")``); float leaves
    (norms, biases, matrices of other types) in ``dtype``. Shapes and block
    types are the file's, so it is read (fetched on first use, then dropped):
    every product dequantises its blocks inside the program, the float model
    of the file."""
    dtype = precision.resolve_dtype(dtype)
    cfg, params, _ = gguf.load_stored(registry.local_path(name), platform="tpu", dtype=dtype,
                                      param_dtype=dtype,
                                      matmul_precision=precision.matmul_precision(dtype))
    abstract = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype if leaf.dtype == np.uint8 else dtype), params)
    return DecoderOnlyLM(cfg), abstract


def abstract_model(architecture: str, dtype: str = DTYPE, *, fused: bool = True
                   ) -> tuple[DecoderOnlyLM, dict]:
    """``(model, abstract params)`` of a registered architecture in the decode
    layout (its projections ``fused`` or separate), every leaf in ``dtype`` (as
    ``load.random_model`` stores them)."""
    dtype = precision.resolve_dtype(dtype)
    config = decoder_config_from_hf(registry.architecture(architecture), dtype=dtype,
                                    param_dtype=dtype,
                                    matmul_precision=precision.matmul_precision(dtype))
    return abstract_decoder(DecoderOnlyLM(config), fused=fused)


def abstract_decoder(model: DecoderOnlyLM, *, fused: bool = True
                     ) -> tuple[DecoderOnlyLM, dict]:
    """``(model, abstract params)`` of any decoder in the decode layout, every
    leaf in the config's ``param_dtype``."""
    dtype = model.config.param_dtype

    def build():
        params = model.init_params(jax.random.PRNGKey(0))
        params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
        return with_kernel_layout(model, params, OUT_IN, fused=fused)[1]

    return with_kernel_layout(model, {}, OUT_IN, fused=fused)[0], jax.eval_shape(build)


def _params(model, params, mesh: Mesh):
    return sharding.abstract_params(params, mesh, sharding.rules_for(model))


def _cache(model, shapes: Shapes, mesh: Mesh, fill: int):
    cache = jax.eval_shape(lambda: model.init_cache(shapes.batch, shapes.cache_length))
    del fill  # the fill is a value (lengths), not a shape: compiled code is the same
    return tpu_aot.kv_sharded(cache, mesh)


def model_step(model, params, shapes: Shapes, mesh: Mesh, k: int, *,
               head: bool = True) -> Program:
    """One ``extend`` of ``k`` tokens at a cache of ``cache_length`` (donated);
    without ``head``, no position's logits (a catch-up call)."""

    def step(params, tokens_BxK, cache):
        logits_at = None if head else jnp.zeros((tokens_BxK.shape[0], 0), jnp.int32)
        out = model.extend(params, tokens_BxK, cache, logits_at=logits_at)
        return out.logits, out.cache

    cache = _cache(model, shapes, mesh, shapes.cache_length - k)
    tokens = tpu_aot.batch_sharded(jax.ShapeDtypeStruct((shapes.batch, k), jnp.int32), mesh)
    return Program(step, (_params(model, params, mesh), tokens, cache), donate_argnums=(2,),
                   weight_bytes=tpu_aot.tree_bytes(params), cache_bytes=tpu_aot.tree_bytes(cache))


def tree_step(model, params, shapes: Shapes, mesh: Mesh, width: int, *,
              commit: bool) -> Program:
    """One ``score_tree`` of ``width`` nodes at a cache of ``cache_length`` (the
    parents are data: one program serves every tree of that size), then, with
    ``commit``, ``commit_path`` of an accepted path of up to ``TREE_PATH``
    nodes (the cache donated, as in the loop)."""
    path = min(TREE_PATH, width)

    def step(params, tokens_BxW, parents_BxW, path_BxA, count_B, cache):
        out = model.score_tree(params, tokens_BxW, parents_BxW, cache)
        cache = model.commit_path(out.cache, path_BxA, count_B) if commit else out.cache
        return out.logits, cache

    b = shapes.batch
    cache = _cache(model, shapes, mesh, shapes.cache_length - width)
    ints = lambda *shape: tpu_aot.batch_sharded(  # noqa: E731
        jax.ShapeDtypeStruct(shape, jnp.int32), mesh)
    args = (_params(model, params, mesh), ints(b, width), ints(b, width), ints(b, path), ints(b),
            cache)
    return Program(step, args, donate_argnums=(5,), weight_bytes=tpu_aot.tree_bytes(params),
                   cache_bytes=tpu_aot.tree_bytes(cache),
                   note=f"score_tree of {width} nodes" +
                   (f", then commit_path of up to {path}" if commit else ""))


def tree_drafter(kind: str, drafter, vocab_size: int):
    """The tree drafter of a tree generate program (``GENERATE``'s kinds)."""
    if kind == TREE_TRIE:
        return MaxGramTrieDrafter(vocab_size, num_nodes=TREE_TRIE_NODES, depth=TREE_TRIE_DEPTH)
    return make_tree_drafter(drafter, kind)


def feature_head_of(target, target_params):
    """``(FeatureDrafter, abstract params)``: a head shaped like one target layer."""
    head = feature_head.FeatureHead(feature_head.FeatureHeadConfig.for_target(
        target, kernel_layout=OUT_IN))

    def build(target_params):
        net = jax.tree_util.tree_map(lambda x: x.astype(target.config.dtype),
                                     head.init_net(jax.random.PRNGKey(0)))
        return feature_head.drafter_params(target, target_params, net)

    return FeatureDrafter(head, name=FEATURE), jax.eval_shape(build, target_params)


def feature_draft_step(target, target_params, shapes: Shapes, mesh: Mesh) -> Program:
    """One draft of the feature head: ``step`` on one (token, feature), logits, argmax."""
    drafter, params = feature_head_of(target, target_params)
    head = drafter.head

    def step(params, token_B, feature_BxD, cache):
        predicted, cache = head.step(params, token_B[:, None], feature_BxD[:, None], cache)
        chosen = jnp.argmax(head.logits(params, predicted[:, 0]), -1).astype(jnp.int32)
        return chosen, predicted[:, 0], cache

    b, d = shapes.batch, head.config.feature_size
    cache = tpu_aot.kv_sharded(jax.eval_shape(
        lambda: head.init_cache(b, shapes.cache_length)), mesh)
    args = (tpu_aot.replicated(params, mesh),
            tpu_aot.batch_sharded(jax.ShapeDtypeStruct((b,), jnp.int32), mesh),
            tpu_aot.batch_sharded(jax.ShapeDtypeStruct((b, d), jnp.float32), mesh), cache)
    return Program(step, args, donate_argnums=(3,), weight_bytes=feature_bytes(target, params),
                   cache_bytes=tpu_aot.tree_bytes(cache),
                   note="the head's net plus the target's embedding and output rows")


def feature_bytes(target, params) -> int:
    """Bytes of a feature drafter's params, a tied target's table counted once
    (its embedding and output rows are one buffer)."""
    shared = tpu_aot.tree_bytes(params["embedding"]) if target.config.tie_embeddings else 0
    return tpu_aot.tree_bytes(params) - shared


def acceptance_head_of(drafter):
    head = AcceptanceHead(HeadConfig(hidden_size=drafter.config.hidden_size,
                                     depth=ADAPTIVE_HEAD_DEPTH))
    return head, jax.eval_shape(head.init_params, jax.random.PRNGKey(0))


def acceptance_head_step(drafter, shapes: Shapes, mesh: Mesh) -> Program:
    """SpecDec++'s acceptance probability for one drafter hidden state per row."""
    head, params = acceptance_head_of(drafter)
    hidden = jax.ShapeDtypeStruct((shapes.batch, drafter.config.hidden_size),
                                  jnp.dtype(drafter.config.dtype))
    return Program(head.accept_probs, (tpu_aot.replicated(params, mesh),
                                       tpu_aot.batch_sharded(hidden, mesh)),
                   weight_bytes=tpu_aot.tree_bytes(params), note="float32 head, depth 3")


def maxgram_step(vocab_size: int, shapes: Shapes, mesh: Mesh) -> Program:
    """One Max-Gram proposal over ``cache_length`` tokens of text per row."""

    def step(text_BxT, n_B, bigram_V):
        return longest_match_next(text_BxT, n_B, bigram_V, DEFAULT_MAX_NGRAM)

    b = shapes.batch
    args = (tpu_aot.batch_sharded(jax.ShapeDtypeStruct((b, shapes.cache_length), jnp.int32),
                                  mesh),
            tpu_aot.batch_sharded(jax.ShapeDtypeStruct((b,), jnp.int32), mesh),
            tpu_aot.replicated(jax.ShapeDtypeStruct((vocab_size,), jnp.int32), mesh))
    return Program(step, args, cache_bytes=b * shapes.cache_length * 4,
                   note=f"max n-gram {DEFAULT_MAX_NGRAM}; the text counted as cache")


def maxgram_trie(vocab_size: int, shapes: Shapes, mesh: Mesh) -> Program:
    """One best-first Max-Gram tree (``TREE_TRIE``) over ``cache_length`` tokens
    of text per row: its tokens and parents."""
    drafter = tree_drafter(TREE_TRIE, None, vocab_size)

    def grow(table_VxK, text_BxT, n_B):
        return drafter.grow(table_VxK, text_BxT, n_B)[:2]

    b = shapes.batch
    args = (tpu_aot.replicated(jax.ShapeDtypeStruct((vocab_size, TRIE_COLUMNS), jnp.int32), mesh),
            tpu_aot.batch_sharded(jax.ShapeDtypeStruct((b, shapes.cache_length), jnp.int32),
                                  mesh),
            tpu_aot.batch_sharded(jax.ShapeDtypeStruct((b,), jnp.int32), mesh))
    return Program(grow, args, cache_bytes=b * shapes.cache_length * 4,
                   note=f"{TREE_TRIE}, {TRIE_COLUMNS} bigram columns; the text counted as cache")


def generate_program(name: str, models: dict, shapes: Shapes, mesh: Mesh) -> Program:
    """A whole ``make_generate_fn`` function: ``fn(target_params, drafter_params,
    prompt, key, sampling_params)``."""
    method, kind, verifier = GENERATE[name]
    target, target_params = models["target"]
    drafter, drafter_params = models["drafter"]
    # The defaults a TPU host picks (these programs are built on any host).
    strategy = ModelDrafter(drafter, catch_up_widths=default_catch_up_widths("tpu"))
    params = _params(drafter, drafter_params, mesh)
    if kind is None:
        strategy, params = None, None
    elif kind == "csd":
        strategy = make_drafter("drafter+mag", models={"drafter": drafter},
                                vocab_size=target.vocab_size,
                                k_matrix=[list(row) for row in CSD_K_MATRIX])
        bigram = tpu_aot.replicated(jax.ShapeDtypeStruct((target.vocab_size,), jnp.int32),
                                    mesh)
        params = strategy.select_params({"drafter": params, "mag": bigram})
    elif kind == "adaptive":
        head, head_params = acceptance_head_of(drafter)
        strategy = AdaptiveDrafter(drafter, head, widths=target_widths(
            shapes.gamma, small_target_widths("tpu")))
        params = (params, tpu_aot.replicated(head_params, mesh))
    elif kind == FEATURE:
        strategy, feature_params = feature_head_of(target, target_params)
        params = tpu_aot.replicated(feature_params, mesh)
    elif kind in (TREE_DYNAMIC, TREE_TRIE):
        strategy = tree_drafter(kind, drafter, target.vocab_size)
        if kind == TREE_TRIE:
            params = tpu_aot.replicated(
                jax.ShapeDtypeStruct((target.vocab_size, TRIE_COLUMNS), jnp.int32), mesh)
    gamma = None if kind in ("csd", TREE_DYNAMIC, TREE_TRIE) else shapes.gamma
    # Only a method whose rounds verify a drafted block takes a verifier.
    verifier = verifier if methods.get_method(method).verifies_block else None
    fn = api.make_generate_fn(target=target, drafter=strategy, method=method, gamma=gamma,
                              verifier=verifier, max_new_tokens=shapes.max_new_tokens)
    prompt = tpu_aot.batch_sharded(Prompt(
        tokens=jax.ShapeDtypeStruct((shapes.batch, shapes.prompt_len), jnp.int32),
        lengths=jax.ShapeDtypeStruct((shapes.batch,), jnp.int32)), mesh)
    key = tpu_aot.replicated(jax.eval_shape(lambda: jax.random.PRNGKey(0)), mesh)
    sp = tpu_aot.replicated(jax.eval_shape(api.sampling_params), mesh)
    # A feature drafter's embedding and output rows are the target's own buffers.
    own = params["net"] if kind == FEATURE else params
    weights = tpu_aot.tree_bytes(target_params) + (0 if own is None else tpu_aot.tree_bytes(own))
    return Program(fn, (_params(target, target_params, mesh), params, prompt, key, sp),
                   weight_bytes=weights,
                   note="whole generate function; cost figures count each loop body once")


def round_program(models: dict, shapes: Shapes, mesh: Mesh, gamma: int) -> Program:
    """One round of chain speculative decoding (token verifier, the drafter
    model): ``decoder.round(target_params, drafter_params, state, sp)`` with the
    loop state (both caches, ``cache_length`` positions, as the per-call
    programs have) donated. The drafter is fed one token per call (its
    ``catch_up_widths=(1,)``, as the prices count calls) and its draft steps
    are unrolled: a compiler's cost analysis counts a loop body once. The calls
    inside: ``target_k<G+1>``, G x ``drafter_k1`` and one
    ``drafter_k1_no_head`` (the catch-up loop's body, counted once)."""
    target, target_params = models["target"]
    drafter, drafter_params = models["drafter"]
    decoder = api.make_decoder(
        target=target, drafter=ModelDrafter(drafter, catch_up_widths=(1,), unroll=True),
        gamma=gamma, verifier="token", max_new_tokens=shapes.max_new_tokens)
    prompt = Prompt(tokens=jax.ShapeDtypeStruct((shapes.batch, shapes.prompt_len), jnp.int32),
                    lengths=jax.ShapeDtypeStruct((shapes.batch,), jnp.int32))

    def start(target_params, drafter_params, prompt, key):
        prefilled = decoder.prefill(target_params, drafter_params, prompt,
                                    max_length=shapes.cache_length)
        return decoder.init_state(prefilled, key)

    state = jax.eval_shape(start, target_params, drafter_params, prompt,
                           jax.eval_shape(lambda: jax.random.PRNGKey(0)))
    caches = (state.target_cache, state.drafter_state)
    state = tpu_aot.batch_sharded(state, mesh).replace(
        target_cache=tpu_aot.kv_sharded(state.target_cache, mesh),
        drafter_state=tpu_aot.kv_sharded(state.drafter_state, mesh),
        key=tpu_aot.replicated(state.key, mesh))
    sp = tpu_aot.replicated(jax.eval_shape(api.sampling_params), mesh)

    def one_round(target_params, drafter_params, state, sp):
        return decoder.round(target_params, drafter_params, state, sp)

    return Program(one_round, (_params(target, target_params, mesh),
                               _params(drafter, drafter_params, mesh), state, sp),
                   donate_argnums=(2,),
                   weight_bytes=tpu_aot.tree_bytes(target_params) +
                   tpu_aot.tree_bytes(drafter_params), cache_bytes=tpu_aot.tree_bytes(caches),
                   note=f"one round at G = {gamma}: target_k{gamma + 1}, {gamma} x drafter_k1, "
                        "one drafter_k1_no_head, sampling and verification; steps unrolled")


def build(name: str, shapes: Shapes, mesh: Mesh, models: dict) -> Program:
    """The program ``name`` (one of ``PROGRAMS``); ``models``: ``{"target": (model,
    abstract params), "drafter": ...}`` from ``abstract_model``."""
    target, target_params = models["target"]
    drafter, drafter_params = models["drafter"]
    if name.startswith("target_k"):
        return model_step(target, target_params, shapes, mesh, int(name[len("target_k"):]))
    if name == "drafter_k1":
        return model_step(drafter, drafter_params, shapes, mesh, 1)
    if name == "drafter_k1_no_head":
        return model_step(drafter, drafter_params, shapes, mesh, 1, head=False)
    if name.startswith(ROUND):
        return round_program(models, shapes, mesh, int(name[len(ROUND):]))
    if name.startswith("target_tree_w"):
        return tree_step(target, target_params, shapes, mesh, int(name[len("target_tree_w"):]),
                         commit=True)
    if name.startswith("drafter_tree_w"):
        return tree_step(drafter, drafter_params, shapes, mesh,
                         int(name[len("drafter_tree_w"):]), commit=False)
    if name == "feature_draft_step":
        return feature_draft_step(target, target_params, shapes, mesh)
    if name == "acceptance_head":
        return acceptance_head_step(drafter, shapes, mesh)
    if name == "maxgram_step":
        return maxgram_step(target.vocab_size, shapes, mesh)
    if name == "maxgram_trie":
        return maxgram_trie(target.vocab_size, shapes, mesh)
    if name in GENERATE:
        return generate_program(name, models, shapes, mesh)
    if name in TRAINING:
        return tpu_training.build(name, shapes, mesh, DTYPE)
    raise ValueError(f"unknown program {name!r}; choose from {', '.join(PROGRAMS)}.")
