"""Max-Gram (MaG): the statistical drafter of Cascade Speculative Drafting
(Chen et al., §3.3 and App. A; docs/algorithms.md, 'Drafter cascades and Max-Gram').

Text repeats itself: identifiers, phrases of the prompt, code patterns. MaG
finds the longest suffix of the text so far that also occurs *earlier* in the
text, and proposes the token that followed that earlier occurrence; with no
match it falls back to a bigram table (the most likely next token of each
token id, estimated from a corpus: ``data/bigram.py``). It runs no neural
network, so its cost is negligible next to any model call.

Definitions, for a text ``x_0 .. x_{n-1}`` (the prompt, then every emitted
token; for encoder-decoder models the encoder prompt followed by the decoder
output):

    run(m) = max { l <= max_ngram : x_{m-i} = x_{n-1-i} for i < l }   m = 0 .. n-2
    next   = x_{m*+1},  m* = the largest m with run(m) = max run > 0
    next   = bigram[x_{n-1}]   when no m has run(m) > 0

Which occurrence wins when several match equally long: the **most recent**
(largest ``m``). The nearest repetition is the likeliest to continue the same
way (the loop body just written, the identifier just defined), and it also
makes a copy self-consistent: after proposing ``x_{m*+1}``, the occurrence
ending at ``m* + 1`` is again the longest and most recent, so MaG keeps
copying the same passage. (The paper's listing takes the *first* occurrence.)
Runs longer than ``max_ngram`` tie at ``max_ngram``; ties then go to the most
recent occurrence as above.

Proposals are made one token at a time, each appended to the text before the
next match (so a copy may run past the current end into its own output, like
an LZ77 copy). Each proposal is deterministic given the text: its law ``q`` is
the one-hot of the token, which keeps every verifier exact.

Worked example (max_ngram large): text [5 1 2 3 9 1 2], suffix [1 2] occurs
ending at m = 2 (run 2; m = 5 is the suffix itself and is excluded) -> next
= x_3 = 3; then text [5 1 2 3 9 1 2 3] matches [1 2 3] at m = 3 -> 9.

Buffers are fixed-size (jittable, batched, each row its own text). The text
is rebuilt from the round's history every call, so MaG holds no state to roll
back and cannot fall out of step; the caller sizes the history so it never
overflows (``decode.round.required_cache_length``).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.drafting.base import Context, Proposal, pad_to
from specdec_jax.models.interface import Prompt

Array = jax.Array

DEFAULT_MAX_NGRAM = 32


@flax.struct.dataclass
class MaxGramState:
    prompt: Array  # int32 [B, P]: encoder prompt (encoder-decoder only; else [B, 0])
    prompt_lengths: Array  # int32 [B]


def match_runs(text_BxT: Array, n_B: Array, max_ngram: int) -> Array:
    """int32 [B, T]: ``run(m)`` of the module docstring for every ``m`` (0 for
    ``m > n - 2``): how many tokens ending at ``m`` equal the text's last ones."""
    batch, width = text_BxT.shape
    rows_B11 = jnp.arange(batch)[:, None, None]
    m_T = jnp.arange(width)
    back_N = jnp.arange(max_ngram)
    left_TxN = m_T[:, None] - back_N[None, :]  # earlier occurrence, read backwards
    right_BxN = n_B[:, None] - 1 - back_N[None, :]  # the suffix, read backwards
    left = text_BxT[rows_B11, jnp.clip(left_TxN, 0, width - 1)[None]]
    right = text_BxT[rows_B11[:, :, 0], jnp.clip(right_BxN, 0, width - 1)][:, None, :]
    equal_BxTxN = (left == right) & (left_TxN >= 0)[None] & (right_BxN >= 0)[:, None, :]
    run_BxT = jnp.sum(jnp.cumprod(equal_BxTxN.astype(jnp.int32), axis=-1), axis=-1)
    return jnp.where(m_T[None, :] <= (n_B - 2)[:, None], run_BxT, 0)


def longest_match_next(text_BxT: Array, n_B: Array, bigram_V: Array,
                       max_ngram: int) -> Array:
    """int32 [B]: MaG's next token for the text ``text[b, :n[b]]`` (module docstring)."""
    width = text_BxT.shape[1]
    m_T = jnp.arange(width)
    run_BxT = match_runs(text_BxT, n_B, max_ngram)
    best_B = jnp.max(run_BxT, axis=-1)
    last_m_B = jnp.max(jnp.where((run_BxT == best_B[:, None]) & (best_B[:, None] > 0),
                                 m_T[None, :], -1), axis=-1)
    copied_B = jnp.take_along_axis(text_BxT, jnp.clip(last_m_B + 1, 0, width - 1)[:, None],
                                   axis=1)[:, 0]
    last_token_B = jnp.take_along_axis(text_BxT, jnp.maximum(n_B - 1, 0)[:, None], axis=1)[:, 0]
    return jnp.where(best_B > 0, copied_B, bigram_V[last_token_B]).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class MaxGramDrafter:
    """Max-Gram proposals (one-hot laws). Params: the bigram table, int32 [V]."""

    vocab_size: int
    max_ngram: int = DEFAULT_MAX_NGRAM
    name: str = "mag"
    model_names: tuple[str, ...] = ()

    def __post_init__(self):
        if self.max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {self.max_ngram}.")

    def select_params(self, named: dict):
        return named[self.name]

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> MaxGramState:
        check_bigram(params, self.vocab_size)
        batch = prompt.tokens.shape[0]
        if encoder_decoder:
            return MaxGramState(prompt=prompt.tokens, prompt_lengths=prompt.lengths)
        return MaxGramState(prompt=jnp.zeros((batch, 0), jnp.int32),
                            prompt_lengths=jnp.zeros((batch,), jnp.int32))

    def text(self, state: MaxGramState, context: Context, room: int) -> tuple[Array, Array]:
        """(text [B, T], n [B]) with ``room`` free slots after each row's text.

        Decoder-only: the history itself. Encoder-decoder: the encoder prompt,
        then the decoder history without its start token.
        """
        history = jnp.pad(context.history, ((0, 0), (0, room)))
        if state.prompt.shape[1] == 0:
            return history, context.length
        width = state.prompt.shape[1] + history.shape[1]
        pos_T = jnp.arange(width)[None, :]
        plen_B1 = state.prompt_lengths[:, None]
        from_prompt = jnp.take_along_axis(
            jnp.pad(state.prompt, ((0, 0), (0, width - state.prompt.shape[1]))),
            jnp.clip(pos_T, 0, width - 1).repeat(history.shape[0], 0), axis=1)
        from_history = jnp.take_along_axis(
            jnp.pad(history, ((0, 0), (0, width - history.shape[1]))),
            jnp.clip(pos_T - plen_B1 + 1, 0, width - 1), axis=1)
        text = jnp.where(pos_T < plen_B1, from_prompt, from_history)
        return text, state.prompt_lengths + context.length - 1

    def propose(self, params, state: MaxGramState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, MaxGramState]:
        del key, sp, config  # deterministic
        steps = num + int(with_next)
        text, n_B = self.text(state, context, steps)
        batch = n_B.shape[0]
        rows_B = jnp.arange(batch)

        def body_fn(carry, _):
            text, n_B = carry
            next_B = longest_match_next(text, n_B, params, self.max_ngram)
            return (text.at[rows_B, n_B].set(next_B, mode="drop"), n_B + 1), next_B

        _, tokens_TxB = jax.lax.scan(body_fn, (text, n_B), None, length=steps)
        tokens_BxT = jnp.moveaxis(tokens_TxB, 0, 1)
        one_hot = pad_to(jax.nn.one_hot(tokens_BxT, self.vocab_size, dtype=jnp.float32),
                         num + 1)
        zeros = jnp.zeros((batch, 0), jnp.int32)
        proposal = Proposal(tokens=tokens_BxT[:, :num], q=one_hot, q_stat=one_hot,
                            hidden=None, calls=zeros, fed=zeros, single=zeros,
                            nan=jnp.zeros((batch,), jnp.int32))
        return proposal, state

    def rewind(self, state: MaxGramState, valid_B: Array) -> MaxGramState:
        del valid_B  # stateless: the text is rebuilt from the history
        return state


def check_bigram(table, vocab_size: int) -> None:
    """A bigram table is int [V] of token ids (checked when concrete)."""
    shape = getattr(table, "shape", None)
    if shape != (vocab_size,):
        raise ValueError(f"Max-Gram's bigram table has shape {shape}, expected ({vocab_size},) "
                         "for this vocabulary; build one for the model's tokenizer "
                         "(python -m specdec_jax.data.bigram --help).")
    if not jnp.issubdtype(table.dtype, jnp.integer):
        raise ValueError(f"Max-Gram's bigram table must hold integer token ids, got "
                         f"{table.dtype}.")
