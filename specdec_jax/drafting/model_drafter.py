"""A neural drafter: one small model sampled autoregressively (Leviathan et al.)."""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.drafting.base import Context, Proposal, extend_from_history, pad_to
from specdec_jax.models.interface import LanguageModel, Prompt, start_token_and_prefill
from specdec_jax.sampling import sample_from_weights

Array = jax.Array


def has_nan(logits) -> Array:
    """int32 [B]: 1 where a row's logits hold a NaN."""
    return jnp.any(jnp.isnan(logits), axis=tuple(range(1, logits.ndim))).astype(jnp.int32)


def default_catch_up_widths(backend: str | None = None) -> tuple[int, ...]:
    """The window widths a ``ModelDrafter`` compiles for a round's first call.

    On CPU a 2-token call of the 0.5B drafter costs 2.4x a 1-token one (XLA's
    CPU path for a few-row product streams the weights at half the rate of
    its matrix-vector path), so a row that must catch up on one token is fed
    by two 1-token calls, the first without the output head: ``(1,)``. In-loop
    costs predict 2-3% per round on the README's first command; two
    interleaved runs gave +7% and -2%, inside that machine's noise
    (``benchmarks/configs/drafter_variants.gin``). On accelerators a 2-token call
    costs about one step: ``(1, 2)``.
    """
    return (1,) if (backend or jax.default_backend()) == "cpu" else (1, 2)


@flax.struct.dataclass
class ModelDrafterState:
    cache: object  # the model's cache; cache.lengths = history tokens it holds


class SingleModelDrafter:
    """What drafters that run one neural model (``self.model``, named
    ``self.name``) share: the vocabulary, the model's name and params, its
    prefill, and rewinding its cache (a ``ModelDrafterState``) to the history
    tokens that were kept."""

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.name,)

    def select_params(self, named: dict):
        return named[self.name]

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> ModelDrafterState:
        del encoder_decoder  # the model knows its own kind
        cache, _ = start_token_and_prefill(self.model, params, prompt, max_length)
        return ModelDrafterState(cache=cache)

    def rewind(self, state: ModelDrafterState, valid_B: Array) -> ModelDrafterState:
        cache = state.cache
        return state.replace(cache=cache.replace(lengths=jnp.minimum(cache.lengths, valid_B)))


@dataclasses.dataclass(frozen=True)
class ModelDrafter(SingleModelDrafter):
    """Samples ``G`` tokens from ``model``, one forward call per token.

    A round's first call feeds a window ending at the pending token (width 1,
    or 2 when a row must also catch up on the last draft of a previous round
    that accepted all ``G`` without feeding it; with width 1 alone, that draft
    is first fed by a 1-token call that skips the output head), then each draft
    but the last is fed one at a time. With ``with_next`` the last draft is
    fed too, giving ``q_{G+1}``: ``G + 1`` calls, as the classic loop does;
    without it ``G`` calls (the saved step is caught up by the next window).

    Keys: ``split(key, G + 1)``; draft ``d_i`` is sampled with key ``i - 1``
    (the same tokens as the pre-interface loop for the same key).
    """

    model: LanguageModel
    name: str = "drafter"
    # Width 1 (the pending token alone) serves rounds where no row lags; width
    # 2 also feeds a draft the previous round accepted without feeding it.
    # None: chosen for the backend (``default_catch_up_widths``).
    catch_up_widths: tuple[int, ...] | None = None
    # Unrolls the draft steps into straight-line code (same drafts). A compiler's
    # cost analysis counts a loop body once, so a round priced as one program
    # (``jobs.tpu_programs``' round programs) needs each step visible.
    unroll: bool = False

    @property
    def widths(self) -> tuple[int, ...]:
        return self.catch_up_widths or default_catch_up_widths()

    def propose(self, params, state: ModelDrafterState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, ModelDrafterState]:
        keys = jax.random.split(key, num + 1)
        logits, hidden, cache, calls_B, fed_B, single_B = extend_from_history(
            self.model, params, state.cache, context, None, self.widths)
        first = sampling.distributions(logits[:, 0], sp.temperature, sp.top_p, config)
        first_B = sample_from_weights(keys[0], first.probs)
        nan_B = has_nan(logits)

        def body_fn(carry, step_key):
            cache, token_B = carry
            out = self.model.extend(params, token_B[:, None], cache)
            dist = sampling.distributions(out.logits[:, 0], sp.temperature, sp.top_p, config)
            next_B = sample_from_weights(step_key, dist.probs)
            return (out.cache, next_B), (next_B, dist.probs, dist.stats, out.hidden[:, 0],
                                         has_nan(out.logits))

        steps = num - 1 + int(with_next)
        (cache, _), (tokens_TxB, q_TxBxV, qs_TxBxV, hidden_TxBxD, nan_TxB) = jax.lax.scan(
            body_fn, (cache, first_B), keys[1:1 + steps],
            unroll=max(steps, 1) if self.unroll else 1)
        # [T, B, ...] -> [B, T, ...], prefixed with the first call's outputs.
        cat = lambda head, rest: jnp.concatenate([head[:, None], jnp.moveaxis(rest, 0, 1)], 1)
        tokens_BxG = cat(first_B, tokens_TxB)[:, :num]
        q = pad_to(cat(first.probs, q_TxBxV), num + 1)
        q_stat = pad_to(cat(first.stats, qs_TxBxV), num + 1)
        hidden = pad_to(cat(hidden[:, 0], hidden_TxBxD), num + 1)
        proposal = Proposal(tokens=tokens_BxG, q=q, q_stat=q_stat, hidden=hidden,
                            calls=(calls_B + steps)[:, None], fed=(fed_B + steps)[:, None],
                            single=(single_B + steps)[:, None],
                            nan=nan_B + jnp.sum(nan_TxB, axis=0))
        return proposal, ModelDrafterState(cache=cache)
