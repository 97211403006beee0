"""The functional model interface every decoder in specdec_jax implements.

A model is a frozen dataclass with pure methods; parameters are passed in and
nothing is stored, so the decoding loops can trace any model the same way:

    cache = model.init_cache(batch_size, max_length)
    out = model.prefill(params, prompt, cache)      # feed the prompts
    out = model.extend(params, tokens_BxK, out.cache)  # feed K more tokens per row
    out = model.extend(params, tokens_BxK, cache, logits_at=at_BxN)  # outputs at N of them

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
Cache = Any  # a flax.struct.dataclass with an int32 [B] ``lengths`` field


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


def write_at_lengths(buffer_BxSxHxD: Array, new_BxKxHxD: Array, lengths_B: Array) -> Array:
    """Writes K new entries per row at positions lengths[b] .. lengths[b]+K-1.

    Positions past the buffer's end are dropped (never clamped onto valid
    entries); callers validate bounds before tracing.
    """
    batch, k = new_BxKxHxD.shape[:2]
    positions_BxK = lengths_B[:, None] + jnp.arange(k)[None, :]
    rows_BxK = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, k))
    return buffer_BxSxHxD.at[rows_BxK, positions_BxK].set(
        new_BxKxHxD.astype(buffer_BxSxHxD.dtype), mode="drop")


def causal_cache_mask(lengths_B: Array, k: int, max_length: int) -> Array:
    """bool [B, K, S]: query i of row b (at position lengths[b] + i) sees key s
    iff s <= lengths[b] + i. Keys at or beyond the row's new length are stale."""
    query_pos_BxK = lengths_B[:, None] + jnp.arange(k)[None, :]
    key_pos_S = jnp.arange(max_length)
    return key_pos_S[None, None, :] <= query_pos_BxK[:, :, None]
