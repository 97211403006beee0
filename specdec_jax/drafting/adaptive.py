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
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.drafting.acceptance_head import AcceptanceHead
from specdec_jax.drafting.base import (
    Context,
    Proposal,
    extend_from_history,
    start_token_and_prefill,
)
from specdec_jax.drafting.model import ModelDrafterState, SingleModelDrafter, has_nan
from specdec_jax.models.interface import LanguageModel, Prompt
from specdec_jax.verify import sample_from_weights

Array = jax.Array

DEFAULT_MAX_DRAFTS = 20  # K_max of SpecDec++ (Huang et al.)
# Target call widths (tokens fed: pending + drafts) compiled besides K_max + 1.
SMALL_TARGET_WIDTHS = (2, 4, 8, 12)


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


def target_widths(max_drafts: int, small=SMALL_TARGET_WIDTHS) -> tuple[int, ...]:
    """The target call widths to compile for ``max_drafts``: a few small ones
    and ``max_drafts + 1`` (every row drafted the maximum)."""
    return tuple(sorted({w for w in small if w < max_drafts + 1} | {max_drafts + 1}))


@dataclasses.dataclass(frozen=True)
class AdaptiveDrafter(SingleModelDrafter):
    """A neural drafter with SpecDec++'s stopping rule (module docstring).

    Params: ``(model_params, head_params)`` from ``select_params({name: ...,
    name + "/acceptance_head": ...})``. ``eos_ids`` end a row's block at an
    EOS draft. ``widths`` overrides the target call widths (``target_widths``).
    """

    model: LanguageModel
    head: AcceptanceHead
    name: str = "drafter"
    eos_ids: tuple[int, ...] = ()
    widths: tuple[int, ...] | None = None
    catch_up_widths: tuple[int, ...] = (1, 2)

    @property
    def head_name(self) -> str:
        return f"{self.name}/acceptance_head"

    def target_widths(self, max_drafts: int) -> tuple[int, ...]:
        widths = target_widths(max_drafts) if self.widths is None else tuple(sorted(self.widths))
        if widths[-1] != max_drafts + 1 or widths[0] < 1:
            raise ValueError(f"target widths {widths} must be >= 1 and end at K_max + 1 = "
                             f"{max_drafts + 1} (a row may draft K_max tokens).")
        return widths

    def select_params(self, named: dict):
        missing = [k for k in (self.name, self.head_name) if k not in named]
        if missing:
            raise KeyError(f"adaptive drafter {self.name!r} needs params {missing}; pass the "
                           "drafter's weights and its acceptance head's (load_head).")
        return named[self.name], named[self.head_name]

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> ModelDrafterState:
        del encoder_decoder
        cache, _ = start_token_and_prefill(self.model, params[0], prompt, max_length)
        return ModelDrafterState(cache=cache)

    def propose(self, params, state: ModelDrafterState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, ModelDrafterState]:
        del with_next  # every offered draft is fed (the head needs e_i): q_{count+1} is known
        if num < 1:
            raise ValueError(f"K_max (the decoder's gamma) must be >= 1, got {num}.")
        model_params, head_params = params
        keys = jax.random.split(key, num + 1)
        logits, hidden, cache, calls_B, fed_B, single_B = extend_from_history(
            self.model, model_params, state.cache, context, None, self.catch_up_widths)
        first = sampling.distributions(logits[:, 0], sp.temperature, sp.top_p, config)
        batch = first.probs.shape[0]
        tokens = jnp.zeros((batch, num), jnp.int32).at[:, 0].set(
            sample_from_weights(keys[0], first.probs))
        grid = lambda x_BxX: jnp.zeros((batch, num + 1) + x_BxX.shape[1:],  # noqa: E731
                                       x_BxX.dtype).at[:, 0].set(x_BxX)
        is_eos = lambda t_B: jnp.isin(t_B, jnp.asarray(self.eos_ids or (-1,), jnp.int32))  # noqa: E731
        loop = _DraftLoop(step=jnp.int32(0), cache=cache, tokens=tokens, q=grid(first.probs),
                          q_stat=grid(first.stats), hidden=grid(hidden[:, 0]),
                          log_p_hat=jnp.zeros((batch,), jnp.float32),
                          count=jnp.full((batch,), num, jnp.int32),
                          stopped=jnp.zeros((batch,), bool), nan=has_nan(logits))
        log_h = jnp.log1p(-sp.stop_threshold)  # stop when log P_hat < log(1 - h)

        def cond_fn(loop):
            return (loop.step < num) & ~jnp.all(loop.stopped)

        def body_fn(loop):
            i = loop.step + 1  # feed d_i
            token_B = loop.tokens[:, i - 1]
            out = self.model.extend(model_params, token_B[:, None], loop.cache)
            dist = sampling.distributions(out.logits[:, 0], sp.temperature, sp.top_p, config)
            e_BxD = out.hidden[:, 0]
            log_p_hat = loop.log_p_hat + jax.nn.log_sigmoid(
                self.head.logits(head_params, e_BxD))
            stop_now = ~loop.stopped & ((log_p_hat < log_h) | is_eos(token_B) | (i >= num))
            # d_{i+1} ~ q_{i+1} goes to slot i (none is left after d_G).
            slot = jnp.minimum(i, num - 1)
            next_B = jnp.where(i < num, sample_from_weights(keys[i], dist.probs),
                               loop.tokens[:, slot])
            put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, i, 1)  # noqa: E731
            return loop.replace(
                step=i, cache=out.cache,
                tokens=jax.lax.dynamic_update_index_in_dim(loop.tokens, next_B, slot, 1),
                q=put(loop.q, dist.probs), q_stat=put(loop.q_stat, dist.stats),
                hidden=put(loop.hidden, e_BxD), log_p_hat=log_p_hat,
                count=jnp.where(stop_now, i, loop.count), stopped=loop.stopped | stop_now,
                nan=loop.nan + has_nan(out.logits))

        loop = jax.lax.while_loop(cond_fn, body_fn, loop)
        steps = loop.step  # the batch's lockstep calls after the catch-up window
        proposal = Proposal(tokens=loop.tokens, q=loop.q, q_stat=loop.q_stat, hidden=loop.hidden,
                            calls=(calls_B + steps)[:, None], fed=(fed_B + steps)[:, None],
                            single=(single_B + steps)[:, None], nan=loop.nan, count=loop.count)
        return proposal, ModelDrafterState(cache=loop.cache)
