"""An enumerable n-gram model behind the model interface, for exactness tests.

``TableLM`` looks up next-token logits from a table indexed by the last
``order`` tokens (context-dependent, unlike a unigram toy), so the exact
distribution of any short continuation can be enumerated and compared with
what a decoding loop samples. Positions before the start read token 0.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import interface
from specdec_jax.models.interface import Prompt, StepOutput

Array = jax.Array


@flax.struct.dataclass
class TableCache:
    history: Array  # int32 [B, S]: tokens fed so far (entries >= lengths are stale)
    lengths: Array  # int32 [B]

    @property
    def max_length(self) -> int:
        return self.history.shape[1]


@dataclasses.dataclass(frozen=True)
class TableLM:
    """Next-token logits = ``params["table"][context index]`` (V ** order rows)."""

    vocab_size: int
    order: int = 2

    def init_params(self, rng: Array, scale: float = 1.5) -> dict:
        rows = self.vocab_size ** self.order
        return {"table": scale * jax.random.normal(rng, (rows, self.vocab_size))}

    def init_cache(self, batch_size: int, max_length: int) -> TableCache:
        return TableCache(history=jnp.zeros((batch_size, max_length), jnp.int32),
                          lengths=jnp.zeros((batch_size,), jnp.int32))

    def context_index(self, context: tuple[int, ...]) -> int:
        """Table row of a context (oldest token first), for host-side enumeration."""
        padded = (0,) * max(0, self.order - len(context)) + tuple(context)[-self.order:]
        return int(sum(t * self.vocab_size ** i for i, t in enumerate(reversed(padded))))

    def next_probs(self, params: dict, context: tuple[int, ...]) -> np.ndarray:
        """Host-side next-token distribution (softmax of the table row)."""
        row = np.asarray(params["table"][self.context_index(context)], np.float64)
        e = np.exp(row - row.max())
        return e / e.sum()

    def _run(self, params, tokens_BxK, cache):
        batch, k = tokens_BxK.shape
        history = interface.write_at_lengths(
            cache.history[..., None, None], tokens_BxK[..., None, None],
            cache.lengths)[..., 0, 0]
        positions_BxK = cache.lengths[:, None] + jnp.arange(k)[None, :]
        index_BxK = jnp.zeros((batch, k), jnp.int32)
        for back in range(self.order):  # back = 0 is the token just fed
            pos = positions_BxK - back
            tok = jnp.where(pos >= 0, jnp.take_along_axis(history, jnp.maximum(pos, 0), 1), 0)
            index_BxK = index_BxK + tok * self.vocab_size ** back
        logits = params["table"][index_BxK].astype(jnp.float32)
        hidden = jax.nn.one_hot(index_BxK, self.vocab_size ** self.order)
        return logits, hidden, cache.replace(history=history, lengths=cache.lengths + k)

    def prefill(self, params: dict, prompt: Prompt, cache: TableCache,
                all_hidden: bool = False) -> StepOutput:
        interface.check_prompt(prompt, cache.lengths.shape[0], cache.max_length,
                               self.vocab_size)
        logits, hidden, new_cache = self._run(params, prompt.tokens, cache)
        last_Bx1 = jnp.maximum(prompt.lengths - 1, 0)[:, None]
        return StepOutput(logits=interface.select_positions(logits, last_Bx1),
                          hidden=hidden if all_hidden else
                          interface.select_positions(hidden, last_Bx1),
                          cache=new_cache.replace(lengths=cache.lengths + prompt.lengths))

    def extend(self, params: dict, tokens: Array, cache: TableCache,
               logits_at: Array | None = None) -> StepOutput:
        interface.check_extend(tokens, cache.lengths, cache.max_length, self.vocab_size)
        logits, hidden, new_cache = self._run(params, tokens, cache)
        return StepOutput(logits=interface.select_positions(logits, logits_at),
                          hidden=interface.select_positions(hidden, logits_at),
                          cache=new_cache)

    def score_tree(self, params: dict, tokens: Array, parents: Array, cache: TableCache,
                   start: int | Array = 0) -> StepOutput:
        """Token-tree scoring (``DecoderOnlyLM.score_tree``): node i's context is
        the committed history then the tokens on the path root -> i; its token
        is written to the scratch slot ``lengths + i``, lengths unchanged."""
        interface.check_tree(tokens, parents, cache.lengths, cache.max_length, self.vocab_size,
                             start)
        batch, k = tokens.shape
        n = parents.shape[1]
        write_at_B = cache.lengths + start
        history = interface.write_at_lengths(
            cache.history[..., None, None], tokens[..., None, None], write_at_B)[..., 0, 0]
        rows_B1 = jnp.arange(batch)[:, None]
        slots_BxN = jnp.clip(cache.lengths[:, None] + jnp.arange(n)[None, :], 0,
                             cache.max_length - 1)
        node_tokens_BxN = history[rows_B1, slots_BxN]
        # ``start`` may be traced (a dynamic tree's loop over its equally wide depths).
        nodes = functools.partial(jax.lax.dynamic_slice_in_dim, start_index=start,
                                  slice_size=k, axis=1)
        anc_BxKxN = nodes(interface.tree_ancestors(parents.astype(jnp.int32)))
        all_depth_BxN = interface.tree_depths(parents.astype(jnp.int32))
        depth_BxK = nodes(all_depth_BxN)
        index_BxK = jnp.zeros((batch, k), jnp.int32)
        for back in range(self.order):  # back = 0 is the node's own token
            # The ancestor at depth d_i - back (on the path), else the committed
            # history at position L + d_i - back (token 0 before the start).
            on_path_BxKxN = anc_BxKxN & (all_depth_BxN[:, None, :] == depth_BxK[..., None] - back)
            from_tree_BxK = jnp.sum(jnp.where(on_path_BxKxN, node_tokens_BxN[:, None, :], 0),
                                    axis=-1)
            pos_BxK = cache.lengths[:, None] + depth_BxK - back
            from_history_BxK = jnp.where(
                pos_BxK >= 0, history[rows_B1, jnp.clip(pos_BxK, 0, cache.max_length - 1)], 0)
            tok = jnp.where(back <= depth_BxK, from_tree_BxK, from_history_BxK)
            index_BxK = index_BxK + tok * self.vocab_size ** back
        logits = params["table"][index_BxK].astype(jnp.float32)
        hidden = jax.nn.one_hot(index_BxK, self.vocab_size ** self.order)
        return StepOutput(logits=logits, hidden=hidden, cache=cache.replace(history=history))

    def commit_path(self, cache: TableCache, nodes: Array, count: Array) -> TableCache:
        """Keeps the accepted path's tokens (``DecoderOnlyLM.commit_path``)."""
        history = interface.commit_tree_path(cache.history, cache.lengths, nodes, count)
        return cache.replace(history=history,
                             lengths=cache.lengths + count.astype(cache.lengths.dtype))
