"""Training a feature head (EAGLE, Li et al. 2024) on cached target features,
and its held-out acceptance per draft position.

Loss (teacher forced: one ``head.step`` over a whole sequence, input at
position ``s`` = ``(t_s, f_{s-1} + u_s)``, ``f_{-1} = 0``, prediction ``f^_s``)::

    L = w_reg * mean_s SmoothL1(f^_s, f_s)  +  w_ce * mean_s CE(t_{s+1}, head(f^_s))

both averaged over the same real positions (EAGLE's normalisation), the CE
term zero where ``s + 1`` is padding or ``t_{s+1}`` lies outside a restricted
head (those are counted: ``outside``). SmoothL1 is Huber with beta 1 per
coordinate, averaged over the feature's D coordinates. EAGLE's weights are
``w_reg = 1.0`` and ``w_ce = 0.1``: the regression carries most of the signal
(a feature is D numbers, the token one), and the CE keeps the prediction
where the head turns it into the right token. ``u_s ~ U(-a, a)`` per
coordinate (``noise = a``, training only, at positions with a real feature):
EAGLE's noise, in the features' own units; here, as in EAGLE, the features are
the target's final-norm outputs, so EAGLE's ``a = 0.1`` means the same thing.
The noise makes the head robust to its own errors, since at drafting time it
feeds its predictions back.

Only the head's ``net`` is trained; the target's embedding and output head are
frozen ``loss_extras`` of the training core (arguments, not constants).

Acceptance (``draft_acceptance``): from a start ``s`` the head drafts
``d_1 .. d_G`` greedily, ``d_1`` from the real-feature pass (as
``FeatureDrafter.propose``: the head has fed positions ``<= s`` with the
target's features), ``d_{j+1}`` after feeding ``(x_{s+j}, f^_{s+j-1})``, its
own previous prediction. ``alpha_k`` = fraction of starts where ``d_j =
g_{s+j-1}`` (the target's greedy token) for all ``j <= k``; the expected
tokens per target call at depth ``G`` (greedy, all drafts verified at once) is
``1 + sum_k alpha_k``. On the target's greedy responses ``x_{s+j} = t_{s+j} =
g_{s+j-1}``, so the chain is exactly the drafter's and the acceptance exact; on
other text ``x`` is the text's token (the teacher-forced path), a proxy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import time
from collections.abc import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from specdec_jax.checkpoints.feature_head_io import save_feature_head
from specdec_jax.models import feature_head
from specdec_jax.models.feature_head import FeatureHead, FeatureHeadConfig
from specdec_jax.runtime import sharding
from specdec_jax.training import feature_data as data_lib
from specdec_jax.training import train_loop
from specdec_jax.training.datasets import epoch_indices, padded_chunks
from specdec_jax.training.optimizers import OptimizerConfig

REPLICATED = ((r".*", PartitionSpec()),)  # a one-layer head: every device holds it
CODE_DIR, RESPONSES_DIR = "code", "responses"
CHAINS = ("predicted", "real")


@flax.struct.dataclass
class SequenceBatch:
    tokens: jax.Array  # int32 [B, W]
    features: jax.Array  # [B, W, D]: the target's f_s (float16 on the host)
    first_prev: jax.Array  # [B, D]: f_{-1} of the row (0 at a sequence's start)
    weights: jax.Array  # float32 [B, W]: 1 at real positions (0 past the length, padding rows)


@dataclasses.dataclass(frozen=True, eq=False)
class SequenceDataset:
    """Rows of tokens and the target's features with the training core's data
    protocol (``batch(index, batch_size, seed)``, a pure function of its arguments)."""

    tokens: np.ndarray  # int32 [N, W]
    features: np.ndarray  # float16 [N, W, D]
    lengths: np.ndarray  # int32 [N]
    first_prev: np.ndarray  # float16 [N, D]

    def __post_init__(self):
        n = len(self.tokens)
        if n == 0 or not len(self.features) == len(self.lengths) == len(self.first_prev) == n:
            raise ValueError(f"SequenceDataset: {n} token rows, {len(self.features)} feature "
                             f"rows, {len(self.lengths)} lengths: need the same, non-zero count.")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def positions(self) -> int:
        return int(self.lengths.sum())

    def _batch(self, rows: np.ndarray, real: int) -> SequenceBatch:
        width = self.tokens.shape[1]
        weights = (np.arange(width)[None, :] < self.lengths[rows][:, None]).astype(np.float32)
        weights[real:] = 0.0
        return SequenceBatch(tokens=self.tokens[rows], features=self.features[rows],
                             first_prev=self.first_prev[rows], weights=weights)

    def batch(self, index: int, batch_size: int, seed: int) -> SequenceBatch:
        return self._batch(epoch_indices(len(self), index, batch_size, seed), batch_size)

    def batches(self, batch_size: int) -> list[SequenceBatch]:
        return [self._batch(rows, real) for rows, real in padded_chunks(len(self), batch_size)]


def windows(arrays: dict, width: int) -> SequenceDataset:
    """Rows of ``arrays`` (``data.load_shards``) cut into ``width``-position
    windows; a window that starts at ``s > 0`` keeps ``f_{s-1}`` as its first
    input feature (teacher forcing stays exact; only the head's attention
    sees the window alone)."""
    tokens, features, lengths = arrays["tokens"], arrays["features"], arrays["lengths"]
    depth = features.shape[-1]
    out_t, out_f, out_l, out_p = [], [], [], []
    for i, length in enumerate(lengths):
        for start in range(0, int(length), width):
            n = min(width, int(length) - start)
            t = np.zeros(width, np.int32)
            f = np.zeros((width, depth), features.dtype)
            t[:n], f[:n] = tokens[i, start:start + n], features[i, start:start + n]
            out_t.append(t)
            out_f.append(f)
            out_l.append(n)
            out_p.append(features[i, start - 1] if start else np.zeros(depth, features.dtype))
    return SequenceDataset(np.stack(out_t), np.stack(out_f), np.asarray(out_l, np.int32),
                           np.stack(out_p))


def concat(*datasets: SequenceDataset) -> SequenceDataset:
    return SequenceDataset(*(np.concatenate([getattr(d, f.name) for d in datasets])
                             for f in dataclasses.fields(SequenceDataset)))


def vocab_index(token_ids, vocab_size: int) -> np.ndarray:
    """int32 [V]: a token's row in a restricted head (``token_ids`` sorted, as
    ``feature_head.shared_params`` stores them), -1 outside; the identity for the
    full head (``token_ids`` None)."""
    if token_ids is None:
        return np.arange(vocab_size, dtype=np.int32)
    index = np.full(vocab_size, -1, np.int32)
    ids = np.sort(np.asarray(token_ids))
    index[ids] = np.arange(len(ids), dtype=np.int32)
    return index


def frozen_inputs(target, target_params, token_ids=None) -> dict:
    """The loss's frozen inputs: the target's embedding and (restricted) head,
    and the token -> head row map."""
    return {**feature_head.shared_params(target, target_params, token_ids),
            "vocab_index": jnp.asarray(vocab_index(token_ids, target.vocab_size))}


def previous_features(features_BxWxD, first_prev_BxD):
    """``[B, W, D]``: at position ``s``, ``f_{s-1}`` (``first_prev`` at 0)."""
    return jnp.concatenate([first_prev_BxD[:, None], features_BxWxD[:, :-1]], axis=1)


def smooth_l1(x):
    """Huber with beta 1 (torch's SmoothL1Loss default, EAGLE's regression)."""
    a = jnp.abs(x)
    return jnp.where(a < 1.0, 0.5 * x * x, a - 0.5)


def make_loss(*, w_reg: float = 1.0, w_ce: float = 0.1, noise: float = 0.1):
    """A training-core ``LossFn`` (module docstring); ``model`` is the
    FeatureHead, ``params`` its ``net``, ``extras`` from ``frozen_inputs``."""
    if w_reg < 0 or w_ce < 0 or w_reg + w_ce <= 0 or noise < 0:
        raise ValueError(f"w_reg ({w_reg}) and w_ce ({w_ce}) must be >= 0 and not both 0; "
                         f"noise ({noise}) >= 0.")

    def loss_fn(model: FeatureHead, params, batch: SequenceBatch, rng, extras):
        full = {"net": params, "embedding": extras["embedding"], "head": extras["head"]}
        features = batch.features.astype(jnp.float32)
        prev = previous_features(features, batch.first_prev.astype(jnp.float32))
        batch_size, width = batch.tokens.shape
        # A real previous feature: position s > 0 of the row, or a window's carried f_{s-1}.
        has_prev = (jnp.arange(width)[None, :] > 0) | jnp.any(batch.first_prev != 0, -1)[:, None]
        if rng is not None and noise > 0:
            u = jax.random.uniform(rng, prev.shape, jnp.float32, -noise, noise)
            prev = prev + u * (has_prev & (batch.weights > 0))[..., None]
        predicted, _ = model.step(full, batch.tokens, prev,
                                  model.init_cache(batch_size, width))
        predicted = predicted.astype(jnp.float32)
        mask = batch.weights
        reg = jnp.mean(smooth_l1(predicted - features), axis=-1)
        # Position s predicts t_{s+1}: it needs s + 1 real and t_{s+1} in the head.
        next_tokens = jnp.concatenate([batch.tokens[:, 1:], batch.tokens[:, :1]], axis=1)
        has_next = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
        rows = extras["vocab_index"][next_tokens]
        ce_mask = has_next * (rows >= 0)
        # Scores over the head's rows only: the law head.logits gives (-inf
        # elsewhere), without a [B, W, V] array for a restricted head.
        scores = jnp.einsum("bwd,nd->bwn", predicted,
                            extras["head"]["rows"].astype(jnp.float32))
        picked = jnp.take_along_axis(scores, jnp.maximum(rows, 0)[..., None], -1)[..., 0]
        ce = jax.nn.logsumexp(scores, axis=-1) - picked
        per_position = w_reg * reg * mask + w_ce * ce * ce_mask
        count = mask.sum()
        loss_sum = per_position.sum()
        correct = (jnp.argmax(scores, -1) == rows) * ce_mask
        return loss_sum / jnp.maximum(count, 1.0), {
            "loss_sum": loss_sum, "weight_sum": count, "reg_sum": (reg * mask).sum(),
            "ce_sum": (ce * ce_mask).sum(), "ce_positions_sum": ce_mask.sum(),
            "outside_sum": (has_next * (rows < 0)).sum(), "correct": correct.sum()}

    return loss_fn


def greedy_tokens(head: FeatureHead, params: dict, features_xD):
    """int32 [...]: ``argmax head.logits(params, f)`` without the [..., V]
    array of a restricted head (its ids are sorted: ties break the same way)."""
    rows = params["head"]["rows"].astype(jnp.float32)
    best = jnp.argmax(jnp.matmul(features_xD.astype(jnp.float32), rows.T), axis=-1)
    if "token_ids" in params["head"]:
        return params["head"]["token_ids"][best].astype(jnp.int32)
    return best.astype(jnp.int32)


@functools.lru_cache(maxsize=8)  # one compilation per head shape, depth and chain
def _acceptance_fns(head: FeatureHead, depth: int, chain: str):
    """(real pass over rows, chain over a chunk of starts), jitted."""

    def real_pass(params, tokens_NxW, features_NxWxD):
        n, width = tokens_NxW.shape
        prev = previous_features(features_NxWxD, jnp.zeros_like(features_NxWxD[:, 0]))
        predicted, cache = head.step(params, tokens_NxW, prev, head.init_cache(n, width))
        return predicted.astype(jnp.float32), cache

    def run_chain(params, predicted_NxWxD, cache, tokens_NxW, features_NxWxD, next_NxW,
                  row_S, start_S):
        width = tokens_NxW.shape[1]
        # Each start gets its row's real-pass cache, cut after s; chain step j
        # writes position s + j (real entries past it stay masked).
        chain_cache = cache.replace(keys=(cache.keys[0][row_S],),
                                    values=(cache.values[0][row_S],),
                                    lengths=start_S + 1)
        at = lambda a, offset: a[row_S, jnp.clip(start_S + offset, 0, width - 1)]  # noqa: E731
        current = at(predicted_NxWxD, 0)
        hits = [greedy_tokens(head, params, current) == at(next_NxW, 0)]
        for j in range(1, depth):
            fed = current if chain == "predicted" else at(features_NxWxD, j - 1).astype(
                jnp.float32)
            out, chain_cache = head.step(params, at(tokens_NxW, j)[:, None], fed[:, None],
                                         chain_cache)
            current = out[:, 0].astype(jnp.float32)
            hits.append(greedy_tokens(head, params, current) == at(next_NxW, j))
        return jnp.stack(hits, axis=1)

    return jax.jit(real_pass), jax.jit(run_chain)


def draft_acceptance(head: FeatureHead, params: dict, tokens, features, next_tokens,
                     start_mask, depth: int = 5, *, chain: str = "predicted",
                     rows_per_pass: int = 8, starts_per_chunk: int = 256) -> dict:
    """Greedy acceptance per draft position (module docstring).

    ``tokens`` int32 [N, W], ``features`` [N, W, D] (the target's ``f_s``),
    ``next_tokens`` int32 [N, W] (``g_s``: the token the target emits after
    position ``s``), ``start_mask`` bool [N, W] (the starts to score; a start
    needs ``s + depth - 1`` inside the row). ``chain="real"`` feeds the
    target's real features to every draft (a wrong drafter, for tests).
    Returns ``{"alpha": [alpha_1 .. alpha_G], "expected_tokens": 1 + sum,
    "starts": n}``."""
    if chain not in CHAINS:
        raise ValueError(f"unknown chain {chain!r}; choose one of {', '.join(CHAINS)}.")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}.")
    tokens, next_tokens = np.asarray(tokens, np.int32), np.asarray(next_tokens, np.int32)
    start_mask = np.asarray(start_mask, bool).copy()
    width = tokens.shape[1]
    start_mask[:, max(width - depth + 1, 0):] = False  # the chain must stay inside the row
    real_pass, run_chain = _acceptance_fns(head, depth, chain)
    totals = np.zeros(depth, np.int64)
    count = 0
    for first in range(0, len(tokens), rows_per_pass):
        rows = np.arange(first, min(first + rows_per_pass, len(tokens)))
        pick = np.r_[rows, np.full(rows_per_pass - len(rows), rows[0])]  # a fixed shape
        row_s, start_s = np.nonzero(start_mask[rows])
        if not len(row_s):
            continue
        t = jnp.asarray(tokens[pick])
        f = jnp.asarray(np.asarray(features[pick]), jnp.float32)
        g = jnp.asarray(next_tokens[pick])
        predicted, cache = real_pass(params, t, f)
        for c in range(0, len(row_s), starts_per_chunk):
            r, s = row_s[c:c + starts_per_chunk], start_s[c:c + starts_per_chunk]
            real = len(r)
            r = np.r_[r, np.zeros(starts_per_chunk - real, r.dtype)]
            s = np.r_[s, np.zeros(starts_per_chunk - real, s.dtype)]
            hits = np.asarray(run_chain(params, predicted, cache, t, f, g,
                                        jnp.asarray(r, jnp.int32),
                                        jnp.asarray(s, jnp.int32)))[:real]
            totals += np.cumprod(hits, axis=1).sum(0)
            count += real
    alpha = (totals / max(count, 1)).tolist()
    return {"alpha": alpha, "expected_tokens": 1.0 + float(sum(alpha)), "starts": count,
            "depth": depth}


def response_starts(arrays: dict, depth: int) -> np.ndarray:
    """bool [N, W]: starts ``s`` from the last prompt token (whose draft is
    the first response token) to ``length - depth``."""
    width = arrays["tokens"].shape[1]
    s = np.arange(width)[None, :]
    first = np.maximum(arrays["starts"] - 1, 0)[:, None]
    return (s >= first) & (s <= arrays["lengths"][:, None] - depth)


def text_starts(arrays: dict, depth: int) -> np.ndarray:
    s = np.arange(arrays["tokens"].shape[1])[None, :]
    return s <= arrays["lengths"][:, None] - depth


def held_out_acceptance(head, params, held: dict, depth: int) -> dict:
    """Acceptance on the held-out responses (exact) and code (teacher-forced path)."""
    out = {}
    for name, starts in (("responses", response_starts), ("code", text_starts)):
        arrays = held[name]
        out[name] = draft_acceptance(head, params, arrays["tokens"], arrays["features"],
                                     arrays["greedy"], starts(arrays, depth), depth)
    return out


def markdown_table(rows: Sequence[tuple[str, dict]]) -> str:
    """A Markdown table of acceptance results (label, draft_acceptance dict)."""
    depth = max(r["depth"] for _, r in rows)
    head = "| eval | starts | " + " | ".join(f"alpha_{k}" for k in range(1, depth + 1)) + \
        f" | tokens/call (G={depth}) |"
    rule = "|" + "---|" * (depth + 3)
    lines = [head, rule]
    for label, r in rows:
        alphas = " | ".join(f"{a:.3f}" for a in r["alpha"])
        lines.append(f"| {label} | {r['starts']} | {alphas} | {r['expected_tokens']:.3f} |")
    return "\n".join(lines) + "\n"


def split_data(data_dir, record: dict, *, train_positions: int, held_out_code_shards: int,
               held_out_responses: float, width: int
               ) -> tuple[SequenceDataset, dict, dict]:
    """(training windows, held-out arrays {"code", "responses"}, sizes). The
    last ``held_out_code_shards`` code shards and the last
    ``held_out_responses`` fraction of the responses (their prompts unseen)
    are held out; the code training rows are the first ones reaching
    ``train_positions`` (0: all), the training responses are all used."""
    data_dir = pathlib.Path(data_dir)
    code_manifest = json.loads((data_dir / CODE_DIR / data_lib.MANIFEST).read_text()) \
        if (data_dir / CODE_DIR / data_lib.MANIFEST).exists() else {"shards": {}}
    shards = len(code_manifest["shards"])
    if not 1 <= held_out_code_shards < shards:
        raise ValueError(f"{data_dir / CODE_DIR} has {shards} shards; held_out_code_shards "
                         f"must be in 1..{shards - 1} (build more code data).")
    code_train, _ = data_lib.load_shards(data_dir / CODE_DIR, record,
                                         slice(0, shards - held_out_code_shards))
    code_held, _ = data_lib.load_shards(data_dir / CODE_DIR, record,
                                        slice(shards - held_out_code_shards, None))
    responses, _ = data_lib.load_shards(data_dir / RESPONSES_DIR, record)
    n = len(responses["lengths"])
    held_n = int(round(n * held_out_responses))
    if not 1 <= held_n < n:
        raise ValueError(f"held_out_responses={held_out_responses} of {n} responses leaves "
                         "no training or no held-out response; choose a fraction in (0, 1).")
    cut = lambda arrays, sl: {k: v[sl] for k, v in arrays.items()}  # noqa: E731
    if train_positions:
        total = np.cumsum(code_train["lengths"])
        if total[-1] < train_positions:
            raise ValueError(f"train_positions={train_positions} but the code training shards "
                             f"hold {int(total[-1])} positions; build more or ask for fewer.")
        code_train = cut(code_train, slice(0, int(np.searchsorted(total, train_positions)) + 1))
    train_set = concat(windows(code_train, width),
                       windows(cut(responses, slice(0, n - held_n)), width))
    held = {"code": code_held, "responses": cut(responses, slice(n - held_n, None))}
    sizes = {"train_positions": train_set.positions,
             "train_code_positions": int(code_train["lengths"].sum()),
             "train_response_positions": int(responses["lengths"][:n - held_n].sum()),
             "train_rows": len(train_set), "held_out_code_positions":
                 int(code_held["lengths"].sum()), "held_out_responses": held_n,
             "held_out_response_tokens": int((held["responses"]["lengths"]
                                              - held["responses"]["starts"]).sum())}
    return train_set, held, sizes


def train_feature_head(*, workdir: str | os.PathLike, data_dir: str | os.PathLike,
                       target_name: str, target, target_params, token_ids=None,
                       train_positions: int = 0, intermediate_size: int | None = None,
                       w_reg: float = 1.0, w_ce: float = 0.1, noise: float = 0.1,
                       learning_rate: float = 3e-4, warmup_steps: int = 20,
                       epochs: float = 2.0, batch_size: int = 8, held_out_code_shards: int = 1,
                       held_out_responses: float = 0.5, depth: int = 5, eval_every: int = 0,
                       num_steps: int = 0, checkpoint_every: int = 50, seed: int = 0,
                       progress: bool = True,
                       callbacks: Sequence[Callable[[int, dict], None]] = ()) -> dict:
    """Trains a head on ``data_dir`` (``data.build_shards`` under ``code/`` and
    ``responses/``) with AdamW (warmup, cosine decay; EAGLE's b2 = 0.95 and
    clipping at 0.5) for ``epochs`` over the training rows (``num_steps`` > 0
    overrides), scoring the held-out acceptance every ``eval_every`` steps
    (0: 4 times) into ``workdir/acceptance.jsonl``. A killed run started again
    with the same arguments resumes exactly (the training core). Saves the
    head to ``workdir/head`` and writes ``workdir/acceptance.{json,md}``;
    returns the summary."""
    workdir = pathlib.Path(workdir)
    if (workdir / "head").exists():  # fail before training, not after it
        raise FileExistsError(f"{workdir}/head exists: this run is finished. Choose a new "
                              "workdir, or delete the old head to train it again.")
    began = time.perf_counter()
    record = data_lib.target_record(target_name, target, target_params)
    config = FeatureHeadConfig.for_target(target, intermediate_size)
    head = FeatureHead(config)
    width = json.loads((pathlib.Path(data_dir) / CODE_DIR / data_lib.MANIFEST).read_text()
                       )["settings"]["width"]
    train_set, held, sizes = split_data(
        data_dir, record, train_positions=train_positions,
        held_out_code_shards=held_out_code_shards, held_out_responses=held_out_responses,
        width=width)
    eval_set = windows(held["code"], width)
    num_steps = num_steps or max(1, int(round(epochs * len(train_set) / batch_size)))
    optimizer = OptimizerConfig(name="adamw", learning_rate=learning_rate, schedule="cosine",
                                warmup_steps=min(warmup_steps, num_steps - 1),
                                total_steps=num_steps, clip_norm=0.5, b2=0.95)
    mesh = sharding.make_mesh()
    extras = sharding.shard_params(frozen_inputs(target, target_params, token_ids), mesh,
                                   REPLICATED)
    params_for_eval = lambda net: {"net": net, **feature_head.shared_params(  # noqa: E731
        target, target_params, token_ids)}
    eval_every = eval_every or max(1, -(-num_steps // 4))
    ends = sorted({*range(eval_every, num_steps, eval_every), num_steps})
    log_path = workdir / "acceptance.jsonl"
    # On the host: every segment's train state is built from it afresh (a step
    # donates the state's buffers, so device arrays would not survive a segment).
    net = jax.device_get(head.init_net(jax.random.PRNGKey(seed)))
    settings = {"w_reg": w_reg, "w_ce": w_ce, "noise": noise, "depth": depth,
                "token_ids": None if token_ids is None else len(token_ids), "data": str(data_dir),
                "train_positions": train_positions, "target": record}
    train_seconds = 0.0
    for end in ends:
        # Each segment resumes the previous one's checkpoint (the same run, cut where
        # the acceptance is scored; the schedule spans all num_steps).
        result = train_loop.train(model=head, params=net, optimizer=optimizer, data=train_set,
                            num_steps=end, batch_size=batch_size, workdir=workdir, seed=seed,
                            loss_fn=make_loss(w_reg=w_reg, w_ce=w_ce, noise=noise),
                            eval_data=eval_set, eval_every=eval_every, rules=REPLICATED,
                            mesh=mesh, checkpoint_every=max(1, min(eval_every, checkpoint_every)),
                            progress=progress, fingerprint_extra=settings, loss_extras=extras,
                            callbacks=callbacks)
        train_seconds += result.seconds
        accepted = held_out_acceptance(head, params_for_eval(result.state.params), held, depth)
        with log_path.open("a") as f:
            f.write(json.dumps({"step": end, **accepted}) + "\n")
        print(f"step {end}/{num_steps}: held-out alpha (responses) "
              + " ".join(f"{a:.3f}" for a in accepted["responses"]["alpha"])
              + f", tokens/call {accepted['responses']['expected_tokens']:.3f}; "
              f"code (teacher-forced path) {accepted['code']['expected_tokens']:.3f}")
    history = result.history
    summary = {**sizes, "steps": num_steps, "batch_size": batch_size, "epochs": epochs,
               "learning_rate": learning_rate, "warmup_steps": optimizer.warmup_steps,
               "w_reg": w_reg, "w_ce": w_ce, "noise": noise, "noise_units": "absolute",
               "head_vocab": 0 if token_ids is None else len(token_ids),
               "intermediate_size": config.intermediate_size, "depth": depth,
               "acceptance": accepted, "final_metrics": history[-1] if history else {},
               "first_loss": history[0]["loss"] if history else None,
               "train_seconds": train_seconds, "seconds": time.perf_counter() - began,
               "data_dir": str(data_dir)}
    table = markdown_table([("held-out greedy responses (exact)", accepted["responses"]),
                            ("held-out code (teacher-forced path)", accepted["code"])])
    (workdir / "acceptance.json").write_text(json.dumps(summary, indent=1))
    (workdir / "acceptance.md").write_text(table)
    save_feature_head(workdir / "head", head, result.state.params, target_name=target_name,
                      fingerprint=record["target_fingerprint"], token_ids=token_ids,
                      extra={"training": summary})
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
