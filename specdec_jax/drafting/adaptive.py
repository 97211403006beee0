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

The loop is the one every stopping drafter shares (``drafting.draft_until``,
with ``AcceptanceHeadStop``; rows run in lockstep). ``AdaptiveDrafter``
runs a model; ``AdaptiveFeatureDrafter`` runs a feature head
(``drafting/feature.py``), whose ``e_i`` is its predicted feature after
feeding ``d_i`` (the target's hidden size; the acceptance head is sized to it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import loops, sampling
from specdec_jax.drafting.acceptance_head import AcceptanceHead
from specdec_jax.drafting.base import Context, Proposal, extend_from_history
from specdec_jax.drafting.draft_until import AcceptanceHeadStop, draft_until, model_step
from specdec_jax.drafting.feature import FeatureDrafter, FeatureDrafterState
from specdec_jax.drafting.model_drafter import ModelDrafterState, SingleModelDrafter
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import LanguageModel, Prompt, start_token_and_prefill

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

        loop = draft_until(model_step(self.model, model_params), cache, logits[:, 0],
                           hidden[:, 0], num, key, AcceptanceHeadStop(self.head, self.eos_ids),
                           head_params, sp, config, self.steps_per_check)
        steps = loop.step  # the batch's lockstep calls after the catch-up window
        proposal = Proposal(tokens=loop.tokens, q=loop.q, q_stat=loop.q_stat, hidden=loop.hidden,
                            calls=(calls_B + steps)[:, None], fed=(fed_B + steps)[:, None],
                            single=(single_B + steps)[:, None], nan=loop.nan, count=loop.count)
        return proposal, ModelDrafterState(cache=loop.cache)


@dataclasses.dataclass(frozen=True)
class AdaptiveFeatureDrafter(StoppingRuleNames, FeatureDrafter):
    """SpecDec++ on a feature head: ``FeatureDrafter``'s catch-up, then
    ``draft_until`` where each step feeds ``(d_i, e_{i-1})`` to the head
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

        loop = draft_until(step, cache, self.head.logits(feature_params, e0_BxD), e0_BxD, num,
                           key, AcceptanceHeadStop(self.acceptance_head, self.eos_ids),
                           head_params, sp, config, self.steps_per_check)
        # own[length + i - 1] = e_i for the fed drafts (slots past them are scratch).
        own = write_rows(own, loop.hidden[:, 1:], length_B)
        steps = loop.step
        proposal = Proposal(tokens=loop.tokens, q=loop.q, q_stat=loop.q_stat, hidden=loop.hidden,
                            calls=(calls_B + walked_B + steps)[:, None],
                            fed=(fed_B + walked_B + steps)[:, None],
                            single=(walked_B + steps + int(width == 1) * calls_B)[:, None],
                            nan=loop.nan, count=loop.count)
        return proposal, FeatureDrafterState(cache=loop.cache, real=real_B, own=own)
