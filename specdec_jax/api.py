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
from specdec_jax.decode import methods
from specdec_jax.decode.autoregressive import AutoregressiveDecoder
from specdec_jax.decode.cascade_baselines import MAX_CONSECUTIVE_DRAFTS, DraftUntilDecoder
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.decode.round import EndOfBlockStop
from specdec_jax.decode.stats import GenerationOutput
from specdec_jax.decode.tree import (
    TreeDecoder,
    TreeSpec,
    check_drafter_draws,
    check_greedy_temperature,
    is_tree_drafter,
    make_tree_drafter,
)
from specdec_jax.drafting import MaxGramDrafter, ModelDrafter, drafter_gamma, is_drafter
from specdec_jax.drafting.tree import MaxGramTreeDrafter
from specdec_jax.models.decoder_only import DecoderOnlyLM, with_kernel_layout
from specdec_jax.models.interface import (
    LanguageModel,
    Prompt,
    check_tokens,
    make_prompt,
    supports_trees,
)
from specdec_jax.models.layers import OUT_IN
from specdec_jax.sampling import SamplingParams
from specdec_jax.verify import TREE_VERIFIERS, VERIFIERS, get_verifier, requested_draws

DEFAULT_GAMMA = 5


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

    The cascade baselines (``decode.cascade_baselines``): ``oracle`` is a ``G = 0`` round
    with the Diff rule (both models at every position); ``token-cascade``
    (Chow) and ``bild-original`` let the drafter run up to ``gamma`` tokens
    (default 10, the paper's cap) before the target is called;
    ``fallback_alpha`` is BiLD's fallback threshold. ``stop_rule`` ends rows
    besides ``eos_ids`` (e.g. at the end of a Python function).

    ``rounds_per_sync`` (default 1): rounds run between two reads of the loop's
    condition (``decode.round.loop_until_done``); on a GPU, where each read is a
    host round trip, a few (4-8) save that wait per round. Outputs are
    identical for every value.

    ``verifier``: chains ``token`` (the default), ``block`` or ``block-seed``.

    ``tree`` drafts a token tree per round instead of a chain
    (``decode.tree``): widths per depth (``(3, 2, 1, 1)``, ``[3, 2, 1, 1]``
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
class DrafterFacts:
    """What a request's checks need to know of its drafter before any weights
    load (``drafter_facts`` reads them off a drafter; the CLI off its
    ``--draft`` spec): whether it is a drafting strategy rather than one model
    sampled token by token, the block length a K-matrix fixes, whether it
    already drafts trees or can draft them (one decoder-only model or
    Max-Gram), and whether it is Max-Gram (its tree children are chosen, not drawn)."""

    strategy: bool = False
    fixed_gamma: int | None = None
    drafts_trees: bool = False
    drafts_tree_shapes: bool = True
    max_gram: bool = False


def drafter_facts(drafter: Any) -> DrafterFacts | None:
    """The ``DrafterFacts`` of a drafter object (None: no drafter)."""
    if drafter is None or isinstance(drafter, DrafterFacts):
        return drafter
    model = drafter.model if isinstance(drafter, ModelDrafter) else drafter
    max_gram = isinstance(drafter, MaxGramDrafter)
    return DrafterFacts(
        strategy=is_drafter(drafter), drafts_trees=is_tree_drafter(drafter),
        fixed_gamma=drafter_gamma(drafter) if is_drafter(drafter) else None,
        drafts_tree_shapes=max_gram or (not is_drafter(model) and supports_trees(model)),
        max_gram=max_gram)


@dataclasses.dataclass(frozen=True)
class ArgumentNames:
    """How the caller spells each argument, so one checker's errors name the
    argument the user typed: ``tree=`` here, ``--tree`` on the command line,
    ``run_generate.tree`` in a gin job."""

    method: str = "method"
    gamma: str = "gamma"
    tree: str = "tree"
    verifier: str = "verifier"
    drafter: str = "drafter"
    k_matrix: str = "the drafter's K-matrix"

    def say(self, name: str, value) -> str:
        """``--gamma 3`` for a flag, ``gamma=3`` for a keyword argument."""
        flag = getattr(self, name)
        return f"{flag} {value}" if flag.startswith("-") else f"{flag}={value!r}"


API_NAMES = ArgumentNames()
CLI_NAMES = ArgumentNames(method="--method", gamma="--gamma", tree="--tree",
                          verifier="--verifier", drafter="--draft", k_matrix="--k-matrix")


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    """What one decoder is made of, resolved once from a request
    (``decoder_spec``): its ``kind`` (``decode.methods``: autoregressive,
    chain, tree, oracle or draft-until), the target function its rounds
    apply, its verifier strategy, its draft length (a chain's G, the
    draft-until cap) and its tree. Hashable, like the decoders it builds."""

    method: str
    kind: str
    target_fn: target_functions.TargetFunction | None = None
    verifier: Any = None
    gamma: int = 0
    tree: TreeSpec | None = None


def decoder_spec(method: str, *, drafter: Any, gamma: int | None = None,
                 verifier: str | None = None, tree: Any = None,
                 temperature: float | None = None, alpha: float | None = None,
                 beta: float = 1.0, names: ArgumentNames = API_NAMES) -> DecoderSpec:
    """The one place a request is checked: the ``DecoderSpec`` it makes, with
    every error it can raise before a model is touched. The API, the CLI
    (``CLI_NAMES``) and the gin jobs call it; ``names`` spells the arguments
    as the caller's user typed them.

    ``drafter``: a drafter (a ``LanguageModel`` or a drafting strategy), its
    ``DrafterFacts`` (a caller that has not loaded it), or None. Refused: an
    unknown method, verifier or tree; an alpha (or beta) outside the method's
    range (when given); a drafter, tree or verifier the method does not take;
    a gamma that conflicts with the drafter's K-matrix or with a tree; a tree
    verifier without a tree (or with no tree form, or unfit for the method's
    pi, or 'greedy' at a temperature above 0, when given); a drafting strategy
    where a method runs one model token by token.
    """
    entry = methods.get_method(method)
    if gamma is not None and gamma < 1:
        raise ValueError(f"{names.gamma} (draft length G) must be >= 1, got {gamma}.")
    if alpha is not None:
        entry.check_alpha(alpha, beta)
    facts = drafter_facts(drafter)
    if not entry.drafts:
        if tree is not None:
            raise ValueError(f"{names.say('method', method)} drafts nothing, so it takes no "
                             f"{names.tree}; drop {names.tree} or pick a speculative method "
                             "(e.g. 'specdecode').")
        if verifier is not None:
            raise ValueError(f"{names.say('verifier', verifier)} does not apply to "
                             f"{names.say('method', method)}, which verifies no drafted block; "
                             f"drop {names.verifier}.")
        return DecoderSpec(method, methods.AUTOREGRESSIVE)
    if facts is None:
        raise ValueError(f"{names.say('method', method)} needs a drafter model.")
    if tree is not None or facts.drafts_trees:
        return _tree_spec(entry, facts, gamma, verifier, tree, temperature, names)
    if entry.kind == methods.DRAFT_UNTIL:
        if verifier is not None:
            raise ValueError(f"{names.say('verifier', verifier)} does not apply to "
                             f"{names.say('method', method)}, which verifies no drafted block; "
                             f"drop {names.verifier}.")
        if facts.strategy:
            raise ValueError(f"{names.say('method', method)} runs one drafter model token by "
                             f"token; {names.drafter} is a drafting strategy: pass one model.")
        return DecoderSpec(method, methods.DRAFT_UNTIL,
                           gamma=MAX_CONSECUTIVE_DRAFTS if gamma is None else gamma)
    chain_verifier = _chain_verifier(verifier, names)
    if entry.kind == methods.ORACLE:
        return DecoderSpec(method, methods.ORACLE, entry.target_fn, chain_verifier)
    gamma = _chain_gamma(facts, gamma, names)
    return DecoderSpec(method, methods.CHAIN, entry.target_fn, chain_verifier, gamma=gamma)


def _chain_verifier(verifier: str | None, names: ArgumentNames):
    """A chain verifier; a tree verifier's name asks for a tree."""
    try:
        return get_verifier(verifier)
    except ValueError as error:
        if verifier in TREE_VERIFIERS:
            raise ValueError(f"{names.say('verifier', verifier)} verifies token trees; add "
                             f"{names.tree} (e.g. {names.say('tree', '3,2,1,1')}) or use a "
                             f"chain verifier: {', '.join(VERIFIERS)}.") from error
        raise


def _chain_gamma(facts: DrafterFacts, gamma: int | None, names: ArgumentNames) -> int:
    """The round's block length: a K-matrix fixes its own."""
    fixed = facts.fixed_gamma
    if fixed is not None and gamma is not None and gamma != fixed:
        raise ValueError(f"{names.say('gamma', gamma)} conflicts with {names.k_matrix}, which "
                         f"drafts {fixed} tokens per round (the sum of its first row); drop "
                         f"{names.gamma} or change the K-matrix.")
    return fixed if fixed is not None else DEFAULT_GAMMA if gamma is None else gamma


def _tree_spec(entry: methods.Method, facts: DrafterFacts, gamma, verifier, tree, temperature,
               names: ArgumentNames) -> DecoderSpec:
    """A tree request: a chain method, no gamma, a parsed shape, a drafter that
    drafts trees, and a tree verifier that fits the method and the temperature."""
    where = names.tree if tree is None else f"{names.tree} = {tree!r}"
    if not entry.verifies_block:
        raise ValueError(f"{where}: {names.say('method', entry.name)} verifies no drafted "
                         f"block, so it takes no tree; use a speculative method (specdecode, "
                         f"a cascade target function) or drop {names.tree}.")
    if gamma is not None or facts.fixed_gamma is not None:
        raise ValueError(f"{where} sets the round's drafts by its shape; drop {names.gamma}"
                         f"{f' ({gamma})' if gamma is not None else ''} and {names.k_matrix}.")
    spec = None
    if tree is not None:
        try:
            spec = TreeSpec.parse(tree)
        except ValueError as error:
            raise ValueError(f"{names.tree}: {error}") from error
        if facts.drafts_trees:
            raise ValueError(f"{where}: the {names.drafter} drafts trees itself; drop "
                             f"{names.tree}.")
        if not facts.drafts_tree_shapes:
            raise ValueError(f"{where}: trees are drafted from one decoder-only drafter model "
                             f"or Max-Gram; this {names.drafter} drafts chains only for now.")
    try:
        checked = get_verifier(verifier, tree=True)
        if temperature is not None:
            check_greedy_temperature(verifier, temperature)
        if facts.max_gram:
            check_drafter_draws(MaxGramTreeDrafter, checked)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from error
    if getattr(checked, "needs_normalised_law", False) and not entry.target_fn.normalised:
        raise ValueError(f"{where}: the {checked.name!r} tree verifier needs a normalised pi, "
                         f"and {entry.name!r} weighs tokens with an unnormalised one; verify "
                         "with 'greedy' (T = 0) or draw a chain.")
    return DecoderSpec(entry.name, methods.TREE, entry.target_fn, checked, tree=spec)


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
    if spec.kind == methods.AUTOREGRESSIVE:
        return AutoregressiveDecoder(target=target, **options)
    _check_pair(target, drafter)
    if spec.kind == methods.TREE:
        drafter = make_tree_drafter(drafter, spec.tree, draws=requested_draws(spec.verifier))
        return TreeDecoder(target=target, drafter=drafter, target_fn=spec.target_fn,
                           verifier=spec.verifier, **options)
    if spec.kind == methods.DRAFT_UNTIL:
        return DraftUntilDecoder(target=target, drafter=drafter, mode=spec.method,
                                 max_drafts=spec.gamma, fallback_alpha=fallback_alpha, **options)
    return SpeculativeDecoder(target=target, drafter=drafter, target_fn=spec.target_fn,
                              gamma=spec.gamma, verifier=spec.verifier, **options)


def resolve_gamma(drafter, gamma: int | None) -> int:
    """The round's block length for a chain: ``gamma`` (default 5), or the one
    a K-matrix drafter fixes (a different explicit gamma is an error)."""
    return _chain_gamma(drafter_facts(drafter), gamma, API_NAMES)


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
      method: one of ``decode.methods.METHODS``.
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
    decoder_spec(method, drafter=drafter, gamma=gamma, verifier=verifier, tree=tree,
                 temperature=temperature, alpha=alpha, beta=beta)
    prompt = prompts if isinstance(prompts, Prompt) else _to_prompt(prompts)
    check_tokens(prompt.tokens, target.vocab_size, "generate(prompts)")
    sp = sampling_params(temperature=temperature, top_p=top_p, alpha=alpha, beta=beta,
                         lenience=lenience, stop_threshold=stop_threshold)
    decoder = make_decoder(target=target, drafter=drafter, method=method, gamma=gamma,
                           verifier=verifier, max_new_tokens=max_new_tokens, top_k=top_k,
                           eos_ids=eos_ids, pad_id=pad_id, rounds_per_sync=rounds_per_sync,
                           tree=tree)
    needed, terms = decoder.needed_room(prompt.tokens.shape[1])
    if max_cache_length is not None and needed > max_cache_length:
        raise ValueError(
            f"{terms} needs a cache of {needed} positions, beyond max_cache_length "
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
