"""One spelling for drafting strategies, shared by the API and the CLI.

A spec is a ``+``-separated list of drafters, largest first:

    qwen2.5-coder-0.5b                 a neural drafter, sampled autoregressively
    mag                                Max-Gram alone
    qwen2.5-coder-0.5b+mag             CS Drafting; needs a K-matrix, e.g.
        k_matrix=[[2, 10], [0, 10]]    the seed's decoder-only setting (12 drafts:
                                       2 by the 0.5B reviewing 10 Max-Gram tokens
                                       a call, then 10 by Max-Gram)
        k_matrix=[[4, 0], [0, 10]]     vertical only (0.5B reviews Max-Gram)
        k_matrix=[[2, 10], [0, 0]]     horizontal only (0.5B alone, then Max-Gram)

Model names are keys of the ``models`` mapping (registry names in the CLI);
``mag`` is Max-Gram, which must come last. Params for the strategy come from
one dict ``{name: params, "mag": bigram table}`` through
``drafter.select_params(named)``. Every error is raised here, before anything
is traced or compiled.
"""

from __future__ import annotations

from collections.abc import Mapping

from specdec_jax.drafting.cascade import cs_drafter
from specdec_jax.drafting.maxgram import DEFAULT_MAX_NGRAM, MaxGramDrafter
from specdec_jax.drafting.model import ModelDrafter
from specdec_jax.models.interface import LanguageModel

MAG = "mag"


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
    return names


def make_drafter(spec: str, *, models: Mapping[str, LanguageModel], vocab_size: int,
                 k_matrix=None, max_ngram: int = DEFAULT_MAX_NGRAM):
    """The drafting strategy a spec names (module docstring)."""
    names = parse_spec(spec)
    leaves = []
    for name in names:
        if name == MAG:
            leaves.append(MaxGramDrafter(vocab_size, max_ngram=max_ngram))
        elif name in models:
            model = models[name]
            if model.vocab_size != vocab_size:
                raise ValueError(f"drafter {name!r} has vocabulary {model.vocab_size} but the "
                                 f"target has {vocab_size}; every drafter must share the "
                                 "target's tokenizer.")
            leaves.append(ModelDrafter(model, name=name))
        else:
            known = ", ".join(sorted(models)) or "none loaded"
            raise ValueError(f"unknown drafter {name!r} in draft spec {spec!r}; use 'mag' or "
                             f"a model name ({known}).")
    if k_matrix is None:
        if len(leaves) > 1:
            raise ValueError(f"draft spec {spec!r} lists {len(leaves)} drafters: pass a "
                             "K-matrix saying how they compose, e.g. [[2, 10], [0, 10]] "
                             "(--k-matrix).")
        return leaves[0]
    return cs_drafter(k_matrix, leaves)
