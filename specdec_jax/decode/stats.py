"""What every generation returns beside its tokens: per-row counters of the
calls each model made, the drafts offered and accepted, deferrals and NaNs,
so evaluation and the cost model never re-derive them (``count_round`` adds
one round of any decoder to them).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


@flax.struct.dataclass
class GenerationStats:
    """Per-row counters returned with every generation."""

    target_calls: Array  # int32 [B]: target forward calls (rounds, or steps for AR)
    target_fed: Array  # int32 [B]: tokens those calls fed (a cost model prices them)
    target_single_calls: Array  # int32 [B]: target calls that fed one token
    drafter_calls: Array  # int32 [B]: neural drafter forward calls, all models
    drafter_calls_by_model: Array  # int32 [B, M]: per drafter model (drafter.model_names)
    drafter_tokens_by_model: Array  # int32 [B, M]: tokens those calls fed
    drafter_single_calls_by_model: Array  # int32 [B, M]: those calls that fed one token
    accepted_histogram: Array  # int32 [B, G + 1]: rounds that accepted j drafts
    rejections: Array  # int32 [B]: rounds that rejected a draft (j < the drafts offered)
    drafted: Array  # int32 [B]: drafts offered for verification (G per round, or fewer
    #                 when an adaptive drafter stops early; a tree's deepest path, the
    #                 most drafts its round can accept); discarded = drafted - accepted
    drafted_nodes: Array  # int32 [B]: tokens drafted for verification (= drafted for
    #                 chains; every node of a tree, N per round)
    # int32 [B, K]: accepted drafts by their rank among their siblings (0 = their
    # parent's first-drawn child; a chain's drafts are all rank 0, K = 1)
    accepted_by_rank: Array
    deferred_mass: Array  # float32 [B]: sum over emitted positions of the deferral indicator
    emitted: Array  # int32 [B]: tokens emitted (== lengths)
    nan_logits: Array  # int32 [B]: model calls whose logits held NaN (must stay 0)
    # float32 [B]: sum of log q_stat(token) over the emitted tokens (autoregressive
    # decoders only; a sequence-level cascade defers on it; 0 elsewhere)
    sequence_logprob: Array

    def accepted(self) -> Array:
        """int32 [B]: drafts accepted per row, sum over rounds (from the histogram)."""
        histogram = self.accepted_histogram
        return (histogram * jnp.arange(histogram.shape[-1])).sum(-1)



@flax.struct.dataclass
class GenerationOutput:
    tokens: Array  # int32 [B, max_new_tokens]: generated tokens, padded with pad_id
    lengths: Array  # int32 [B]: valid tokens per row (includes the EOS if one was emitted)
    stats: GenerationStats



def zero_stats(batch: int, gamma: int, num_models: int = 0,
               ranks: int = 1) -> GenerationStats:
    """All-zero statistics for ``batch`` rows, ``gamma`` drafts a round (a
    tree's depth), ``num_models`` drafters and ``ranks`` sibling ranks (a
    tree's widest node; 1 for chains): where every decoding loop starts counting."""
    zeros = jnp.zeros((batch,), jnp.int32)
    by_model = jnp.zeros((batch, num_models), jnp.int32)
    return GenerationStats(target_calls=zeros, target_fed=zeros, target_single_calls=zeros,
                           drafter_calls=zeros,
                           drafter_calls_by_model=by_model, drafter_tokens_by_model=by_model,
                           drafter_single_calls_by_model=by_model,
                           accepted_histogram=jnp.zeros((batch, gamma + 1), jnp.int32),
                           rejections=zeros, drafted=zeros, drafted_nodes=zeros,
                           accepted_by_rank=jnp.zeros((batch, ranks), jnp.int32),
                           deferred_mass=jnp.zeros((batch,), jnp.float32),
                           emitted=zeros, nan_logits=zeros,
                           sequence_logprob=jnp.zeros((batch,), jnp.float32))



def count_round(stats: GenerationStats, active_B: Array, *, target_fed, target_single,
                drafter_calls_BxM: Array, drafter_fed_BxM: Array, drafter_single_BxM: Array,
                accepted_B: Array, rejected_B: Array, offered_B: Array, nodes_B,
                by_rank_BxK: Array, deferred_B: Array, emitted_B: Array,
                nan_B: Array) -> GenerationStats:
    """The statistics after one round of every decoder (chains, trees, the
    cascade baselines): each count grows on the rows still ``active``.

    ``target_fed`` / ``target_single``: tokens the target call fed and whether
    it fed one; ``drafter_*_BxM``: each drafter model's calls, tokens fed and
    one-token calls; ``accepted_B`` drafts kept, ``rejected_B`` whether a draft
    was rejected, ``offered_B`` the most drafts the round could accept (a
    chain's G, a tree's deepest path), ``nodes_B`` the tokens drafted for
    verification, ``by_rank_BxK`` the accepted drafts by sibling rank,
    ``deferred_B`` the deferral indicators summed over the emitted positions,
    ``emitted_B`` the row's tokens so far, ``nan_B`` calls with NaN logits.
    """
    active = active_B.astype(jnp.int32)
    active_Bx1 = active[:, None]
    histogram = stats.accepted_histogram
    return stats.replace(
        target_calls=stats.target_calls + active,
        target_fed=stats.target_fed + active * target_fed,
        target_single_calls=stats.target_single_calls + active * target_single,
        drafter_calls=stats.drafter_calls + active * jnp.sum(drafter_calls_BxM, axis=-1),
        drafter_calls_by_model=stats.drafter_calls_by_model + active_Bx1 * drafter_calls_BxM,
        drafter_tokens_by_model=stats.drafter_tokens_by_model + active_Bx1 * drafter_fed_BxM,
        drafter_single_calls_by_model=stats.drafter_single_calls_by_model +
        active_Bx1 * drafter_single_BxM,
        accepted_histogram=histogram + active_Bx1 * jax.nn.one_hot(
            accepted_B, histogram.shape[-1], dtype=jnp.int32),
        rejections=stats.rejections + active * rejected_B,
        drafted=stats.drafted + active * offered_B,
        drafted_nodes=stats.drafted_nodes + active * nodes_B,
        accepted_by_rank=stats.accepted_by_rank + active_Bx1 * by_rank_BxK,
        deferred_mass=stats.deferred_mass + jnp.where(active_B, deferred_B, 0.0),
        emitted=emitted_B,
        nan_logits=stats.nan_logits + active * nan_B)

