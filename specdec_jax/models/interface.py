"""The functional model interface every decoder in specdec_jax implements.

A model is a frozen dataclass with pure methods; parameters are passed in and
nothing is stored, so the decoding loops can trace any model the same way:

    cache = model.init_cache(batch_size, max_length)
    out = model.prefill(params, prompt, cache)      # feed the prompts
    out = model.extend(params, tokens_BxK, out.cache)  # feed K more tokens per row
    out = model.extend(params, tokens_BxK, cache, logits_at=at_BxN)  # outputs at N of them

Decoder-only models also score token trees in one call (``score_tree``,
``commit_path``; 'Token trees' below; docs/algorithms.md, 'Token trees').

``logits_at`` (int32 [B, N], offsets into the K fed tokens) returns logits and
hidden states only at those positions. The output head is the largest matmul
of a small model's step (a 151,936-row tied embedding in Qwen2.5); a caller
that feeds tokens only to fill the cache (a drafter catching up) skips it for
the rows it discards.

Rollback semantics (the whole of speculative decoding's bookkeeping rests on
this): the cache stores, per row, ``lengths[b]`` = number of tokens fed so far.
``extend`` writes the K new keys/values at positions ``lengths[b] .. lengths[b]
+ K - 1`` and returns ``lengths + K``. Attention masks every key at or beyond a
row's length, so rolling back is only ``cache.replace(lengths=new_lengths)``;
the stale entries are overwritten by the next ``extend``.

Worked example (one row, G = 3 drafts):
    lengths before = 7           (prompt + accepted tokens)
    extend([pending, d1, d2, d3])  -> logits at 4 positions, lengths = 11
    verifier accepts d1 only (j = 1) and emits a correction y
    rollback: lengths = 7 + 1 + j = 9   (keeps pending and d1)
    next round feeds [y, ...] starting at position 9.
Rows of a batch roll back by different amounts; each row's lengths is its own.
"""

from __future__ import annotations

from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
# A flax.struct.dataclass with an int32 [B] ``lengths`` field. Optionally ``window(start,
# width)`` and ``with_window(window, start, lengths)`` (``DecoderCache``'s): a call that
# picks its width at run time then returns only the positions it wrote
# (``switch_writing_windows``).
Cache = Any


@flax.struct.dataclass
class Prompt:
    """A ragged batch of prompts, right-padded.

    Decoder-only models feed ``tokens[b, :lengths[b]]``. Encoder-decoder models
    encode them (the decoder starts from its start token).
    """

    tokens: Array  # int32 [B, P]: token ids, right-padded (padding is ignored)
    lengths: Array  # int32 [B]: number of real tokens in each row


@flax.struct.dataclass
class StepOutput:
    """What one model call returns."""

    logits: Array  # float32 [B, K, V]: next-token logits after each fed token
    hidden: Array  # [B, K, D]: final hidden states (input of the SpecDec++ head)
    cache: Cache


class LanguageModel(Protocol):
    """Structural type of every model (see module docstring)."""

    vocab_size: int

    def init_cache(self, batch_size: int, max_length: int) -> Cache: ...

    def prefill(self, params: Any, prompt: Prompt, cache: Cache) -> StepOutput: ...

    def extend(self, params: Any, tokens: Array, cache: Cache,
               logits_at: Array | None = None) -> StepOutput: ...


def is_encoder_decoder(model: Any) -> bool:
    """Encoder-decoder models (T5) declare the token their decoder starts from."""
    return getattr(model, "decoder_start_token_id", None) is not None


def make_prompt(token_lists: list[list[int]], pad_to: int | None = None) -> Prompt:
    """Right-pads a list of token lists into a :class:`Prompt`.

    Raises ValueError on an empty batch or a row longer than ``pad_to``.
    """
    if not token_lists:
        raise ValueError("make_prompt: got an empty batch; pass at least one prompt.")
    lengths = [len(t) for t in token_lists]
    width = max(lengths) if pad_to is None else pad_to
    if max(lengths) > width:
        raise ValueError(
            f"make_prompt: a prompt has {max(lengths)} tokens but pad_to={width}; "
            "raise pad_to or shorten the prompt."
        )
    tokens = np.zeros((len(token_lists), max(width, 1)), np.int32)
    for row, toks in enumerate(token_lists):
        tokens[row, : len(toks)] = toks
    return Prompt(tokens=jnp.asarray(tokens), lengths=jnp.asarray(lengths, jnp.int32))


def select_positions(x_BxKx_: Array, at_BxN: Array | None) -> Array:
    """``x[b, at[b, n]]`` along axis 1 (all of ``x`` when ``at`` is None)."""
    if at_BxN is None:
        return x_BxKx_
    index = at_BxN.reshape(at_BxN.shape + (1,) * (x_BxKx_.ndim - 2))
    return jnp.take_along_axis(x_BxKx_, index, axis=1)


def _concrete(x: Any) -> np.ndarray | None:
    """Returns x as numpy when it is a concrete (non-traced) array, else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def check_tokens(tokens: Array, vocab_size: int, where: str) -> None:
    """Fails clearly on out-of-vocabulary ids when ``tokens`` is concrete.

    Inside a jitted loop the ids come from the models themselves and are in
    range by construction, so the check only runs on host values.
    """
    values = _concrete(tokens)
    if values is None or values.size == 0:
        return
    bad = (values < 0) | (values >= vocab_size)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{where}: token id {int(values[first])} at index {first} is outside the "
            f"vocabulary [0, {vocab_size}); check the tokenizer matches the model."
        )


def check_extend(tokens: Array, lengths: Array, max_length: int, vocab_size: int,
                 where: str = "extend") -> None:
    """Static and (when possible) concrete checks for one ``extend`` call."""
    if tokens.ndim != 2:
        raise ValueError(f"{where}: tokens must be int [B, K], got shape {tokens.shape}.")
    if tokens.shape[0] != lengths.shape[0]:
        raise ValueError(
            f"{where}: tokens have batch size {tokens.shape[0]} but the cache was made "
            f"for batch size {lengths.shape[0]}; init_cache with the same batch size."
        )
    if tokens.shape[1] > max_length:
        raise ValueError(
            f"{where}: feeding {tokens.shape[1]} tokens into a cache of max_length "
            f"{max_length}; init_cache with a larger max_length."
        )
    check_tokens(tokens, vocab_size, where)
    lens = _concrete(lengths)
    if lens is not None and (lens + tokens.shape[1] > max_length).any():
        row = int(np.argmax(lens + tokens.shape[1] > max_length))
        raise ValueError(
            f"{where}: row {row} holds {int(lens[row])} tokens; feeding "
            f"{tokens.shape[1]} more passes the cache's end (max_length {max_length}). "
            "init_cache with a larger max_length or roll back first."
        )


def check_prompt(prompt: Prompt, batch_size: int, max_length: int, vocab_size: int,
                 where: str = "prefill") -> None:
    """Checks a prompt against a cache before prefill."""
    if prompt.tokens.shape[0] != batch_size:
        raise ValueError(
            f"{where}: prompt batch size {prompt.tokens.shape[0]} != cache batch size "
            f"{batch_size}; init_cache with the prompt's batch size."
        )
    lens = _concrete(prompt.lengths)
    if prompt.tokens.shape[1] > max_length or (lens is not None and (lens > max_length).any()):
        longest = int(lens.max()) if lens is not None else prompt.tokens.shape[1]
        raise ValueError(
            f"{where}: a prompt of {longest} tokens does not fit a cache of max_length "
            f"{max_length}; init_cache with a larger max_length or shorten the prompt."
        )
    if lens is not None and (lens < 0).any():
        raise ValueError(f"{where}: negative prompt length in {lens.tolist()}.")
    check_tokens(prompt.tokens, vocab_size, where)


def _at_positions(rows: Array, positions: Array, seq_axis: int) -> tuple:
    """The index of ``buffer[rows, ..., positions, ...]`` with positions on
    ``seq_axis``; its selection is ``[*rows.shape, <the other axes>]`` either
    way (numpy puts indices split by a slice first)."""
    return (rows,) + (slice(None),) * (seq_axis - 1) + (positions,)


def write_at_lengths(buffer: Array, new_BxKx_: Array, lengths_B: Array,
                     seq_axis: int = 1) -> Array:
    """Writes K new entries per row at positions lengths[b] .. lengths[b]+K-1
    of the buffer's ``seq_axis`` (``[B, S, ...]``, or ``[B, H, S, D]`` with
    axis 2, the decoder's heads-major cache; the new entries are ``[B, K,
    ...]`` either way).

    Positions past the buffer's end are dropped (never clamped onto valid
    entries); callers validate bounds before tracing.
    """
    batch, k = new_BxKx_.shape[:2]
    positions_BxK = lengths_B[:, None] + jnp.arange(k)[None, :]
    rows_BxK = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, k))
    return buffer.at[_at_positions(rows_BxK, positions_BxK, seq_axis)].set(
        new_BxKx_.astype(buffer.dtype), mode="drop")


def read_at_lengths(buffer: Array, lengths_B: Array, k: int, seq_axis: int = 1) -> Array:
    """The K entries per row at positions lengths[b] .. lengths[b]+K-1 of the
    buffer's ``seq_axis``, as ``[B, K, ...]``: what ``write_at_lengths`` takes.
    Positions past the buffer's end read its last entry (``write_at_lengths``
    drops them again)."""
    batch = buffer.shape[0]
    positions_BxK = jnp.clip(lengths_B[:, None] + jnp.arange(k)[None, :], 0,
                             buffer.shape[seq_axis] - 1)
    rows_BxK = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, k))
    return buffer[_at_positions(rows_BxK, positions_BxK, seq_axis)]


def switch_writing_windows(branch: Array, calls, cache: Cache, most: int):
    """``lax.switch(branch, calls, cache)`` for calls that feed a model: each
    returns ``(outputs, new cache)``, the new cache differing from ``cache``
    only in its lengths and at positions ``cache.lengths[b] .. + most - 1``.

    Why: a branch that returns the whole cache has it as its result, and the
    TPU compiler (libtpu 0.0.42, v5e) copied every layer's keys and values out
    of the branch and again into the loop's state: SpecDec++'s switch over two
    target widths held 112 such copies, 40 MB of HBM temporaries. Where the
    cache can hand out that window (``window`` / ``with_window``, as
    ``DecoderCache`` does), the branches return only the window and the cache
    is written once after the switch: the same values in the same places
    (SpecDec++'s program: 0.292 -> 0.265 GiB of temporaries). Other caches
    take the plain switch."""
    if not hasattr(cache, "window"):
        return jax.lax.switch(branch, calls, cache)

    def windowed(call):
        def run(cache):
            outputs, new_cache = call(cache)
            return outputs, new_cache.window(cache.lengths, most), new_cache.lengths
        return run

    outputs, window, lengths_B = jax.lax.switch(branch, [windowed(c) for c in calls], cache)
    return outputs, cache.with_window(window, cache.lengths, lengths_B)


def causal_cache_mask(lengths_B: Array, k: int, max_length: int) -> Array:
    """bool [B, K, S]: query i of row b (at position lengths[b] + i) sees key s
    iff s <= lengths[b] + i. Keys at or beyond the row's new length are stale."""
    query_pos_BxK = lengths_B[:, None] + jnp.arange(k)[None, :]
    key_pos_S = jnp.arange(max_length)
    return key_pos_S[None, None, :] <= query_pos_BxK[:, :, None]


# --------------------------------------------------------------------------
# Token trees (docs/algorithms.md, 'Token trees'): N nodes scored in one call.
#
# A tree is ``parents`` (int32 [B, N]): ``parents[b, i]`` is the index of node
# i's parent, -1 for a child of the round's root (the last committed token);
# nodes are in topological order (``parents[b, i] < i``). Node i has depth
# ``d_i`` = its number of ancestors in the tree and sits at position
# ``L + d_i`` (L = the row's committed length, ``cache.lengths``); it attends
# to the whole committed cache and to its ancestors including itself. Its
# keys/values go to the scratch slot ``L + i``; the cache's lengths stay L, so
# nothing is committed until ``commit_path`` moves the accepted path's entries
# to ``L .. L + a - 1``. The parents are data: one compiled program serves
# every tree of N nodes.
#
# Worked example (L = 5): parents [-1, -1, 0, 0, 2] is
#       root ─┬─ 0 ─┬─ 2 ── 4
#             │     └─ 3
#             └─ 1
# depths [0, 0, 1, 1, 2], positions [5, 5, 6, 6, 7], scratch slots 5 .. 9;
# node 4 sees slots 0..4 (the cache), 5 (node 0), 7 (node 2) and 9 (itself).
# Accepting the path 0 -> 2 -> 4: ``commit_path(cache, [[0, 2, 4]], [3])``
# copies slots 5, 7, 9 to 5, 6, 7 and sets lengths to 8. A chain is the tree
# ``parents[i] = i - 1``; scoring it equals ``extend`` and committing all of it
# leaves the cache ``extend`` leaves.
#
# ``score_tree(..., start=s)`` scores only nodes ``s .. s + K - 1`` (a drafter
# grows its tree one depth per call). ``s`` may be a traced int32 scalar: the
# dynamic tree drafter scores its equally wide depths in a ``fori_loop``, so an
# implementation slices with ``lax.dynamic_slice``, not Python indexing.


def supports_trees(model: Any) -> bool:
    return callable(getattr(model, "score_tree", None)) and callable(
        getattr(model, "commit_path", None))


def tree_ancestors(parents_BxN: Array) -> Array:
    """bool [B, N, N]: ``anc[b, i, j]`` = node j is on the path root -> i
    (i itself included). Pointer jumping: N - 1 hops of every node at once."""
    batch, n = parents_BxN.shape
    parents_BxN = parents_BxN.astype(jnp.int32)

    def body_fn(_, carry):
        anc_BxNxN, cur_BxN = carry  # cur: the ancestor reached so far (-1 past the root)
        cur_BxN = jnp.where(cur_BxN >= 0, jnp.take_along_axis(
            parents_BxN, jnp.maximum(cur_BxN, 0), axis=1), -1)
        return anc_BxNxN | jax.nn.one_hot(cur_BxN, n, dtype=jnp.bool_), cur_BxN

    start = (jnp.broadcast_to(jnp.eye(n, dtype=jnp.bool_), (batch, n, n)),
             jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n)))
    anc_BxNxN, _ = jax.lax.fori_loop(0, max(n - 1, 0), body_fn, start)
    return anc_BxNxN


def tree_depths(parents_BxN: Array) -> Array:
    """int32 [B, N]: number of ancestors of each node (0 for the root's children)."""
    return jnp.sum(tree_ancestors(parents_BxN), axis=-1, dtype=jnp.int32) - 1


def tree_positions_and_mask(lengths_B: Array, parents_BxN: Array, max_length: int,
                            start: int | Array = 0, k: int | None = None) -> tuple[Array, Array]:
    """(positions int32 [B, K], mask bool [B, K, S]) for nodes ``start ..
    start + K - 1`` of an N-node tree (all N by default) whose scratch slots
    are ``L .. L + N - 1``: position ``L + d_i``; key s is visible iff ``s <
    L`` (the committed cache) or ``s = L + j`` with j an ancestor of i or i
    itself."""
    n = parents_BxN.shape[1]
    k = n - start if k is None else k
    # [B, K, N]; ``start`` may be traced (a drafter's loop over equally wide depths).
    anc_BxNxN = jax.lax.dynamic_slice_in_dim(tree_ancestors(parents_BxN), start, k, axis=1)
    depth_BxK = jnp.sum(anc_BxNxN, axis=-1, dtype=jnp.int32) - 1
    positions_BxK = lengths_B[:, None] + depth_BxK
    rel_S = jnp.arange(max_length)[None, :] - lengths_B[:, None]  # [B, S]
    in_tree_BxS = (rel_S >= 0) & (rel_S < n)
    ancestor_BxKxS = jnp.take_along_axis(
        anc_BxNxN, jnp.broadcast_to(jnp.clip(rel_S, 0, n - 1)[:, None, :],
                                    (anc_BxNxN.shape[0], k, max_length)), axis=2)
    mask_BxKxS = (rel_S < 0)[:, None, :] | (in_tree_BxS[:, None, :] & ancestor_BxKxS)
    return positions_BxK, mask_BxKxS


def check_tree(tokens: Array, parents: Array, lengths: Array, max_length: int,
               vocab_size: int, start: int | Array = 0, where: str = "score_tree") -> None:
    """Static and (when concrete) value checks for one ``score_tree`` call."""
    if tokens.ndim != 2 or parents.ndim != 2 or parents.shape[0] != tokens.shape[0]:
        raise ValueError(f"{where}: tokens must be int [B, K] and parents int [B, N], got "
                         f"{tokens.shape} and {parents.shape}.")
    n = parents.shape[1]
    # A traced start (a drafter's depth loop) is the caller's to keep in range.
    if isinstance(start, int) and (not 0 <= start or start + tokens.shape[1] > n):
        raise ValueError(f"{where}: feeding nodes {start} .. {start + tokens.shape[1] - 1} of "
                         f"a tree of {n} nodes.")
    check_extend(tokens, lengths, max_length, vocab_size, where)
    lens = _concrete(lengths)
    if lens is not None and (lens + n > max_length).any():
        raise ValueError(f"{where}: a row holds {int(lens.max())} tokens; a tree of {n} nodes "
                         f"needs {n} scratch slots after it (max_length {max_length}).")
    par = _concrete(parents)
    if par is not None and par.size:
        index = np.arange(n)[None, :]
        bad = (par < -1) | (par >= index)
        if bad.any():
            row, node = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{where}: node {node} of row {row} has parent {int(par[row, node])}; parents "
                "must be -1 (the root) or an earlier node (topological order).")


def commit_tree_path(buffer: Array, lengths_B: Array, nodes_BxA: Array,
                     count_B: Array, seq_axis: int = 1) -> Array:
    """``buffer[b, L + j] = buffer[b, L + nodes[b, j]]`` for ``j < count[b]``
    (L = lengths[b]; positions on ``seq_axis`` as in ``write_at_lengths``):
    the accepted path's scratch entries moved into place. Slots from
    ``L + count`` on are left as they are (stale)."""
    batch, a = nodes_BxA.shape
    j_A = jnp.arange(a)
    keep_BxA = j_A[None, :] < count_B[:, None]
    source_BxA = lengths_B[:, None] + jnp.where(keep_BxA, nodes_BxA, j_A[None, :])
    width = buffer.shape[seq_axis]
    rows_BxA = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, a))
    moved = buffer[_at_positions(rows_BxA, jnp.clip(source_BxA, 0, width - 1), seq_axis)]
    target_BxA = jnp.where(keep_BxA, lengths_B[:, None] + j_A[None, :], width)
    return buffer.at[_at_positions(rows_BxA, target_BxA, seq_axis)].set(moved, mode="drop")


def tree_with_root(root_B: Array, tokens_BxN: Array, parents_BxN: Array) -> tuple[Array, Array]:
    """A drafted tree (parents -1 = the root token) as the N + 1 nodes a target
    scores: node 0 is the root token itself (parent -1), node i + 1 is drafted
    node i. Its logits then give ``p`` at [root, node 0 .. N - 1], the order
    of a tree proposal's ``q``. After accepting drafted nodes ``n_1 .. n_a``
    the target keeps ``commit_path(cache, [0, 1 + n_1, .., 1 + n_a], 1 + a)``
    (the root token and the path), as a chain keeps ``1 + j`` entries."""
    tokens = jnp.concatenate([root_B[:, None].astype(tokens_BxN.dtype), tokens_BxN], axis=1)
    parents = jnp.concatenate([jnp.full_like(parents_BxN[:, :1], -1), parents_BxN + 1], axis=1)
    return tokens, parents


def start_token_and_prefill(model: LanguageModel, params, prompt: Prompt, max_length: int, *,
                            all_hidden: bool = False):
    """Prefills a model and returns (cache, first pending token).

    Decoder-only models feed every prompt token but the last, which becomes the
    pending token. Encoder-decoder models encode the whole prompt and start the
    decoder from its start token.

    With ``all_hidden`` (decoder-only models; what a feature drafter reads) it
    returns ``(cache, pending_B, hidden [B, max_length, D])``: the final hidden
    state at every fed prompt position, zero past a row's fed prompt (scratch
    the decoding loop overwrites as tokens are scored). E.g. prompt ``[a, b, c]``
    feeds ``a, b``: ``hidden[:, 0]`` and ``hidden[:, 1]`` are their states and
    ``c`` is the pending token.
    """
    batch, width = prompt.tokens.shape
    cache = model.init_cache(batch, max_length)
    start_id = getattr(model, "decoder_start_token_id", None)
    if start_id is not None:
        if all_hidden:
            raise ValueError("all_hidden reads a decoder-only model's hidden states (a feature "
                             "drafter's input); this model is an encoder-decoder.")
        cache = model.prefill(params, prompt, cache).cache
        return cache, jnp.full((batch,), start_id, jnp.int32)
    last_B = jnp.take_along_axis(prompt.tokens, (prompt.lengths - 1)[:, None], axis=1)[:, 0]
    fed = prompt.replace(lengths=prompt.lengths - 1)
    if not all_hidden:
        return model.prefill(params, fed, cache).cache, last_B.astype(jnp.int32)
    try:
        out = model.prefill(params, fed, cache, all_hidden=True)
    except TypeError as err:
        raise ValueError(f"{type(model).__name__}.prefill cannot return every position's hidden "
                         "state (all_hidden=True); a feature drafter needs it.") from err
    hidden_BxSxD = jnp.pad(out.hidden, ((0, 0), (0, max_length - width), (0, 0)))
    return out.cache, last_B.astype(jnp.int32), hidden_BxSxD
