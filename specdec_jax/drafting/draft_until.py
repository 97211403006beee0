"""Drafting until a stopping rule says stop: one lockstep loop for every drafter
whose rows decide, draft by draft, how long a block to offer.

Two papers draft so. SpecDec++ (Huang et al.) stops a row when a trained
acceptance head predicts a rejection is likely (``AcceptanceHeadStop``,
``drafting.adaptive``). The cascade baselines of SpecCascade (the sequential
token cascade, the original Big-Little Decoder) stop the drafter where a rule
on its own law ``q`` would defer to the target (``DeferralStop``,
``DraftUntilDrafter``, ``decode.cascade_baselines``). Either way::

    q_1 (after the pending token); a row whose rule already says stop offers 0
    d_1 ~ q_1; for i = 1 .. num:
        feed d_i -> q_{i+1}, e_i        (e_i: the state after d_i)
        stop after d_i if the rule says so after step i, or i = num (count = i)
        d_{i+1} ~ q_{i+1}

Rows run in lockstep: the batch steps until its last row stops, and rows that
stopped earlier keep sampling scratch drafts (valid tokens, never verified) so
every buffer holds real distributions; ``count`` marks what each row offers and
the caller's ``rewind`` drops what a row fed past it. Keys: ``split(key, num +
1)``, ``d_i`` drawn with key ``i - 1``.

Exactness: where a row stops depends only on the drafter's side (its own
samples, laws and hidden states), never on the target, so the verified output
keeps the target's law, as for any fixed ``G``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import loops, sampling
from specdec_jax.drafting.acceptance_head import AcceptanceHead
from specdec_jax.drafting.base import Context, Proposal, extend_from_history
from specdec_jax.drafting.model_drafter import ModelDrafterState, SingleModelDrafter, has_nan
from specdec_jax.models.interface import LanguageModel
from specdec_jax.sampling import sample_from_weights
from specdec_jax.target_functions import DeferralRule

Array = jax.Array


@flax.struct.dataclass
class DraftLoop:
    step: Array  # int32 []: drafts fed so far (i): the batch's lockstep calls
    cache: Any
    tokens: Array  # int32 [B, num]: d_1 .. d_num (d_{i+1} sampled, not yet fed)
    q: Array  # float32 [B, num + 1, V]
    q_stat: Array  # float32 [B, num + 1, V]
    hidden: Array  # float32 [B, num + 1, D]: [:, i] = e_i (the state after feeding d_i)
    rule_state: Any  # what the stopping rule carries (SpecDec++: log P_hat per row)
    count: Array  # int32 [B]: drafts offered (final once stopped)
    stopped: Array  # bool [B]
    nan: Array  # int32 [B]: steps whose logits held NaN, on rows still drafting


class StopRule(Protocol):
    """When a row stops drafting. ``start`` sees the law of the first draft
    (a row may offer none); ``after`` sees step ``i``: the draft ``d_i`` just
    fed, the state ``e_i`` after it and the law of ``d_{i+1}``."""

    def start(self, params, first: sampling.Distributions, sp: sampling.SamplingParams
              ) -> tuple[Any, Array]: ...

    def after(self, params, rule_state, token_B: Array, e_BxD: Array,
              dist: sampling.Distributions, sp: sampling.SamplingParams
              ) -> tuple[Any, Array]: ...


@dataclasses.dataclass(frozen=True)
class AcceptanceHeadStop:
    """SpecDec++'s rule: after feeding ``d_i`` the acceptance head reads
    ``e_i`` and the row keeps ``P_hat_i = prod_{k <= i} sigmoid(f(e_k))``
    (the predicted chance that all ``i`` drafts are accepted); it stops at the
    first ``i`` with ``1 - P_hat_i > h`` (``sp.stop_threshold``) or at an EOS
    draft. Params: the acceptance head's."""

    head: AcceptanceHead
    eos_ids: tuple[int, ...] = ()

    def start(self, params, first, sp):
        del params, sp
        batch = first.probs.shape[0]
        return jnp.zeros((batch,), jnp.float32), jnp.zeros((batch,), bool)

    def after(self, params, log_p_hat_B, token_B, e_BxD, dist, sp):
        del dist
        log_p_hat_B = log_p_hat_B + jax.nn.log_sigmoid(self.head.logits(params, e_BxD))
        is_eos_B = jnp.isin(token_B, jnp.asarray(self.eos_ids or (-1,), jnp.int32))
        # stop when log P_hat < log(1 - h)
        return log_p_hat_B, (log_p_hat_B < jnp.log1p(-sp.stop_threshold)) | is_eos_B


@dataclasses.dataclass(frozen=True)
class DeferralStop:
    """The cascade baselines' rule: stop before drafting a position whose law
    ``q`` (its statistics law ``q_stat``) would defer to the target.

    ``rule`` (a deferral rule that reads only the drafter, e.g. ``Chow``) with
    the traced ``sp.alpha``: the sequential token cascade. ``rule=None``: the
    original BiLD's fallback, ``max q < 1 - fallback_alpha`` (static)."""

    rule: DeferralRule | None = None
    fallback_alpha: float = 0.5

    def defers(self, q_stat_BxV: Array, sp) -> Array:
        """bool [B]: stop drafting before sampling at this position."""
        if self.rule is not None:
            return self.rule.defer(None, None, q_stat_BxV, None, sp.alpha)
        return jnp.max(q_stat_BxV, axis=-1) < 1.0 - self.fallback_alpha

    def start(self, params, first, sp):
        del params
        return None, self.defers(first.stats, sp)

    def after(self, params, rule_state, token_B, e_BxD, dist, sp):
        del params, token_B, e_BxD
        return rule_state, self.defers(dist.stats, sp)


def draft_until(step_fn, cache, first_logits_BxV: Array, first_hidden_BxD: Array, num: int,
                key: Array, rule: StopRule, rule_params, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig, steps_per_check: int = 1) -> DraftLoop:
    """The lockstep draft loop (module docstring), for any drafter and rule.

    ``first_logits`` give ``q_1`` (the drafter's output after the pending
    token, ``first_hidden`` = ``e_0``); ``step_fn(cache, d_i, e_{i-1}) ->
    (logits [B, V], e_i [B, D], cache)`` feeds draft ``d_i`` (a model reads
    its cache; a feature head also reads its previous prediction ``e_{i-1}``).
    ``steps_per_check``: steps between two reads of the loop's condition
    (``loops.checked_while_loop``; the same drafts for every value).
    Returns the loop's final state: ``step`` is the number of lockstep steps.
    """
    if num < 1:
        raise ValueError(f"K_max (the most drafts a row may offer: the decoder's gamma) must "
                         f"be >= 1, got {num}.")
    keys = jax.random.split(key, num + 1)
    first = sampling.distributions(first_logits_BxV, sp.temperature, sp.top_p, config)
    batch = first.probs.shape[0]
    tokens = jnp.zeros((batch, num), jnp.int32).at[:, 0].set(
        sample_from_weights(keys[0], first.probs))
    grid = lambda x_BxX: jnp.zeros((batch, num + 1) + x_BxX.shape[1:],  # noqa: E731
                                   x_BxX.dtype).at[:, 0].set(x_BxX)
    rule_state, stop_first_B = rule.start(rule_params, first, sp)
    loop = DraftLoop(step=jnp.int32(0), cache=cache, tokens=tokens, q=grid(first.probs),
                     q_stat=grid(first.stats), hidden=grid(first_hidden_BxD),
                     rule_state=rule_state,
                     count=jnp.where(stop_first_B, 0, num).astype(jnp.int32),
                     stopped=stop_first_B, nan=has_nan(first_logits_BxV))

    def cond_fn(loop):
        return (loop.step < num) & ~jnp.all(loop.stopped)

    def body_fn(loop):
        i = loop.step + 1  # feed d_i
        token_B = loop.tokens[:, i - 1]
        previous_BxD = jax.lax.dynamic_index_in_dim(loop.hidden, i - 1, 1, keepdims=False)
        logits_BxV, e_BxD, cache = step_fn(loop.cache, token_B, previous_BxD)
        dist = sampling.distributions(logits_BxV, sp.temperature, sp.top_p, config)
        rule_state, stop_B = rule.after(rule_params, loop.rule_state, token_B, e_BxD, dist, sp)
        stop_now = ~loop.stopped & (stop_B | (i >= num))
        # d_{i+1} ~ q_{i+1} goes to slot i (none is left after d_num).
        slot = jnp.minimum(i, num - 1)
        next_B = jnp.where(i < num, sample_from_weights(keys[i], dist.probs),
                           loop.tokens[:, slot])
        put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, i, 1)  # noqa: E731
        return loop.replace(
            step=i, cache=cache,
            tokens=jax.lax.dynamic_update_index_in_dim(loop.tokens, next_B, slot, 1),
            q=put(loop.q, dist.probs), q_stat=put(loop.q_stat, dist.stats),
            hidden=put(loop.hidden, e_BxD.astype(loop.hidden.dtype)), rule_state=rule_state,
            count=jnp.where(stop_now, i, loop.count), stopped=loop.stopped | stop_now,
            nan=loop.nan + jnp.where(loop.stopped, 0, has_nan(logits_BxV)))

    return loops.checked_while_loop(cond_fn, body_fn, loop, steps_per_check)


def model_step(model: LanguageModel, params):
    """``draft_until``'s step for a model: feed ``d_i`` to its cache."""
    def step(cache, token_B, previous_BxD):
        del previous_BxD  # a model's cache holds all it reads
        out = model.extend(params, token_B[:, None], cache)
        return out.logits[:, 0], out.hidden[:, 0], out.cache
    return step


# The paper lets the drafter run at most 10 tokens before the target is called
# (SpecCascade App. E.1, following Kim et al.); longer runs make the target's catch-up slow.
MAX_CONSECUTIVE_DRAFTS = 10


@dataclasses.dataclass(frozen=True)
class DraftUntilDrafter(SingleModelDrafter):
    """A model drafting one token a call until ``stop`` (a ``DeferralStop``)
    says the next position would defer to the target, or ``num`` drafts (the
    decoder's gamma: at most ``MAX_CONSECUTIVE_DRAFTS`` in the paper). Each row
    offers ``count`` drafts; the target scores at the smallest of ``widths``
    covering the longest row. Its reported calls are each row's own (the
    catch-up and one per draft it fed), as a token-by-token loop would make."""

    model: LanguageModel
    stop: DeferralStop = DeferralStop()
    name: str = "drafter"
    widths: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 11)

    def target_widths(self, max_drafts: int) -> tuple[int, ...]:
        return self.widths

    def propose(self, params, state: ModelDrafterState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, ModelDrafterState]:
        del with_next  # q_{count + 1} is always known: the rule read it
        logits, hidden, cache, calls_B, _, _ = extend_from_history(self.model, params,
                                                                   state.cache, context, None,
                                                                   (1,))
        loop = draft_until(model_step(self.model, params), cache, logits[:, 0], hidden[:, 0],
                           num, key, self.stop, None, sp, config)
        # One token a call: the catch-up's calls, then one per draft the row fed.
        calls_Bx1 = (calls_B + loop.count)[:, None]
        proposal = Proposal(tokens=loop.tokens, q=loop.q, q_stat=loop.q_stat, hidden=None,
                            calls=calls_Bx1, fed=calls_Bx1, single=calls_Bx1, nan=loop.nan,
                            count=loop.count)
        return proposal, ModelDrafterState(cache=loop.cache)
