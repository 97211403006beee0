"""The training steps the TPU compile job compiles, built from shapes alone.

One program per recipe of ``specdec_jax.training``, each the library's own
``steps.make_train_step`` (loss, gradients, optimizer update) jitted as the
training loop jits it (the train state donated), with the recipe's optimizer:

- ``train_t5_large`` / ``train_t5_small``: T5 fine-tuning of the project's pair
  (``training.t5_pair``'s ``t5-cpu`` sizes, translation lengths, dropout 0.1,
  Adafactor with t5x's inverse-square-root schedule);
- ``train_distill_t5``: the pair's distillation (small student, large teacher,
  total-variation loss, AdamW); ``train_distill_qwen``: the same loss for the
  real pair (the 0.5B student, the 1.5B teacher as a frozen argument);
- ``train_acceptance_head``: SpecDec++'s head on the 0.5B drafter's hidden
  states (float32, depth 3, AdamW);
- ``train_feature_head``: the EAGLE-style head of the 1.5B target on windows
  of its features (AdamW, clipping 0.5, b2 0.95), the target's embedding and
  head rows frozen arguments.

Models train in the layout they are initialised in (``[in, out]`` kernels,
``sharding.rules_for``); parameters and optimizer moments are split by the
same rules over ``model`` (Megatron style), batches along ``data``; the heads
are replicated as their recipes place them. Every leaf is bfloat16 except the
acceptance head (a float32 head, as trained) and the optimizer's counters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_jax import precision
from specdec_jax.checkpoints import registry
from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.models import feature_head
from specdec_jax.models.decoder_only import DecoderOnlyLM
from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM
from specdec_jax.runtime import sharding
from specdec_jax.training import acceptance_training as head_train
from specdec_jax.training import distill, recipes, steps
from specdec_jax.training import feature_training as feature_train
from specdec_jax.training.forward import Batch, lm_loss
from specdec_jax.training.optimizers import OptimizerConfig, make_optimizer

T5_PAIR = "t5-cpu"  # training.t5_pair.PAIRS: the project's T5 pair
T5_TASK = "translation_en_de"
T5_VOCAB = 8000 + 100  # recipes.vocabulary's default: 8 000 pieces + 100 sentinels
T5_DROPOUT = 0.1  # the pair's translation recipe
T5_OPTIMIZER = OptimizerConfig(name="adafactor", learning_rate=0.01, schedule="rsqrt",
                               warmup_steps=200)
DISTILL_OPTIMIZER = OptimizerConfig(name="adamw", learning_rate=1e-3)  # run_distillation's
# acceptance_training.train_head's optimizer:
HEAD_OPTIMIZER = OptimizerConfig(name="adamw", learning_rate=5e-5, schedule="cosine",
                                 total_steps=1000, weight_decay=0.0)
FEATURE_OPTIMIZER = OptimizerConfig(name="adamw", learning_rate=3e-4, schedule="cosine",
                                    warmup_steps=20, total_steps=1000, clip_norm=0.5,
                                    b2=0.95)  # feature_training.train_feature_head
REPLICATED = ((r".*", PartitionSpec()),)

TRAINING = ("train_t5_large", "train_t5_small", "train_distill_t5", "train_distill_qwen",
            "train_acceptance_head", "train_feature_head")


def t5_member(role: str, dtype: str) -> tuple[T5EncoderDecoderLM, dict]:
    """``(model, abstract params)`` of the pair's ``large`` or ``small`` T5 in ``dtype``."""
    size = recipes.T5_SIZES[f"t5-{role}-cpu"]
    model = T5EncoderDecoderLM(T5Config(vocab_size=T5_VOCAB, dropout_rate=T5_DROPOUT,
                                        dtype=dtype, param_dtype=dtype, **size))
    return model, jax.eval_shape(model.init_params, jax.random.PRNGKey(0))


def decoder(architecture: str, dtype: str) -> tuple[DecoderOnlyLM, dict]:
    """``(model, abstract params)`` of a registry architecture as training builds it."""
    dtype = precision.resolve_dtype(dtype)
    model = DecoderOnlyLM(decoder_config_from_hf(
        registry.architecture(architecture), dtype=dtype, param_dtype=dtype,
        matmul_precision=precision.matmul_precision(dtype)))
    return model, jax.eval_shape(model.init_params, jax.random.PRNGKey(0))


def state_specs(state, params, mesh: Mesh, rules):
    """Shardings of a train state: each parameter by ``rules``; each optimizer
    leaf like the parameter whose path its own path ends with when the shapes
    match (AdamW's moments), else replicated (Adafactor's factored rows and
    columns, counters); the step and key replicated."""
    param_specs = sharding.param_specs(params, mesh, rules)
    by_path = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        by_path[_name(path)] = (np.shape(leaf), None)
    for path, spec in jax.tree_util.tree_flatten_with_path(param_specs)[0]:
        by_path[_name(path)] = (by_path[_name(path)][0], spec)
    replicated = NamedSharding(mesh, PartitionSpec())

    def spec_of(path, leaf):
        name = _name(path)
        for param_name, (shape, spec) in by_path.items():
            if (name == param_name or name.endswith("/" + param_name)) and \
                    np.shape(leaf) == shape:
                return spec
        return replicated

    return jax.tree_util.tree_map_with_path(spec_of, state)


def _name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
                    for k in path)


def abstract_state(params, optimizer: OptimizerConfig, mesh: Mesh, rules):
    """The train state of ``params`` (abstract) with shardings (``state_specs``)."""
    state = jax.eval_shape(lambda p: steps.init_state(p, make_optimizer(optimizer),
                                                      jax.random.PRNGKey(0)), params)
    specs = state_specs(state, params, mesh, rules)
    return jax.tree_util.tree_map(
        lambda leaf, spec: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=spec),
        state, specs)


def _spec(x, dtype=None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x, jnp.dtype(dtype or jnp.int32))


def build(name: str, shapes, mesh: Mesh, dtype: str):
    """The training program ``name`` (one of ``TRAINING``) for ``shapes``
    (``tpu_programs.Shapes``: ``train_batch`` rows, ``train_length`` tokens for
    the decoder-only programs, ``target`` / ``drafter`` architectures)."""
    b = shapes.train_batch
    extras, extras_bytes = None, 0
    if name.startswith("train_t5_") or name == "train_distill_t5":
        inputs, targets = recipes_lengths()
        batch = Batch(targets=_spec((b, targets)), weights=_spec((b, targets), jnp.float32),
                      inputs=_spec((b, inputs)), input_lengths=_spec((b,)))
        if name == "train_distill_t5":
            model, params = t5_member("small", dtype)
            teacher, teacher_params = t5_member("large", dtype)
            loss_fn, optimizer = distill.make_distillation_loss(teacher), DISTILL_OPTIMIZER
            extras = sharding.abstract_params(teacher_params, mesh, sharding.rules_for(teacher))
            extras_bytes = tpu_aot.tree_bytes(teacher_params)
            note = f"T5 {T5_PAIR} small distilled from large (TVD), batch {b}"
        else:
            role = name[len("train_t5_"):]
            model, params = t5_member(role, dtype)
            loss_fn, optimizer = lm_loss, T5_OPTIMIZER
            note = f"T5 {T5_PAIR}-{role} fine-tuning ({T5_TASK}), Adafactor, batch {b}"
        rules = sharding.rules_for(model)
    elif name == "train_distill_qwen":
        length = shapes.train_length
        model, params = decoder(shapes.drafter, dtype)
        teacher, teacher_params = decoder(shapes.target, dtype)
        batch = Batch(targets=_spec((b, length)), weights=_spec((b, length), jnp.float32))
        loss_fn, optimizer = distill.make_distillation_loss(teacher), DISTILL_OPTIMIZER
        rules = sharding.rules_for(model)
        extras = sharding.abstract_params(teacher_params, mesh, sharding.rules_for(teacher))
        extras_bytes = tpu_aot.tree_bytes(teacher_params)
        note = (f"{shapes.drafter} distilled from {shapes.target} (TVD), AdamW, "
                f"batch {b} x {length} tokens")
    elif name == "train_acceptance_head":
        hidden = registry.architecture(shapes.drafter)["hidden_size"]
        model = AcceptanceHead(HeadConfig(hidden_size=hidden, depth=3))
        params = jax.eval_shape(model.init_params, jax.random.PRNGKey(0))
        batch = head_train.FeatureBatch(features=_spec((b, hidden), jnp.float32),
                                        labels=_spec((b,), jnp.float32),
                                        weights=_spec((b,), jnp.float32))
        loss_fn, optimizer, rules = head_train.make_head_loss(), HEAD_OPTIMIZER, REPLICATED
        note = f"SpecDec++ head (float32, depth 3) on {shapes.drafter} states, batch {b}"
    elif name == "train_feature_head":
        length = shapes.train_length
        target, target_params = decoder(shapes.target, dtype)
        model = feature_head.FeatureHead(feature_head.FeatureHeadConfig.for_target(target))
        params = jax.eval_shape(model.init_net, jax.random.PRNGKey(0))
        params = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype)), params)
        d = target.config.hidden_size
        batch = feature_train.SequenceBatch(
            tokens=_spec((b, length)), features=_spec((b, length, d), dtype),
            first_prev=_spec((b, d), dtype), weights=_spec((b, length), jnp.float32))
        frozen = jax.eval_shape(lambda p: feature_train.frozen_inputs(target, p),
                                target_params)
        extras = tpu_aot.replicated(frozen, mesh)  # as train_feature_head places them
        extras_bytes = tpu_aot.tree_bytes(frozen)  # two arguments, even where tied
        loss_fn, optimizer, rules = feature_train.make_loss(), FEATURE_OPTIMIZER, REPLICATED
        note = (f"feature head of {shapes.target}, AdamW, batch {b} x {length} positions; "
                "the target's embedding and head rows frozen")
    else:
        raise ValueError(f"unknown training program {name!r}; choose from "
                         f"{', '.join(TRAINING)}.")
    check_batch(b, mesh, name)
    state = abstract_state(params, optimizer, mesh, rules)
    step = steps.make_train_step(model, make_optimizer(optimizer), loss_fn)
    data = tpu_aot.batch_sharded(batch, mesh)
    return tpu_aot.Program(step, (state, data, extras), donate_argnums=(0,),
                   weight_bytes=tpu_aot.tree_bytes(params) + extras_bytes,
                   note=note + "; floor: weights (and frozen inputs) read once")


def recipes_lengths() -> tuple[int, int]:
    """(input, target) lengths of the pair's translation recipe."""
    from specdec_jax.training import t5_pair  # noqa: PLC0415

    return t5_pair.PAIRS[T5_PAIR].lengths[T5_TASK]


def check_batch(batch: int, mesh: Mesh, name: str) -> None:
    shards = mesh.shape[sharding.DATA]
    if batch % shards:
        raise ValueError(f"{name}: train_batch {batch} is not divisible by the data axis "
                         f"({shards}); choose a multiple of it.")

