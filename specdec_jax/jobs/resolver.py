"""The one model resolver: a name in, ``(model, params, tokenizer)`` out.

Every job, benchmark and the command line turn model names into models here,
so a name means the same thing everywhere. A name belongs to the first
*family* that claims it:

- ``toy-bytes-small``, ``toy-bytes-large``: random decoders over UTF-8 bytes
  (CI runs whole pipelines on them in seconds; their quality means nothing);
- ``random:<architecture>[:<seed>]``: random weights of a registered
  architecture's exact shapes (``registry.ARCHITECTURES``), for timing where the
  real weights are not at hand;
- ``<pair>-<role>:<task>``, e.g. ``t5-cpu-large:translation_en_de``: the
  project's own T5 pair members, trained on first use (``training.t5_pair``);
- a registry name (``registry.MODELS``, fetched on first use), a ``.gguf``
  file or a Hugging Face safetensors directory (``checkpoints.load``).

Families are pluggable: ``register_family`` adds one (first claim wins, so a
user's family can take names before the built-in ones).

The tokenizer has ``encode(text) -> ids``, ``decode(ids) -> text``,
``eos_token_ids`` and ``fingerprint`` (equal fingerprints: one vocabulary);
random weights come with none (``None``).
With a ``mesh``, params come back placed on it by the model's sharding rules.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax

from specdec_jax import precision
from specdec_jax.checkpoints import load, registry
from specdec_jax.checkpoints.tokenizer import ByteTokenizer
from specdec_jax.data import bigram
from specdec_jax.data.humaneval import end_of_block_stop
from specdec_jax.decode.round import EndOfBlockStop
from specdec_jax.drafting import head_vocab
from specdec_jax.models import weight_storage
from specdec_jax.models.decoder_only import DecoderConfig, DecoderOnlyLM, with_kernel_layout
from specdec_jax.models.interface import is_encoder_decoder
from specdec_jax.models.layers import OUT_IN
from specdec_jax.runtime import sharding
from specdec_jax.training import t5_pair

RANDOM_PREFIX = "random:"
# name -> (layers, width, seed) of the byte-level toy decoders.
TOY_MODELS = {"toy-bytes-small": (1, 32, 0), "toy-bytes-large": (2, 64, 1)}


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """A kind of model name and how to load it.

    ``load(name, *, dtype, mesh, kernel_layout)`` returns ``(model, params,
    tokenizer)``. A family that reads its params onto a mesh itself (each
    process reading only its slices) says ``places_on_mesh``; for the others
    ``resolve`` places the loaded params.
    """

    name: str
    claims: Callable[[str], bool]
    load: Callable[..., tuple[Any, Any, Any]]
    examples: Sequence[str]  # names shown when nothing claims a name
    places_on_mesh: bool = False


_FAMILIES: list[ModelFamily] = []


def register_family(family: ModelFamily, *, first: bool = False) -> None:
    """Adds a family (``first``: ahead of the others, so it may take their names)."""
    global _FAMILIES
    others = [f for f in _FAMILIES if f.name != family.name]
    _FAMILIES = [family, *others] if first else [*others, family]


def family_of(name: str) -> ModelFamily:
    """The family that claims ``name``; an unknown name fails with the known ones."""
    for family in _FAMILIES:
        if family.claims(name):
            return family
    known = ", ".join(example for family in _FAMILIES for example in family.examples)
    raise ValueError(f"unknown model {name!r}: not a known name ({known}) nor an existing path "
                     "to a .gguf file or a Hugging Face directory.")


def resolve(name: str, *, dtype: str = "auto", mesh=None, kernel_layout: str = OUT_IN,
            weights: str = "f32") -> tuple[Any, Any, Any]:
    """``(model, params, tokenizer)`` for ``name``.

    ``dtype``: ``"auto"`` is float32 on CPU and bfloat16 on accelerators
    (checkpoint decoders; toys and T5 members keep the dtype they were built
    with); a named dtype holds for every family (``in_dtype``). ``kernel_layout``
    applies to checkpoint decoders: ``"out_in"`` (the
    default) is the decode layout (``api.decode_layout``), ``"in_out"`` keeps
    the loaded tree. ``mesh``: params placed on it by the sharding rules.
    ``weights="stored"``: a GGUF checkpoint keeps its matrices in the file's
    blocks (``load.load_for_decoding``); other families refuse it.
    """
    family = family_of(name)
    if weights != "f32" and family.name != "checkpoint":
        raise ValueError(f"weights={weights!r} keeps a GGUF file's blocks; {name} is a "
                         f"{family.name} model: pass weights='f32'.")
    extra = {} if weights == "f32" else {"weights": weights}
    model, params, tokenizer = family.load(name, dtype=dtype, mesh=mesh,
                                           kernel_layout=kernel_layout, **extra)
    model, params = in_dtype(model, params, dtype)
    if mesh is not None and not family.places_on_mesh:
        params = sharding.shard_params(params, mesh, sharding.rules_for(model))
    return model, params, tokenizer


def in_dtype(model, params, dtype: str):
    """``(model, params)`` in ``dtype``. Checkpoint families load in it; the
    toys and the T5 pair's members are built as they were made (float32), so a
    named dtype recasts them here (``auto`` keeps them as built)."""
    config = getattr(model, "config", None)
    if dtype == precision.AUTO or getattr(config, "dtype", dtype) == dtype:
        return model, params
    if not (dataclasses.is_dataclass(model) and hasattr(config, "param_dtype")):
        raise ValueError(f"dtype {dtype}: {type(model).__name__} has no number format to "
                         "set; use dtype auto.")
    config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
    params = jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x,
        params)
    return dataclasses.replace(model, config=config), params


def known_vocab_size(name: str) -> int | None:
    """The vocabulary size a name will load with, when known without loading
    anything (registry metadata, random architectures, toys); else None."""
    if name in TOY_MODELS:
        return ByteTokenizer.VOCAB_SIZE
    if name.startswith(RANDOM_PREFIX):
        return registry.architecture(parse_random(name)[0])["vocab_size"]
    if name in registry.ARCHITECTURES:
        return registry.ARCHITECTURES[name]["vocab_size"]
    return None


def _load_toy(name: str, **_) -> tuple[DecoderOnlyLM, Any, ByteTokenizer]:
    layers, width, seed = TOY_MODELS[name]
    config = DecoderConfig(vocab_size=ByteTokenizer.VOCAB_SIZE, hidden_size=width,
                           intermediate_size=2 * width, num_layers=layers, num_heads=4,
                           num_kv_heads=2)
    model = DecoderOnlyLM(config)
    return model, model.init_params(jax.random.PRNGKey(seed)), ByteTokenizer()


def parse_random(name: str) -> tuple[str, int]:
    """``random:<architecture>[:<seed>]`` -> (architecture, seed)."""
    architecture, _, seed = name[len(RANDOM_PREFIX):].partition(":")
    if architecture not in registry.ARCHITECTURES or (seed and not seed.isdigit()):
        raise ValueError(f"{name!r}: random weights take a registered architecture and an "
                         f"optional seed, random:<architecture>[:<seed>], with architecture "
                         f"one of {', '.join(registry.ARCHITECTURES)}.")
    return architecture, int(seed or 0)


def _load_random(name: str, *, dtype: str, kernel_layout: str, **_):
    architecture, seed = parse_random(name)
    model, params = load.random_model(architecture, dtype, seed=seed)
    return (*with_kernel_layout(model, params, kernel_layout), None)


def _load_t5_member(name: str, **_):
    return t5_pair.load_member(name)


def _load_checkpoint(name: str, *, dtype: str, mesh, kernel_layout: str, weights: str = "f32"):
    return load.load_for_decoding(name, dtype=dtype, mesh=mesh, kernel_layout=kernel_layout,
                                  weights=weights)


def _is_checkpoint(name: str) -> bool:
    return name in registry.MODELS or pathlib.Path(name).expanduser().exists()


for _family in (
        ModelFamily("toy", TOY_MODELS.__contains__, _load_toy, tuple(TOY_MODELS)),
        ModelFamily("random", lambda name: name.startswith(RANDOM_PREFIX), _load_random,
                    (f"{RANDOM_PREFIX}<architecture>[:<seed>]",)),
        ModelFamily("t5-pair", t5_pair.is_member, _load_t5_member,
                    ("<pair>-<role>:<task> (e.g. t5-cpu-large:translation_en_de)",)),
        ModelFamily("checkpoint", _is_checkpoint, _load_checkpoint, tuple(registry.MODELS),
                    places_on_mesh=True)):
    register_family(_family)


@dataclasses.dataclass(frozen=True)
class ModelPair:
    """What a study runs (``load_pair``): the two models, their params and the
    text interface."""

    target: Any
    target_params: Any
    drafter: Any
    drafter_params: Any
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    eos_ids: tuple[int, ...] = ()
    stop_rule: EndOfBlockStop | None = None
    names: tuple[str, str] = ("target", "drafter")
    # A (data, model) mesh the params are placed on (``resolver.load_pair(mesh=...)``),
    # possibly spanning processes; None: one device.
    mesh: Any = None


def load_pair(*, target: str, drafter: str, dtype: str = "auto",
              stop_at_block_end: bool = False, mesh=None,
              drafter_head_vocab: int = 0, draft_weights: str = "f32") -> ModelPair:
    """The two models of a study (names this module resolves) with their
    text interface; with a ``mesh`` (``job_mesh``), both models' params placed
    on it by the sharding rules. ``drafter_head_vocab`` > 0 cuts a decoder-only
    drafter's output head to that many of the most frequent tokens
    (``drafting.head_vocab``: exact, cheaper drafting steps; 0, the default,
    keeps the papers' full drafter). ``draft_weights``: how a decoder-only
    drafter stores its weights (``models.weight_storage``: f32, bf16, int8;
    exact whatever the format)."""
    head_vocab.check_size(drafter_head_vocab, f"drafter_head_vocab={drafter_head_vocab}")
    weight_storage.check_format(draft_weights)
    if drafter_head_vocab and mesh is not None:
        raise ValueError("drafter_head_vocab with a mesh: the restricted head has no sharding "
                         "rule yet; pass drafter_head_vocab=0 for sharded jobs.")
    families = {role: family_of(name).name
                for role, name in (("target", target), ("drafter", drafter))}
    if families["target"] == families["drafter"] == "t5-pair":
        (_, _, target_task), (_, _, drafter_task) = map(t5_pair.parse_member, (target, drafter))
        if target_task != drafter_task:
            raise ValueError(f"{target} and {drafter} were trained for different tasks; pick "
                             "two members of one pair and task.")
    t, tp, tok = resolve(target, dtype=dtype, mesh=mesh)
    d, dp, drafter_tok = resolve(drafter, dtype=dtype, mesh=mesh)
    if (getattr(tok, "fingerprint", None) != getattr(drafter_tok, "fingerprint", None)
            or t.vocab_size != d.vocab_size):
        raise ValueError(f"{drafter} ({d.vocab_size} tokens) and {target} ({t.vocab_size}) "
                         "do not share a vocabulary (tokenizer); pick a drafter of the "
                         "target's family.")
    if draft_weights != "f32":
        if not isinstance(d, DecoderOnlyLM):
            raise ValueError(f"draft_weights={draft_weights!r} applies to decoder-only drafters; "
                             f"{drafter} is not one: pass draft_weights='f32'.")
        dp = weight_storage.store_weights(dp, draft_weights, kernel_layout=d.config.kernel_layout)
        d = weight_storage.with_prefill_for(d, draft_weights)
    if drafter_head_vocab:
        d, dp = bigram.restrict_head(d, dp, drafter_head_vocab, eos_ids=tok.eos_token_ids,
                                     table=bigram.table_for(bigram.AUTO, tok, d.vocab_size))
    encode = tok.encode
    if is_encoder_decoder(t):  # T5 inputs end with EOS
        encode = lambda text: tok.encode(text) + [tok.eos_id]  # noqa: E731
    # The in-loop end-of-block stop reads code tokenizers' token texts; the toys'
    # bytes and the T5 pair's sentencepieces have none to read.
    stop_rule = (end_of_block_stop(tok)
                 if stop_at_block_end and families["target"] == "checkpoint" else None)
    return ModelPair(
        target=t, target_params=tp, drafter=d, drafter_params=dp, encode=encode,
        decode=tok.decode, eos_ids=tuple(tok.eos_token_ids), stop_rule=stop_rule,
        names=(target, drafter), mesh=mesh)
