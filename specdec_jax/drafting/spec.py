"""One spelling for drafting strategies, shared by the API and the CLI.

A spec is a ``+``-separated list of drafters, largest first:

    qwen2.5-coder-0.5b                 a neural drafter, sampled autoregressively
    mag                                Max-Gram alone
    feature:<dir>                      a feature head (EAGLE-style, drafting.feature)
                                       saved in <dir> (checkpoints.feature_head_io)
    qwen2.5-coder-0.5b+mag             CS Drafting; needs a K-matrix, e.g.
        k_matrix=[[2, 10], [0, 10]]    the paper's decoder-only setting (12 drafts:
                                       2 by the 0.5B reviewing 10 Max-Gram tokens
                                       a call, then 10 by Max-Gram)
        k_matrix=[[4, 0], [0, 10]]     vertical only (0.5B reviews Max-Gram)
        k_matrix=[[2, 10], [0, 0]]     horizontal only (0.5B alone, then Max-Gram)
    feature:<dir>+mag                  the head composes like a model:
        k_matrix=[[3, 4], [0, 0]]      3 drafts from the head, then 4 from Max-Gram
        k_matrix=[[4, 0], [0, 6]]      the head reviews 6 Max-Gram tokens at a time
    qwen2.5-coder-0.5b+feature:<dir>   the 0.5B reviews the head's drafts
        k_matrix=[[4, 0], [0, 3]]

Model names are keys of the ``models`` mapping (registry names in the CLI);
``mag`` is Max-Gram, which must come last. A ``feature:<dir>`` item (the
directory may not contain '+') is a ``FeatureDrafter`` named by the whole
item; its head comes from ``feature_heads[item]`` (the caller loads it,
``checkpoints.feature_head_io.load_feature_head``), and it needs the
``target`` (decoder-only; the head reads its hidden states). Params for the
strategy come from one dict ``{name: params, "mag": bigram table, item:
feature head params}`` through ``drafter.select_params(named)``. Every error
is raised here, before anything is traced or compiled.
"""

from __future__ import annotations

from collections.abc import Mapping

from specdec_jax.drafting.cs_drafting import cs_drafter
from specdec_jax.drafting.feature import FeatureDrafter
from specdec_jax.drafting.maxgram import DEFAULT_MAX_NGRAM, MaxGramDrafter
from specdec_jax.drafting.model_drafter import ModelDrafter
from specdec_jax.models.feature_head import FeatureHead
from specdec_jax.models.interface import LanguageModel, is_encoder_decoder

MAG = "mag"
FEATURE_PREFIX = "feature:"


def feature_path(item: str) -> str | None:
    """The head directory a ``feature:<dir>`` item names; None for other items."""
    return item[len(FEATURE_PREFIX):] if item.startswith(FEATURE_PREFIX) else None


def parse_spec(spec: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in spec.split("+"))
    if not spec.strip() or any(not n for n in names):
        raise ValueError(f"draft spec {spec!r} has an empty item; write drafters largest "
                         "first joined by '+', e.g. 'qwen2.5-coder-0.5b+mag'.")
    if len(set(names)) != len(names):
        raise ValueError(f"draft spec {spec!r} names a drafter twice; list each once.")
    if MAG in names[:-1]:
        raise ValueError(f"draft spec {spec!r}: Max-Gram ('mag') cannot review other drafters; "
                         "list it last.")
    for name in names:
        if feature_path(name) is not None and not feature_path(name).strip():
            raise ValueError(f"draft spec {spec!r}: {name!r} names no directory; write "
                             f"'{FEATURE_PREFIX}<directory of a saved feature head>'.")
    return names


def _feature_drafter(name: str, spec: str, feature_heads: Mapping[str, FeatureHead],
                     vocab_size: int, target) -> FeatureDrafter:
    """The ``FeatureDrafter`` of a ``feature:<dir>`` item, checked against the target."""
    head = feature_heads.get(name)
    if not isinstance(head, FeatureHead):
        raise ValueError(f"draft spec {spec!r} names the feature head {name!r} but "
                         "feature_heads holds no FeatureHead for it; load it with "
                         "checkpoints.feature_head_io.load_feature_head and pass "
                         "feature_heads={item: drafter.head}.")
    if target is None:
        raise ValueError(f"{name!r} drafts from the target's hidden states: pass "
                         "target=<the target model> so the head can be checked against it.")
    if is_encoder_decoder(target):
        raise ValueError(f"{name!r} reads a decoder-only target's hidden states; the target "
                         f"{type(target).__name__} is an encoder-decoder model.")
    if head.config.vocab_size != vocab_size:
        raise ValueError(f"feature head {name!r} has vocabulary {head.config.vocab_size} but "
                         f"the target has {vocab_size}; it was trained for another target.")
    hidden = getattr(getattr(target, "config", None), "hidden_size", None)
    if hidden is not None and hidden != head.config.feature_size:
        raise ValueError(f"feature head {name!r} predicts {head.config.feature_size}-wide "
                         f"features but the target's hidden size is {hidden}; it was trained "
                         "for another target.")
    return FeatureDrafter(head, name=name)


def make_drafter(spec: str, *, models: Mapping[str, LanguageModel], vocab_size: int,
                 k_matrix=None, max_ngram: int = DEFAULT_MAX_NGRAM,
                 feature_heads: Mapping[str, FeatureHead] | None = None,
                 target: LanguageModel | None = None):
    """The drafting strategy a spec names (module docstring). ``feature_heads``
    and ``target`` are needed only by ``feature:<dir>`` items."""
    names = parse_spec(spec)
    leaves = []
    for name in names:
        if name == MAG:
            leaves.append(MaxGramDrafter(vocab_size, max_ngram=max_ngram))
        elif feature_path(name) is not None:
            leaves.append(_feature_drafter(name, spec, feature_heads or {}, vocab_size, target))
        elif name in models:
            model = models[name]
            if model.vocab_size != vocab_size:
                raise ValueError(f"drafter {name!r} has vocabulary {model.vocab_size} but the "
                                 f"target has {vocab_size}; every drafter must share the "
                                 "target's tokenizer.")
            leaves.append(ModelDrafter(model, name=name))
        else:
            known = ", ".join(sorted(models)) or "none loaded"
            raise ValueError(f"unknown drafter {name!r} in draft spec {spec!r}; use 'mag', "
                             f"'{FEATURE_PREFIX}<dir>' or a model name ({known}).")
    if k_matrix is None:
        if len(leaves) > 1:
            raise ValueError(f"draft spec {spec!r} lists {len(leaves)} drafters: pass a "
                             "K-matrix saying how they compose, e.g. [[2, 10], [0, 10]] "
                             "(--k-matrix).")
        return leaves[0]
    return cs_drafter(k_matrix, leaves)
