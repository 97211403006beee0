"""SpecDec++ drafting (Huang et al.; docs/algorithms.md, 'Adaptive drafting (SpecDec++)'):
a neural drafter that
decides per row, after each draft, whether to stop.

After feeding draft ``Y_i`` (the call that also yields ``q_{i+1}``), the
acceptance head reads the hidden state ``e_i`` and the row keeps

    P_hat_i = prod_{k <= i} sigmoid(f(e_k))   (predicted P(all i drafts accepted))

and stops at the first ``i`` with ``1 - P_hat_i > h``, at an EOS draft, or
at ``G = K_max`` drafts. ``h`` is ``sp.stop_threshold`` (traced: a sweep over
thresholds compiles once). The row offers ``count = i`` drafts for
verification (``Proposal.count``); the verifiers treat it as a block of that
length and the decoder scores only the smallest precompiled target width that
covers the longest row (``target_widths``).

Exactness: where a row stops depends only on the drafter's side (its own
samples and hidden states), never on the target, so the verified output
keeps the target's law, as for any fixed ``G``.

Rows run in lockstep: the batch drafts until its last row stops, and rows
that stopped earlier keep sampling scratch drafts (valid tokens, never
verified) so every buffer holds real distributions.

The loop (``draft_adaptively``) takes any drafter's step: ``AdaptiveDrafter``
runs a model; ``AdaptiveFeatureDrafter`` runs a feature head
(``drafting/feature.py``), whose ``e_i`` is its predicted feature after
feeding ``d_i`` (the target's hidden size; the acceptance head is sized to it).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import loops, sampling
from specdec_jax.drafting.acceptance_head import AcceptanceHead
from specdec_jax.drafting.base import Context, Proposal, extend_from_history
from specdec_jax.drafting.feature import FeatureDrafter, FeatureDrafterState
from specdec_jax.drafting.model_drafter import ModelDrafterState, SingleModelDrafter, has_nan
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import LanguageModel, Prompt, start_token_and_prefill
from specdec_jax.sampling import sample_from_weights

Array = jax.Array

DEFAULT_MAX_DRAFTS = 20  # K_max of SpecDec++ (Huang et al.)
# Target call widths (tokens fed: pending + drafts) compiled besides K_max + 1.
# On CPU a call's cost grows with its width. On TPU the compiler's estimates for
# the 1.5B's calls step only from 2 to 3 tokens and from 8 to 9 (v4, v5e, v5p,
# v6e; docs/results.md), so a width in between is one more compiled copy of the
# target (HBM scratch: SpecDec++'s v5e program 0.292 -> 0.270 GiB without the
# 4-token one) for no estimated speed. On an H200 the 1.5B's measured in-loop
# calls (bf16, random weights of its shapes) cost the same at 1 to 8 tokens
# (2.02-2.14 ms: benchmarks/reports/bench_accelerator_gpu_h200.md), so GPUs take
# the same widths.
SMALL_TARGET_WIDTHS = (2, 4, 8, 12)
ACCELERATOR_TARGET_WIDTHS = (2, 8)


@flax.struct.dataclass
class _DraftLoop:
    step: Array  # int32 []: drafts fed so far (i)
    cache: object
    tokens: Array  # int32 [B, G]: d_1 .. d_G (d_{i+1} sampled, not yet fed)
    q: Array  # float32 [B, G + 1, V]
    q_stat: Array  # float32 [B, G + 1, V]
    hidden: Array  # float32 [B, G + 1, D]: [:, i] = e_i (the state after feeding d_i)
    log_p_hat: Array  # float32 [B]: log prod sigmoid(f(e_k)) over the row's drafts
    count: Array  # int32 [B]: drafts offered (final once stopped)
    stopped: Array  # bool [B]
    nan: Array  # int32 [B]


def small_target_widths(backend: str | None = None) -> tuple[int, ...]:
    """The widths below ``K_max + 1`` worth compiling on ``backend`` (default:
    JAX's): ``SMALL_TARGET_WIDTHS`` on CPU, ``ACCELERATOR_TARGET_WIDTHS`` elsewhere."""
    cpu = (backend or jax.default_backend()) == "cpu"
    return SMALL_TARGET_WIDTHS if cpu else ACCELERATOR_TARGET_WIDTHS


def target_widths(max_drafts: int, small: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The target call widths to compile for ``max_drafts``: the ``small`` ones
    below it (default ``small_target_widths()``) and ``max_drafts + 1`` (every
    row drafted the maximum). K_max = 8 on CPU -> (2, 4, 8, 9); on TPU -> (2, 8, 9)."""
    small = small_target_widths() if small is None else small
    return tuple(sorted({w for w in small if w < max_drafts + 1} | {max_drafts + 1}))


class StoppingRuleNames:
    """What every SpecDec++ drafter shares, whatever drafts for it: its
    acceptance head's params name, the target widths it compiles and how it
    picks ``(drafter params, acceptance head params)`` from named params.
    Needs ``name`` and ``widths`` fields on the drafter."""

    @property
    def head_name(self) -> str:
        return f"{self.name}/acceptance_head"

    def target_widths(self, max_drafts: int) -> tuple[int, ...]:
        """The target call widths to compile: ``widths`` (or ``target_widths``),
        checked to end at ``K_max + 1``."""
        widths = target_widths(max_drafts) if self.widths is None else tuple(sorted(self.widths))
        if widths[-1] != max_drafts + 1 or widths[0] < 1:
            raise ValueError(f"target widths {widths} must be >= 1 and end at K_max + 1 = "
                             f"{max_drafts + 1} (a row may draft K_max tokens).")
        return widths

    def check_steps_per_check(self) -> None:
        loops.check_every(self.steps_per_check, "steps_per_check")

    def select_params(self, named: dict):
        """``(drafter params, acceptance head params)`` from a name -> params dict."""
        missing = [k for k in (self.name, self.head_name) if k not in named]
        if missing:
            raise KeyError(f"adaptive drafter {self.name!r} needs params {missing}; pass the "
                           "drafter's weights and its acceptance head's (load_head).")
        return named[self.name], named[self.head_name]


@dataclasses.dataclass(frozen=True)
class AdaptiveDrafter(StoppingRuleNames, SingleModelDrafter):
    """A neural drafter with SpecDec++'s stopping rule (module docstring).

    Params: ``(model_params, head_params)`` from ``select_params({name: ...,
    name + "/acceptance_head": ...})``. ``eos_ids`` end a row's block at an
    EOS draft. ``widths`` overrides the target call widths (``target_widths``).
    ``steps_per_check``: draft steps between two host reads of the draft loop's
    condition (``loops.checked_while_loop``; same drafts for every value).
    """

    model: LanguageModel
    head: AcceptanceHead
    name: str = "drafter"
    eos_ids: tuple[int, ...] = ()
    widths: tuple[int, ...] | None = None
    catch_up_widths: tuple[int, ...] = (1, 2)
    steps_per_check: int = 1

    def __post_init__(self):
        self.check_steps_per_check()

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> ModelDrafterState:
        del encoder_decoder
        cache, _ = start_token_and_prefill(self.model, params[0], prompt, max_length)
        return ModelDrafterState(cache=cache)

    def propose(self, params, state: ModelDrafterState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, ModelDrafterState]:
        del with_next  # every offered draft is fed (the head needs e_i): q_{count+1} is known
        model_params, head_params = params
        logits, hidden, cache, calls_B, fed_B, single_B = extend_from_history(
            self.model, model_params, state.cache, context, None, self.catch_up_widths)

        def step(cache, token_B, previous_BxD):
            del previous_BxD  # a model's cache holds all it reads
            out = self.model.extend(model_params, token_B[:, None], cache)
            return out.logits[:, 0], out.hidden[:, 0], out.cache

        loop = draft_adaptively(step, cache, logits[:, 0], hidden[:, 0], num, key, self.head,
                                head_params, sp, config, self.eos_ids, self.steps_per_check)
        steps = loop.step  # the batch's lockstep calls after the catch-up window
        proposal = Proposal(tokens=loop.tokens, q=loop.q, q_stat=loop.q_stat, hidden=loop.hidden,
                            calls=(calls_B + steps)[:, None], fed=(fed_B + steps)[:, None],
                            single=(single_B + steps)[:, None], nan=loop.nan, count=loop.count)
        return proposal, ModelDrafterState(cache=loop.cache)


def draft_adaptively(step_fn, cache, first_logits_BxV: Array, first_hidden_BxD: Array,
                     num: int, key: Array, head: AcceptanceHead, head_params,
                     sp: sampling.SamplingParams, config: sampling.SamplingConfig,
                     eos_ids: tuple[int, ...] = (), steps_per_check: int = 1) -> _DraftLoop:
    """SpecDec++'s lockstep draft loop (module docstring), for any drafter.

    ``first_logits`` give ``q_1`` (the drafter's output after the pending
    token, ``first_hidden`` = ``e_0``); ``step_fn(cache, d_i, e_{i-1}) ->
    (logits [B, V], e_i [B, D], cache)`` feeds draft ``d_i`` (a model reads
    its cache; a feature head also reads its previous prediction ``e_{i-1}``).
    After each step the acceptance head reads ``e_i`` and a row stops at the
    first ``i`` with ``log P_hat_i < log(1 - h)``, at an EOS draft, or at
    ``i = num``. Keys: ``split(key, num + 1)``, ``d_i`` drawn with key ``i - 1``.
    Returns the loop's final state: ``step`` is the number of lockstep steps.
    """
    if num < 1:
        raise ValueError(f"K_max (the decoder's gamma) must be >= 1, got {num}.")
    keys = jax.random.split(key, num + 1)
    first = sampling.distributions(first_logits_BxV, sp.temperature, sp.top_p, config)
    batch = first.probs.shape[0]
    tokens = jnp.zeros((batch, num), jnp.int32).at[:, 0].set(
        sample_from_weights(keys[0], first.probs))
    grid = lambda x_BxX: jnp.zeros((batch, num + 1) + x_BxX.shape[1:],  # noqa: E731
                                   x_BxX.dtype).at[:, 0].set(x_BxX)
    is_eos = lambda t_B: jnp.isin(t_B, jnp.asarray(eos_ids or (-1,), jnp.int32))  # noqa: E731
    loop = _DraftLoop(step=jnp.int32(0), cache=cache, tokens=tokens, q=grid(first.probs),
                      q_stat=grid(first.stats), hidden=grid(first_hidden_BxD),
                      log_p_hat=jnp.zeros((batch,), jnp.float32),
                      count=jnp.full((batch,), num, jnp.int32),
                      stopped=jnp.zeros((batch,), bool), nan=has_nan(first_logits_BxV))
    log_h = jnp.log1p(-sp.stop_threshold)  # stop when log P_hat < log(1 - h)

    def cond_fn(loop):
        return (loop.step < num) & ~jnp.all(loop.stopped)

    def body_fn(loop):
        i = loop.step + 1  # feed d_i
        token_B = loop.tokens[:, i - 1]
        previous_BxD = jax.lax.dynamic_index_in_dim(loop.hidden, i - 1, 1, keepdims=False)
        logits_BxV, e_BxD, cache = step_fn(loop.cache, token_B, previous_BxD)
        dist = sampling.distributions(logits_BxV, sp.temperature, sp.top_p, config)
        log_p_hat = loop.log_p_hat + jax.nn.log_sigmoid(head.logits(head_params, e_BxD))
        stop_now = ~loop.stopped & ((log_p_hat < log_h) | is_eos(token_B) | (i >= num))
        # d_{i+1} ~ q_{i+1} goes to slot i (none is left after d_G).
        slot = jnp.minimum(i, num - 1)
        next_B = jnp.where(i < num, sample_from_weights(keys[i], dist.probs),
                           loop.tokens[:, slot])
        put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, i, 1)  # noqa: E731
        return loop.replace(
            step=i, cache=cache,
            tokens=jax.lax.dynamic_update_index_in_dim(loop.tokens, next_B, slot, 1),
            q=put(loop.q, dist.probs), q_stat=put(loop.q_stat, dist.stats),
            hidden=put(loop.hidden, e_BxD.astype(loop.hidden.dtype)), log_p_hat=log_p_hat,
            count=jnp.where(stop_now, i, loop.count), stopped=loop.stopped | stop_now,
            nan=loop.nan + has_nan(logits_BxV))

    return loops.checked_while_loop(cond_fn, body_fn, loop, steps_per_check)


@dataclasses.dataclass(frozen=True)
class AdaptiveFeatureDrafter(StoppingRuleNames, FeatureDrafter):
    """SpecDec++ on a feature head: ``FeatureDrafter``'s catch-up, then
    ``draft_adaptively`` where each step feeds ``(d_i, e_{i-1})`` to the head
    and ``e_i`` (its predicted feature after ``d_i``, ``Proposal.hidden[:, i]``)
    is what the acceptance head reads. The stopping rule, ``Proposal.count``
    and ``target_widths`` are ``AdaptiveDrafter``'s.

    Params: ``select_params({name: feature_head.drafter_params(...), name +
    "/acceptance_head": ...})`` -> ``(head params, acceptance head params)``;
    the acceptance head's ``hidden_size`` is the target's (the features').
    """

    acceptance_head: AcceptanceHead | None = None
    eos_ids: tuple[int, ...] = ()
    widths: tuple[int, ...] | None = None
    steps_per_check: int = 1  # as AdaptiveDrafter's

    def __post_init__(self):
        self.check_steps_per_check()
        if self.acceptance_head is None:
            raise ValueError("AdaptiveFeatureDrafter needs acceptance_head=AcceptanceHead("
                             "HeadConfig(hidden_size=<the target's hidden size>)).")
        size = self.acceptance_head.config.hidden_size
        if size != self.head.config.feature_size:
            raise ValueError(f"the acceptance head reads {size}-wide states but the feature "
                             f"head predicts {self.head.config.feature_size}-wide features; "
                             "build it with HeadConfig(hidden_size=feature_size).")

    def propose(self, params, state: FeatureDrafterState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, FeatureDrafterState]:
        del with_next  # every offered draft is fed (e_i is read): q_{count+1} is known
        feature_params, head_params = params
        length_B = context.length
        width = self.window or num + 1
        cache, real_B, own, calls_B, fed_B, walked_B = self._catch_up(feature_params, state,
                                                                      context, width)
        e0_BxD = jnp.take_along_axis(own, (length_B - 1)[:, None, None], axis=1)[:, 0]

        def step(cache, token_B, previous_BxD):
            predicted, cache = self.head.step(feature_params, token_B[:, None],
                                              previous_BxD[:, None], cache)
            e_BxD = predicted[:, 0].astype(jnp.float32)
            return self.head.logits(feature_params, e_BxD), e_BxD, cache

        loop = draft_adaptively(step, cache, self.head.logits(feature_params, e0_BxD), e0_BxD,
                                num, key, self.acceptance_head, head_params, sp, config,
                                self.eos_ids, self.steps_per_check)
        # own[length + i - 1] = e_i for the fed drafts (slots past them are scratch).
        own = write_rows(own, loop.hidden[:, 1:], length_B)
        steps = loop.step
        proposal = Proposal(tokens=loop.tokens, q=loop.q, q_stat=loop.q_stat, hidden=loop.hidden,
                            calls=(calls_B + walked_B + steps)[:, None],
                            fed=(fed_B + walked_B + steps)[:, None],
                            single=(walked_B + steps + int(width == 1) * calls_B)[:, None],
                            nan=loop.nan, count=loop.count)
        return proposal, FeatureDrafterState(cache=loop.cache, real=real_B, own=own)
