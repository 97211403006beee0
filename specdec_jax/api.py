"""Public entry points: ``generate`` (one call) and ``make_generate_fn`` (a jitted
callable for pipelines).

Example (toy models; any model implementing the interface works)::

    import jax, specdec_jax as sj
    cfg = sj.DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                           num_layers=2, num_heads=4, num_kv_heads=2)
    target = drafter = sj.DecoderOnlyLM(cfg)
    params = target.init_params(jax.random.PRNGKey(0))
    out = sj.generate(target=target, target_params=params, drafter=drafter,
                      drafter_params=params, prompts=[[1, 2, 3]], method="specdecode",
                      gamma=4, max_new_tokens=16, temperature=0.0)
    out.tokens, out.lengths, out.stats.target_calls
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling, target_functions
from specdec_jax.cascade_baselines import MAX_CONSECUTIVE_DRAFTS, MODES, DraftUntilDecoder
from specdec_jax.decoding import (
    MIN_SCRATCH,
    AutoregressiveDecoder,
    EndOfBlockStop,
    GenerationOutput,
    SpeculativeDecoder,
    required_cache_length,
)
from specdec_jax.drafting import ModelDrafter, drafter_gamma, is_drafter
from specdec_jax.models.decoder_only import DecoderOnlyLM, with_kernel_layout
from specdec_jax.models.interface import LanguageModel, Prompt, check_tokens, make_prompt
from specdec_jax.models.layers import OUT_IN
from specdec_jax.sampling import SamplingParams
from specdec_jax.tree_decoding import (
    TreeDecoder,
    TreeSpec,
    check_greedy_temperature,
    is_tree_drafter,
    make_tree_drafter,
)
from specdec_jax.verify import get_verifier, requested_draws

DEFAULT_GAMMA = 5
# The kinds of decoder, one round structure each (``DecoderSpec.kind``).
AUTOREGRESSIVE = "autoregressive"  # the target alone, a token a step
CHAIN = "chain"  # draft G, score G + 1, verify a chain (decoding.SpeculativeDecoder)
TREE = "tree"  # draft a token tree, score it in one call (tree_decoding.TreeDecoder)
ORACLE = "oracle"  # a G = 0 round with the Diff rule: both models at every position
DRAFT_UNTIL = "draft-until"  # the drafter runs until a rule calls the target
#                              (cascade_baselines.DraftUntilDecoder)


def decode_layout(model: LanguageModel, params: Any) -> tuple[LanguageModel, Any]:
    """``(model, params)`` in the layout decoding runs fastest with: a
    decoder-only model's dense kernels stored ``[out, in]``
    (``models.decoder.with_kernel_layout``; on 2 CPU cores a 6-token scoring
    call of the 1.5B model costs about 1.7x less); other models as they are.
    Same outputs; call it once after loading, before decoding::

        target, target_params = sj.decode_layout(*load_model("qwen2.5-coder-1.5b")[:2])
    """
    if isinstance(model, DecoderOnlyLM):
        return with_kernel_layout(model, params, OUT_IN)
    return model, params


def _check_pair(target: LanguageModel, drafter) -> None:
    if drafter is None:
        return
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"drafter vocabulary ({drafter.vocab_size}) differs from the target's "
            f"({target.vocab_size}); speculative decoding needs one shared tokenizer. "
            "Pick a drafter from the target's family.")
    models = [drafter.model] if isinstance(drafter, ModelDrafter) else \
        [] if is_drafter(drafter) else [drafter]
    for model in models:
        _check_same_kind(target, model)


def _check_same_kind(target: LanguageModel, drafter: LanguageModel) -> None:
    start = (getattr(target, "decoder_start_token_id", None),
             getattr(drafter, "decoder_start_token_id", None))
    if (start[0] is None) != (start[1] is None):
        raise ValueError("drafter and target must both be decoder-only or both "
                         "encoder-decoder models.")


def make_decoder(*, target: LanguageModel, drafter: Any = None,
                 method: str = "specdecode", gamma: int | None = None,
                 verifier: str | None = None, max_new_tokens: int = 64, top_k: int = 0,
                 eos_ids: Sequence[int] = (), pad_id: int = 0, fallback_alpha: float = 0.5,
                 stop_rule: EndOfBlockStop | None = None, rounds_per_sync: int = 1,
                 tree: Any = None
                 ) -> SpeculativeDecoder | AutoregressiveDecoder | DraftUntilDecoder | TreeDecoder:
    """The validated static decoder behind ``make_generate_fn`` (same arguments).

    Use it directly to prefill once and decode many configurations, e.g. a
    verifier or gamma sweep over one prompt set::

        big = make_decoder(target=t, drafter=d, gamma=8, max_new_tokens=64)
        prefilled = jax.jit(big.prefill)(t_params, d_params, prompt)
        for g in (4, 6, 8):
            dec = make_decoder(target=t, drafter=d, gamma=g, max_new_tokens=64)
            out = jax.jit(dec.decode)(t_params, d_params, prefilled, key, sp)

    (A prefill serves any decoder whose gamma and max_new_tokens fit its caches.)

    Which decoder a request makes is decided once, by ``decoder_spec``: a
    typed ``DecoderSpec`` (its kind: autoregressive, chain, tree, oracle or
    draft-until; its target function, verifier, draft length and tree).

    ``drafter`` is a ``LanguageModel`` (sampled autoregressively) or any
    drafting strategy (``specdec_jax.drafting``: Max-Gram, cascades; see
    ``make_drafter`` for the spec strings). ``gamma`` defaults to 5, or to the
    block length a K-matrix fixes (a different explicit gamma is an error).

    The cascade baselines (``cascade_baselines.py``): ``oracle`` is a ``G = 0`` round
    with the Diff rule (both models at every position); ``token-cascade``
    (Chow) and ``bild-original`` let the drafter run up to ``gamma`` tokens
    (default 10, the paper's cap) before the target is called;
    ``fallback_alpha`` is BiLD's fallback threshold. ``stop_rule`` ends rows
    besides ``eos_ids`` (e.g. at the end of a Python function).

    ``rounds_per_sync`` (default 1): rounds run between two reads of the loop's
    condition (``decoding.loop_until_done``); on a GPU, where each read is a
    host round trip, a few (4-8) save that wait per round. Outputs are
    identical for every value.

    ``verifier``: chains ``token`` (the default), ``block`` or ``block-seed``.

    ``tree`` drafts a token tree per round instead of a chain
    (``tree_decoding``): widths per depth (``(3, 2, 1, 1)``, ``[3, 2, 1, 1]``
    or ``"3,2,1,1"``, a static tree), ``"dynamic:DEPTH,EXPAND,CHILDREN"``
    (EAGLE-2's dynamic tree), or any static shape by its parents
    (``"parents:-1,-1,0"``, a ``TreeShape`` or ``TreeSpec``), from a
    decoder-only drafter model or Max-Gram; or pass a tree drafter
    (``drafting.tree``) as ``drafter`` with ``tree=None``. The verifier is
    then a tree verifier (``TREE_VERIFIERS``): ``traversal`` (the default;
    ``block`` names it too), ``rrs`` (``token``), ``rrs-replacement`` (RRS
    over children drawn with replacement, SpecInfer's trees: the drafter
    draws so) or ``greedy``, which decodes the target's argmax path whatever
    the temperature (T = 0 only; ``generate`` and the CLI refuse it above).
    ``gamma`` does not apply. Every pairing accepted here is exact at T > 0.
    """
    return _make_decoder(target=target, drafter=drafter, method=method, gamma=gamma,
                         verifier=verifier, max_new_tokens=max_new_tokens, top_k=top_k,
                         eos_ids=tuple(int(e) for e in eos_ids), pad_id=pad_id,
                         fallback_alpha=fallback_alpha, stop_rule=stop_rule,
                         rounds_per_sync=rounds_per_sync,
                         tree=None if tree is None else TreeSpec.parse(tree))


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    """What one decoder is made of, resolved once from ``make_decoder``'s
    arguments (``decoder_spec``): its ``kind``, the target function its
    rounds apply, its verifier strategy, its draft length (a chain's G, the
    draft-until cap) and its tree. Hashable, like the decoders it builds."""

    method: str
    kind: str
    target_fn: target_functions.TargetFunction | None = None
    verifier: Any = None
    gamma: int = 0
    tree: TreeSpec | None = None


def decoder_spec(method: str, *, drafter: Any, gamma: int | None = None,
                 verifier: str | None = None, tree: TreeSpec | None = None) -> DecoderSpec:
    """The ``DecoderSpec`` of a request, with every error it can raise before
    a model is touched: an unknown method or verifier, a tree where none
    applies, a gamma that conflicts with the drafter or the tree."""
    if method not in target_functions.METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of "
                         f"{', '.join(target_functions.METHODS)}.")
    if method == AUTOREGRESSIVE:
        if tree is not None:
            raise ValueError("method 'autoregressive' drafts nothing, so it takes no tree; "
                             "drop tree= or pick a speculative method (e.g. 'specdecode').")
        return DecoderSpec(method, AUTOREGRESSIVE)
    if drafter is None:
        raise ValueError(f"method {method!r} needs a drafter model.")
    if tree is not None or is_tree_drafter(drafter):
        if method in MODES or method == ORACLE:
            raise ValueError(f"method {method!r} verifies no drafted block; it takes no tree.")
        if gamma is not None:
            raise ValueError("gamma is a chain's draft length; a tree's size is its shape "
                             "(tree=...). Drop gamma.")
        return DecoderSpec(method, TREE, target_functions.get_target(method),
                           get_verifier(verifier, tree=True), tree=tree)
    chain_verifier = get_verifier(verifier)
    if method in MODES:
        if is_drafter(drafter):
            raise ValueError(f"method {method!r} runs a drafter model token by token; pass a "
                             "LanguageModel, not a drafting strategy.")
        return DecoderSpec(method, DRAFT_UNTIL, gamma=effective_gamma(method, drafter, gamma))
    if method == ORACLE:
        return DecoderSpec(method, ORACLE, target_functions.Diff(), chain_verifier)
    gamma = resolve_gamma(drafter, gamma)
    if gamma < 1:
        raise ValueError(f"gamma (draft length) must be >= 1, got {gamma}.")
    return DecoderSpec(method, CHAIN, target_functions.get_target(method), chain_verifier,
                       gamma=gamma)


@functools.lru_cache(maxsize=64)
def _make_decoder(*, target, drafter, method, gamma, verifier, max_new_tokens, top_k, eos_ids,
                  pad_id, fallback_alpha, stop_rule, rounds_per_sync, tree):
    """``make_decoder`` once its arguments are hashable (``tree`` a ``TreeSpec``)."""
    spec = decoder_spec(method, drafter=drafter, gamma=gamma, verifier=verifier, tree=tree)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    options = dict(max_new_tokens=max_new_tokens,
                   sampling_config=sampling.SamplingConfig(top_k=top_k), eos_ids=eos_ids,
                   pad_id=pad_id, stop_rule=stop_rule, rounds_per_sync=rounds_per_sync)
    if spec.kind == AUTOREGRESSIVE:
        return AutoregressiveDecoder(target=target, **options)
    _check_pair(target, drafter)
    if spec.kind == TREE:
        drafter = make_tree_drafter(drafter, spec.tree, draws=requested_draws(spec.verifier))
        return TreeDecoder(target=target, drafter=drafter, target_fn=spec.target_fn,
                           verifier=spec.verifier, **options)
    if spec.kind == DRAFT_UNTIL:
        return DraftUntilDecoder(target=target, drafter=drafter, mode=spec.method,
                                 max_drafts=spec.gamma, fallback_alpha=fallback_alpha, **options)
    return SpeculativeDecoder(target=target, drafter=drafter, target_fn=spec.target_fn,
                              gamma=spec.gamma, verifier=spec.verifier, **options)


def effective_gamma(method: str, drafter, gamma: int | None) -> int:
    """The draft length a method's decoder runs with (what its caches must hold):
    0 for autoregressive decoding and the oracle, the 10-token cap (or ``gamma``)
    for the draft-until baselines, else ``resolve_gamma``."""
    if method in (AUTOREGRESSIVE, ORACLE):
        return 0
    if method in MODES:
        return MAX_CONSECUTIVE_DRAFTS if gamma is None else gamma
    if drafter is None:
        return DEFAULT_GAMMA if gamma is None else gamma
    return resolve_gamma(drafter, gamma)


def resolve_gamma(drafter, gamma: int | None) -> int:
    """The round's block length: a K-matrix drafter fixes its own."""
    fixed = drafter_gamma(drafter) if is_drafter(drafter) else None
    if fixed is None:
        return DEFAULT_GAMMA if gamma is None else gamma
    if gamma is not None and gamma != fixed:
        raise ValueError(f"gamma={gamma} conflicts with the drafter, which drafts {fixed} tokens "
                         "per round (the sum of its K-matrix's first row); drop gamma or "
                         "change the K-matrix.")
    return fixed


def make_generate_fn(*, target: LanguageModel, drafter: Any = None,
                     method: str = "specdecode", gamma: int | None = None,
                     verifier: str | None = None,
                     max_new_tokens: int = 64, top_k: int = 0,
                     eos_ids: Sequence[int] = (), pad_id: int = 0,
                     fallback_alpha: float = 0.5, stop_rule: EndOfBlockStop | None = None,
                     rounds_per_sync: int = 1, tree: Any = None) -> Callable:
    """Returns ``fn(target_params, drafter_params, prompt, key, sampling_params)``, jitted.

    Everything here is static (a new value compiles a new program); the
    ``SamplingParams`` (temperature, top_p, alpha, beta) are traced, so a sweep
    over them reuses one compilation. ``method="autoregressive"`` ignores the
    drafter. ``tree`` drafts token trees (see ``make_decoder``, which also
    lists the verifiers; ``greedy`` is for temperature 0 only).
    """
    return _jitted_generate(make_decoder(
        target=target, drafter=drafter, method=method, gamma=gamma, verifier=verifier,
        max_new_tokens=max_new_tokens, top_k=top_k, eos_ids=eos_ids, pad_id=pad_id,
        fallback_alpha=fallback_alpha, stop_rule=stop_rule, rounds_per_sync=rounds_per_sync,
        tree=tree))


@functools.lru_cache(maxsize=64)
def _jitted_generate(decoder) -> Callable:
    return jax.jit(decoder.generate)


def sampling_params(*, temperature: float = 0.0, top_p: float = 1.0, alpha: float = 0.0,
                    beta: float = 1.0, lenience: float = 1.0,
                    stop_threshold: float = 0.7) -> SamplingParams:
    """Validated traced hyperparameters (host-side checks, before any compile).

    ``lenience`` (>= 1) relaxes the reviews *between drafters* of a CS Drafting
    cascade; the target's review never uses it, so the output law is unchanged.
    ``stop_threshold`` (SpecDec++'s ``h`` in (0, 1), default 0.7 as SpecDec++
    recommends) is read by adaptive drafters only.
    """
    sampling.validate_sampling(temperature, top_p)
    for name, value in (("alpha", alpha), ("beta", beta), ("lenience", lenience)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}.")
    if lenience < 1:
        raise ValueError(f"lenience must be >= 1 (1 = lossless reviews between drafters), got "
                         f"{lenience}.")
    if not 0 < stop_threshold < 1:
        raise ValueError(f"stop_threshold (SpecDec++'s h) must be in (0, 1), got "
                         f"{stop_threshold}; drafting stops once the predicted chance of a "
                         "rejection in the block exceeds it (0.7 is SpecDec++'s choice).")
    return SamplingParams(temperature=jnp.float32(temperature), top_p=jnp.float32(top_p),
                          alpha=jnp.float32(alpha), beta=jnp.float32(beta),
                          lenience=jnp.float32(lenience),
                          stop_threshold=jnp.float32(stop_threshold))


def generate(*, target: LanguageModel, target_params: Any, prompts: Sequence[Sequence[int]] |
             Prompt, drafter: LanguageModel | None = None, drafter_params: Any = None,
             method: str = "specdecode", alpha: float = 0.0, beta: float = 1.0,
             gamma: int | None = None, verifier: str | None = None,
             temperature: float = 0.0,
             lenience: float = 1.0, stop_threshold: float = 0.7,
             top_k: int = 0, top_p: float = 1.0, max_new_tokens: int = 64,
             eos_ids: Sequence[int] = (), seed: int = 0, max_cache_length: int | None = None,
             pad_id: int = 0, rounds_per_sync: int = 1, tree: Any = None
             ) -> GenerationOutput:
    """Generates continuations of a batch of prompts with any method.

    Args:
      target, target_params: the model whose quality we want (and its weights).
      prompts: token-id lists (ragged is fine) or a ``Prompt``.
      drafter, drafter_params: the small model, or a drafting strategy and its
        params (``make_drafter``); unused for ``autoregressive``.
      method: one of ``target_functions.METHODS``.
      alpha, beta: lenience of the method (see ``target_functions.py`` for each range).
      gamma: draft block length G (default 5; a K-matrix drafter fixes its own).
      verifier: ``token`` (default) | ``block`` | ``block-seed``; with ``tree``,
        a tree verifier: ``traversal`` (default) | ``rrs`` | ``rrs-replacement``
        | ``greedy`` (temperature 0 only).
      tree: a token tree per round instead of a chain: widths per depth, e.g.
        ``(3, 2, 1, 1)``, ``"dynamic:DEPTH,EXPAND,CHILDREN"``, or a shape by its
        parents, ``"parents:-1,-1,0"`` (see ``make_decoder``).
      lenience: CS Drafting lenience between drafters (>= 1; never the target).
      stop_threshold: SpecDec++'s ``h`` for an ``AdaptiveDrafter``: a row stops
        drafting once the predicted chance that a draft is rejected exceeds it.
      temperature, top_k, top_p: sampling transform (temperature 0 = greedy).
      max_new_tokens: generation budget per row; eos_ids end a row early.
      max_cache_length: the longest sequence the models may hold (e.g. their
        context length); an error is raised when the request needs more.
      rounds_per_sync: rounds between two reads of the loop condition (see
        ``make_decoder``; > 1 helps on GPUs, outputs are identical).

    Returns:
      ``GenerationOutput`` with tokens [B, max_new_tokens], lengths [B] and
      per-row statistics.
    """
    if method not in target_functions.METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of "
                         f"{', '.join(target_functions.METHODS)}.")
    target_functions.validate_alpha(method, alpha, beta)
    prompt = prompts if isinstance(prompts, Prompt) else _to_prompt(prompts)
    check_tokens(prompt.tokens, target.vocab_size, "generate(prompts)")
    sp = sampling_params(temperature=temperature, top_p=top_p, alpha=alpha, beta=beta,
                         lenience=lenience, stop_threshold=stop_threshold)
    decoder = make_decoder(target=target, drafter=drafter, method=method, gamma=gamma,
                           verifier=verifier, max_new_tokens=max_new_tokens, top_k=top_k,
                           eos_ids=eos_ids, pad_id=pad_id, rounds_per_sync=rounds_per_sync,
                           tree=tree)
    if isinstance(decoder, TreeDecoder):
        check_greedy_temperature(verifier, temperature)
        room, what = decoder.gamma, f"{decoder.num_nodes} tree nodes"
    else:
        room = effective_gamma(method, drafter, gamma)
        what = f"gamma {room}"
    needed = required_cache_length(prompt.tokens.shape[1], max_new_tokens, room)
    if max_cache_length is not None and needed > max_cache_length:
        raise ValueError(
            f"prompt width {prompt.tokens.shape[1]} + max_new_tokens {max_new_tokens} + "
            f"room for {what} (at least {MIN_SCRATCH}) + 1 needs a cache of {needed} "
            f"positions, beyond max_cache_length "
            f"{max_cache_length}; lower max_new_tokens, shorten the prompts"
            f"{' or draft a smaller tree' if isinstance(decoder, TreeDecoder) else ''}.")
    fn = _jitted_generate(decoder)
    out = fn(target_params, drafter_params, prompt, jax.random.PRNGKey(seed), sp)
    nan_calls = int(np.asarray(out.stats.nan_logits).sum())
    if nan_calls:
        raise FloatingPointError(
            f"{nan_calls} model calls produced NaN logits; check the weights (corrupt "
            "checkpoint?) and the dtype (float32 on CPU).")
    return out


def _to_prompt(prompts: Sequence[Sequence[int]]) -> Prompt:
    rows = [list(map(int, p)) for p in prompts]
    if not rows:
        raise ValueError("generate: got no prompts; pass at least one.")
    empty = [i for i, row in enumerate(rows) if not row]
    if empty:
        raise ValueError(f"generate: prompt(s) {empty} are empty; every prompt needs at "
                         "least one token (e.g. the BOS token).")
    return make_prompt(rows)
