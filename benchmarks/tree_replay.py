"""Greedy tree decoding replayed from the target's greedy output: tokens per
target call of a free drafter (Max-Gram) without any target call.

At T = 0 a round of tree decoding accepts the deepest node whose path equals
the target's greedy continuation of the round's context (every tree verifier
is greedy there), then emits that path and the target's next greedy token;
so the emitted text is the target's greedy output whatever the drafter, and a
round's accepted depth depends only on the drafter's tree and that output.
A drafter that reads nothing but the text so far (Max-Gram: no cache, no
target features) can therefore be scored by replaying its rounds against a
greedy output computed once per prompt:

    y = the target's greedy continuation (EOS not stopping it, at least
        max_new_tokens + depth tokens)
    g = 0; while not done:
        tree = drafter(prompt + y[:g])
        a = max { depth(i) : the path root -> i equals y[g : g + depth(i)] }  (0 if none)
        emit y[g : g + a + 1], cut at EOS and at max_new_tokens; g += what was emitted

This is ``decode.tree``'s round with the target's argmax read from ``y``
(a chain is the tree of width 1), so the accepted histogram equals the real
loop's, round for round, as long as the real loop's greedy tokens are ``y``
(``tests/test_tree_replay.py`` checks it on toys; the trees benchmark checks
it on the real pair). The reference is the target's autoregressive greedy
output, with no EOS, so that the last round can be scored past it.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import api, sampling
from specdec_jax.decode.tree import tree_depth
from specdec_jax.drafting.base import Context
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import Prompt, make_prompt
from specdec_jax.runtime.progress import tqdm
from specdec_jax.verify import tree as verify_tree


def accepted_depth(tokens_BxN, parents_BxN, reference_BxR, start_B):
    """int32 [B]: the deepest node whose path equals ``reference[b, start[b]:]``
    (0: none). A node at depth d matches ``reference[start + d - 1]`` and all
    its ancestors match theirs."""
    tree = verify_tree.Tree(parents=parents_BxN, tokens=tokens_BxN,
                            valid=jnp.ones(tokens_BxN.shape, bool))
    anc_BxNxN = verify_tree.ancestor_mask(tree)
    depth_BxN = jnp.sum(anc_BxNxN, axis=-1).astype(jnp.int32)
    want_BxN = jnp.take_along_axis(
        reference_BxR, jnp.clip(start_B[:, None] + depth_BxN - 1, 0,
                                reference_BxR.shape[1] - 1), axis=1)
    match_BxN = tokens_BxN == want_BxN
    ok_BxN = jnp.all(match_BxN[:, None, :] | ~anc_BxNxN, axis=-1)
    return jnp.max(jnp.where(ok_BxN, depth_BxN, 0), axis=1).astype(jnp.int32)


def replay(drafter, params, prompt: Prompt, reference_BxR, *, max_new_tokens: int,
           eos_ids: Sequence[int] = ()):
    """(accepted histogram int32 [B, depth + 1], tokens generated int32 [B]) of
    greedy tree decoding of ``prompt`` by ``drafter`` (a tree drafter that
    reads only the text: Max-Gram), the target's greedy continuation being
    ``reference`` (>= max_new_tokens + depth tokens per row). Pure; jit it
    with the drafter and the counts static."""
    depth = tree_depth(drafter)
    batch, width = prompt.tokens.shape
    if reference_BxR.shape[1] < max_new_tokens + depth:
        raise ValueError(f"the greedy reference holds {reference_BxR.shape[1]} tokens per "
                         f"prompt; replaying {max_new_tokens} tokens with trees of depth "
                         f"{depth} needs {max_new_tokens + depth}.")
    room = width + max_new_tokens + depth + 1
    history = jnp.pad(prompt.tokens.astype(jnp.int32), ((0, 0), (0, room - width)))
    state = drafter.init(params, prompt, room, False)
    sp = api.sampling_params(temperature=0.0)
    key = jax.random.PRNGKey(0)  # unused by deterministic drafters
    offsets = jnp.arange(depth + 1)

    def cond_fn(carry):
        return ~jnp.all(carry[3])

    def body_fn(carry):
        history, length, generated, done, histogram = carry
        proposal, _ = drafter.propose_tree(params, state, Context(history=history, length=length),
                                           False, key, sp, sampling.SamplingConfig())
        accepted = accepted_depth(proposal.tokens, proposal.parents, reference_BxR, generated)
        emitted = jnp.take_along_axis(reference_BxR, jnp.minimum(
            generated[:, None] + offsets[None, :], reference_BxR.shape[1] - 1), axis=1)
        valid = offsets[None, :] <= accepted[:, None]
        is_eos = jnp.zeros(emitted.shape, bool)
        for eos in eos_ids:
            is_eos |= emitted == eos
        first_eos = jnp.min(jnp.where(is_eos & valid, offsets[None, :], depth + 1), axis=1)
        count = jnp.minimum(jnp.minimum(accepted + 1, first_eos + 1),
                            max_new_tokens - generated)
        active = ~done
        histogram = histogram + active[:, None] * jax.nn.one_hot(accepted, depth + 1,
                                                                  dtype=jnp.int32)
        history = write_rows(history, emitted, length)
        length = length + jnp.where(active, accepted + 1, 0)
        generated = generated + jnp.where(active, count, 0)
        done = done | (first_eos < count) | (generated >= max_new_tokens)
        return history, length, generated, done, histogram

    carry = (history, prompt.lengths.astype(jnp.int32), jnp.zeros((batch,), jnp.int32),
             jnp.zeros((batch,), bool), jnp.zeros((batch, depth + 1), jnp.int32))
    *_, generated, _, histogram = jax.lax.while_loop(cond_fn, body_fn, carry)
    return histogram, generated


def replay_rows(drafter, params, prompts: Sequence[Sequence[int]],
                references: Sequence[Sequence[int]], *, max_new_tokens: int,
                eos_ids: Sequence[int] = (), batch_size: int = 8,
                progress: bool = False) -> list[dict]:
    """Per-prompt rows in the trees benchmark's format (``trees.run_config``):
    the replayed accepted histogram, rounds = target calls, the tokens (the
    reference's first ``generated``). Prompts in batches of ``batch_size``."""
    depth = tree_depth(drafter)
    fn = jax.jit(lambda params, prompt, reference: replay(
        drafter, params, prompt, reference, max_new_tokens=max_new_tokens, eos_ids=eos_ids))
    need = max_new_tokens + depth
    width = max(len(p) for p in prompts)
    rows = []
    starts = range(0, len(prompts), batch_size)
    for start in tqdm(starts, desc="replay", disable=not progress):
        chunk = list(range(start, min(start + batch_size, len(prompts))))
        chunk += [chunk[-1]] * (batch_size - len(chunk))  # one compiled batch size
        prompt = make_prompt([prompts[i] for i in chunk], pad_to=width)
        reference = jnp.asarray(np.stack([np.asarray(references[i][:need], np.int32)
                                          for i in chunk]))
        histogram, generated = jax.device_get(fn(params, prompt, reference))
        for b, index in enumerate(chunk):
            if any(r["prompt"] == index for r in rows):
                continue
            hist = np.asarray(histogram[b], np.int64)
            rounds = int(hist.sum())
            rows.append({"prompt": index,
                         "tokens": [int(t) for t in references[index][:int(generated[b])]],
                         "rounds": rounds,
                         "accepted": int((hist * np.arange(len(hist))).sum()),
                         "histogram": hist.tolist(), "nan_logits": 0,
                         "target_calls": rounds,
                         "target_fed": rounds * (int(drafter.num_nodes) + 1),
                         "target_single_calls": 0, "drafter_calls_by_model": [],
                         "drafter_tokens_by_model": [], "drafter_single_calls_by_model": []})
    return rows


# --- the greedy reference ---------------------------------------------------------------------

def greedy_reference(target, target_params, prompts: Sequence[Sequence[int]], length: int, *,
                     batch_size: int = 8, progress: bool = True,
                     done: Sequence[Sequence[int]] = (), save=None) -> list[list[int]]:
    """The target's greedy continuation of each prompt, ``length`` tokens, EOS
    not stopping it: autoregressive decoding at T = 0, ``batch_size`` prompts
    per call (the target's outputs do not depend on the batch: checked
    against the real loop by the trees benchmark). ``done``: continuations
    already computed (kept); ``save(list)`` is called after each batch."""
    decoder = api.make_decoder(target=target, method="autoregressive", max_new_tokens=length,
                               eos_ids=())
    fn = jax.jit(decoder.generate)
    width = max(len(p) for p in prompts)
    sp = api.sampling_params(temperature=0.0)
    out = [list(map(int, c)) for c in done]
    starts = range(len(out), len(prompts), batch_size)
    for start in tqdm(starts, desc="greedy reference", disable=not progress):
        chunk = list(range(start, min(start + batch_size, len(prompts))))
        rows = [prompts[i] for i in chunk]
        rows += [rows[-1]] * (batch_size - len(rows))  # one compiled batch size
        result = jax.device_get(fn(target_params, None, make_prompt(rows, pad_to=width),
                                   jax.random.PRNGKey(0), sp))
        for b in range(len(chunk)):
            out.append(np.asarray(result.tokens[b, :int(result.lengths[b])]).tolist())
        if save is not None:
            save(out)
    return out


def load_reference(path) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def write_reference(path, protocol: dict, prompts, continuations) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"protocol": protocol, "prompts": [list(p) for p in prompts],
                               "continuations": continuations}) + "\n")
    tmp.replace(path)
