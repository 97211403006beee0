"""The feature head's training job (``training.feature_training``, ``jobs.head_training``):
cached features, the EAGLE loss, exact resume, and the held-out acceptance."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.checkpoints.feature_head_io import load_feature_head
from specdec_jax.jobs import resolver
from specdec_jax.models import feature_head
from specdec_jax.models.feature_head import FeatureHead, FeatureHeadConfig
from specdec_jax.runtime import data_shards
from specdec_jax.training import feature_data as data_lib
from specdec_jax.training import feature_training as train_lib

TARGET = "toy-bytes-small"


@pytest.fixture(scope="module")
def toy():
    return resolver.resolve(TARGET)


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory, toy):
    """A small build: 12 code chunks of 32 tokens (3 shards) and 4 'responses'."""
    model, params, _ = toy
    out = tmp_path_factory.mktemp("feature-data")
    record = data_lib.target_record(TARGET, model, params)
    rng = np.random.default_rng(0)
    code = [rng.integers(1, 200, 32).tolist() for _ in range(12)]
    data_lib.build_shards(out / "code", target=model, target_params=params, record=record,
                          sequences=code, source={"kind": "test"}, batch_size=2,
                          shard_sequences=4, width=32, progress=False)
    responses = [rng.integers(1, 200, int(n)).tolist() for n in (20, 24, 18, 30)]
    data_lib.build_shards(out / "responses", target=model, target_params=params,
                          record=record, sequences=responses, starts=[8, 10, 6, 12],
                          source={"kind": "test"}, batch_size=2, shard_sequences=2,
                          progress=False)
    return out, record


def test_code_chunks_cut_streams_in_order_up_to_the_budget():
    streams = [list(range(10)), list(range(100, 103)), list(range(200, 230))]
    chunks = data_lib.code_chunks(streams, length=8, max_positions=20)
    # 10 -> [0..7] + tail [8, 9] (kept: >= 8 // 4); 3 -> kept; 30 -> cut to the budget.
    assert chunks == [list(range(8)), [8, 9], [100, 101, 102], list(range(200, 207))]
    assert sum(map(len, chunks)) == 20
    limited = data_lib.code_chunks(streams, length=8, max_positions=100, max_chunks_per_stream=1)
    assert [c[0] for c in limited] == [0, 100, 200]
    with pytest.raises(ValueError, match="length"):
        data_lib.code_chunks(streams, length=1, max_positions=5)


def test_shards_hold_the_targets_features_and_greedy_tokens(toy_data, toy):
    model, params, _ = toy
    out, record = toy_data
    arrays, manifest = data_lib.load_shards(out / "responses", record)
    assert manifest["settings"]["width"] == 64 and len(manifest["shards"]) == 2
    assert arrays["features"].dtype == np.float16 and arrays["tokens"].shape == (4, 64)
    row = 3
    length = int(arrays["lengths"][row])
    tokens = jnp.asarray(arrays["tokens"][row:row + 1, :length])
    logits, hidden = [], []
    cache = model.init_cache(1, length)
    extend = jax.jit(model.extend)
    for s in range(length):  # one token at a time: the features are the model's own
        step = extend(params, tokens[:, s:s + 1], cache)
        cache = step.cache
        logits.append(step.logits[0, 0])
        hidden.append(step.hidden[0, 0])
    np.testing.assert_allclose(arrays["features"][row, :length].astype(np.float32),
                               np.stack(hidden), atol=2e-2, rtol=1e-2)
    np.testing.assert_array_equal(arrays["greedy"][row, :length],
                                  np.argmax(np.stack(logits), -1))
    assert not arrays["features"][row, length:].any()


def test_shards_resume_and_refuse_another_target(tmp_path, toy, monkeypatch):
    model, params, _ = toy
    record = data_lib.target_record(TARGET, model, params)
    sequences = [[1, 2, 3, 4]] * 6
    kwargs = dict(target=model, target_params=params, record=record, sequences=sequences,
                  source={"kind": "test"}, batch_size=2, shard_sequences=2, progress=False)
    data_lib.build_shards(tmp_path, **kwargs)
    # Simulate a kill after the first shard: the manifest lists it alone, unfinished.
    manifest = json.loads((tmp_path / data_lib.MANIFEST).read_text())
    del manifest["shards"]["shard-00001.npz"], manifest["shards"]["shard-00002.npz"]
    (tmp_path / data_lib.MANIFEST).write_text(json.dumps({**manifest, "finished": False}))
    with pytest.raises(ValueError, match="did not finish"):
        data_lib.load_shards(tmp_path, record)
    first = (tmp_path / "shard-00000.npz").stat().st_mtime_ns
    calls = []
    real_write = data_shards.write_shard

    def noted_write(out_dir, manifest, name, *rest):
        calls.append(name)
        return real_write(out_dir, manifest, name, *rest)

    monkeypatch.setattr(data_shards, "write_shard", noted_write)
    data_lib.build_shards(tmp_path, **kwargs)
    assert calls == ["shard-00001.npz", "shard-00002.npz"]  # the written shard is skipped
    assert (tmp_path / "shard-00000.npz").stat().st_mtime_ns == first
    assert not list(tmp_path.glob("*.tmp"))
    data_lib.load_shards(tmp_path, record)
    other = {**record, "target": "toy-bytes-large"}
    with pytest.raises(ValueError, match="built for another model .target: 'toy-bytes-small' "
                                         "here, 'toy-bytes-large' asked"):
        data_lib.load_shards(tmp_path, other)
    with pytest.raises(ValueError, match="built for another model"):
        data_lib.build_shards(tmp_path, **{**kwargs, "record": other})
    with pytest.raises(ValueError, match="other settings"):
        data_lib.build_shards(tmp_path, **{**kwargs, "batch_size": 1})


def _head(model, rng=0):
    head = FeatureHead(FeatureHeadConfig.for_target(model, intermediate_size=16))
    return head, head.init_net(jax.random.PRNGKey(rng))


def _batch(tokens, features, weights=None):
    tokens = np.asarray(tokens, np.int32)
    weights = np.ones(tokens.shape, np.float32) if weights is None else weights
    return train_lib.SequenceBatch(tokens=jnp.asarray(tokens), features=jnp.asarray(features),
                                   first_prev=jnp.zeros((len(tokens), features.shape[-1])),
                                   weights=jnp.asarray(weights))


def test_restricted_head_masks_and_counts_out_of_subset_targets(toy):
    model, params, _ = toy
    head, net = _head(model)
    rng = np.random.default_rng(1)
    subset = np.arange(0, 256, 2)  # even ids only
    tokens = np.array([[2, 4, 7, 6, 9, 8, 10, 12]])  # next tokens 7 and 9 lie outside
    features = rng.normal(size=(1, 8, model.config.hidden_size)).astype(np.float32)
    loss_fn = jax.jit(train_lib.make_loss(w_reg=0.0, w_ce=1.0, noise=0.0), static_argnums=0)
    extras = train_lib.frozen_inputs(model, params, subset)
    _, sums = loss_fn(head, net, _batch(tokens, features), None, extras)
    assert float(sums["outside_sum"]) == 2 and float(sums["ce_positions_sum"]) == 5
    # The CE equals -log of the head's renormalised law (head.logits) at in-subset targets.
    full = feature_head.drafter_params(model, params, net, subset)
    prev = train_lib.previous_features(jnp.asarray(features), jnp.zeros((1, features.shape[-1])))
    predicted, _ = head.step(full, jnp.asarray(tokens), prev, head.init_cache(1, 8))
    log_q = jax.nn.log_softmax(head.logits(full, predicted), -1)[0]
    expected = -sum(float(log_q[s, tokens[0, s + 1]]) for s in range(7)
                    if tokens[0, s + 1] % 2 == 0)
    assert float(sums["ce_sum"]) == pytest.approx(expected, rel=1e-5)
    # Padding is masked out of both terms.
    weights = np.ones((1, 8), np.float32)
    weights[0, 6:] = 0
    padded = loss_fn(head, net, _batch(tokens, features, weights), None, extras)[1]
    assert float(padded["weight_sum"]) == 6 and float(padded["ce_positions_sum"]) == 3


def test_noise_is_training_only_and_seeded(toy):
    model, params, _ = toy
    head, net = _head(model)
    make_loss = lambda noise: jax.jit(train_lib.make_loss(noise=noise),  # noqa: E731
                                      static_argnums=0)
    features = np.random.default_rng(2).normal(size=(2, 8, model.config.hidden_size))
    batch = _batch(np.ones((2, 8)), features.astype(np.float32))
    extras = train_lib.frozen_inputs(model, params)
    clean = make_loss(0.1)(head, net, batch, None, extras)[0]
    quiet = make_loss(0.0)(head, net, batch, jax.random.PRNGKey(0), extras)[0]
    noisy = [make_loss(0.1)(head, net, batch, jax.random.PRNGKey(k), extras)[0]
             for k in (0, 0, 1)]
    assert float(clean) == float(quiet)
    assert float(noisy[0]) == float(noisy[1]) != float(noisy[2]) and float(noisy[0]) != clean
    with pytest.raises(ValueError, match="w_reg"):
        train_lib.make_loss(w_reg=0.0, w_ce=0.0)


# The evaluation recomputes the head's features in chunks, the sequence below
# one position at a time: the same float32 maths in kernels of other widths,
# equal on CPU and ~1e-6 apart in logits on a GPU. A greedy choice can flip only
# where the two best logits are closer than that, so the sequence is picked with
# every margin above this bound (the test then holds on any backend).
ARGMAX_MARGIN = 1e-3


def _self_consistent_sequence(head, params, first_token, length):
    """Tokens and features that the head itself generates greedily, feeding
    back its own predictions: its predictions equal these 'true' features.
    Also the smallest gap between the best and second-best logit."""
    cache = head.init_cache(1, length)
    tokens, features, margin = [first_token], [], np.inf
    prev = jnp.zeros((1, 1, head.config.feature_size))
    for _ in range(length):
        out, cache = head.step(params, jnp.asarray([[tokens[-1]]]), prev, cache)
        features.append(np.asarray(out[0, 0]))
        tokens.append(int(train_lib.greedy_tokens(head, params, out[0, 0])))
        top2 = np.sort(np.asarray(head.logits(params, out[0, 0])))[-2:]
        margin = min(margin, float(top2[1] - top2[0]))
        prev = out
    return np.asarray(tokens[:length]), np.stack(features), np.asarray(tokens[1:]), margin


def _reference_hits(step, head, params, tokens, features, next_tokens, s, depth):
    """One start the slow way, as decoding drafts: a fresh cache fed one
    position at a time with the real features up to s, then the head's own
    predictions (``step`` is ``head.step``, jitted)."""
    cache = head.init_cache(1, len(tokens))
    prev = jnp.zeros((1, 1, features.shape[-1]))
    for position in range(s + 1):
        current, cache = step(params, jnp.asarray([[tokens[position]]]), prev, cache)
        prev = jnp.asarray(features[None, position:position + 1])
    hits = []
    for j in range(depth):
        hits.append(int(train_lib.greedy_tokens(head, params, current[0, 0])) == next_tokens[s + j])
        if j + 1 < depth:
            current, cache = step(params, jnp.asarray([[tokens[s + j + 1]]]), current, cache)
    return np.cumprod(hits)


def test_acceptance_is_one_when_predictions_are_the_true_features(toy):
    model, params, _ = toy
    head, net = _head(model, rng=3)
    full = feature_head.drafter_params(model, params, net)
    for first in range(65, 97):  # the first sequence with no near-tie (ARGMAX_MARGIN)
        tokens, features, next_tokens, margin = _self_consistent_sequence(head, full, first, 24)
        if margin > ARGMAX_MARGIN:
            break
    assert margin > ARGMAX_MARGIN, "no sequence without near-ties among 32 starts"
    mask = np.ones((1, 24), bool)
    out = train_lib.draft_acceptance(head, full, tokens[None], features[None],
                                     next_tokens[None], mask, depth=4, starts_per_chunk=8)
    assert out["alpha"] == [1.0] * 4 and out["expected_tokens"] == 5.0
    assert out["starts"] == 24 - 4 + 1


def test_acceptance_matches_drafting_start_by_start_and_catches_real_features(toy):
    """On real-looking features, the evaluation equals a start-by-start replay of
    the drafter; feeding the target's features to every draft (the known-wrong
    variant) scores differently, here perfectly: the targets are the head's
    teacher-forced choices, which the wrong variant reproduces."""
    model, params, _ = toy
    head, net = _head(model, rng=4)
    full = feature_head.drafter_params(model, params, net)
    rng = np.random.default_rng(5)
    n, width, depth = 2, 12, 4
    tokens = rng.integers(1, 200, (n, width)).astype(np.int32)
    features = rng.normal(size=(n, width, model.config.hidden_size)).astype(np.float32)
    prev = train_lib.previous_features(jnp.asarray(features), jnp.zeros((n, features.shape[-1])))
    predicted, _ = head.step(full, jnp.asarray(tokens), prev, head.init_cache(n, width))
    next_tokens = np.asarray(train_lib.greedy_tokens(head, full, predicted))  # teacher forced
    mask = np.ones((n, width), bool)
    right = train_lib.draft_acceptance(head, full, tokens, features, next_tokens, mask, depth,
                                       starts_per_chunk=16, rows_per_pass=1)
    wrong = train_lib.draft_acceptance(head, full, tokens, features, next_tokens, mask, depth,
                                       chain="real", starts_per_chunk=16)
    assert wrong["alpha"] == [1.0] * depth
    assert right["alpha"][0] == 1.0 and right["alpha"][-1] < 1.0
    starts = [(b, s) for b in range(n) for s in range(width - depth + 1)]
    step = jax.jit(head.step)
    reference = np.mean([_reference_hits(step, head, full, tokens[b], features[b], next_tokens[b],
                                         s, depth) for b, s in starts], axis=0)
    np.testing.assert_allclose(right["alpha"], reference)
    assert right["starts"] == len(starts)


def _train(workdir, data_dir, toy, **kwargs):
    model, params, _ = toy
    args = dict(workdir=workdir, data_dir=data_dir, target_name=TARGET, target=model,
                target_params=params, intermediate_size=16, batch_size=2, learning_rate=1e-2,
                warmup_steps=1, num_steps=8, eval_every=8, checkpoint_every=3, depth=3,
                progress=False)
    return train_lib.train_feature_head(**{**args, **kwargs})


def _losses(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


@pytest.mark.slow  # three short runs: ~30 s on an idle 2-core machine
def test_training_lowers_the_loss_resumes_exactly_and_saves_the_head(tmp_path, toy_data, toy):
    data_dir, _ = toy_data
    model, params, _ = toy
    whole = _train(tmp_path / "whole", data_dir, toy)
    losses = _losses(tmp_path / "whole")
    assert len(losses) == 8 and np.mean(losses[-3:]) < np.mean(losses[:3])

    class Killed(Exception):
        pass

    def kill_at_step_5(step, _):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        _train(tmp_path / "cut", data_dir, toy, callbacks=[kill_at_step_5])
    assert len(_losses(tmp_path / "cut")) == 5
    _train(tmp_path / "cut", data_dir, toy)  # resumes from the checkpoint at step 3
    assert _losses(tmp_path / "cut") == losses  # bit for bit

    drafter, drafter_params, meta = load_feature_head(tmp_path / "whole" / "head",
                                                      target_name=TARGET, target=model,
                                                      target_params=params)
    assert meta["training"]["steps"] == 8 and meta["training"]["train_code_positions"] == 256
    assert len(meta["training"]["acceptance"]["responses"]["alpha"]) == 3
    assert drafter.head.config.intermediate_size == 16
    table = (tmp_path / "whole" / "acceptance.md").read_text()
    assert "alpha_3" in table and "teacher-forced path" in table
    assert whole["held_out_responses"] == 2
    with pytest.raises(FileExistsError):
        _train(tmp_path / "whole", data_dir, toy)


def test_train_positions_pick_a_prefix_of_the_code(tmp_path, toy_data, toy):
    data_dir, record = toy_data
    train_set, held, sizes = train_lib.split_data(
        data_dir, record, train_positions=70, held_out_code_shards=1, held_out_responses=0.5,
        width=16)
    assert sizes["train_code_positions"] == 96  # three 32-token chunks reach 70
    assert sizes["train_response_positions"] == 20 + 24
    assert held["responses"]["lengths"].tolist() == [18, 30]
    assert len(held["code"]["lengths"]) == 4
    # Rows split into 16-wide windows; a window past a row's start carries f_{s-1}.
    assert train_set.positions == 96 + 44 and len(train_set) == 6 + 2 + 2
    assert train_set.lengths[6:].tolist() == [16, 4, 16, 8]
    responses, _ = data_lib.load_shards(data_dir / "responses", record)
    np.testing.assert_array_equal(train_set.first_prev[7], responses["features"][0, 15])
    np.testing.assert_array_equal(train_set.tokens[7, :4], responses["tokens"][0, 16:20])
    assert not train_set.first_prev[6].any()
    with pytest.raises(ValueError, match="train_positions"):
        train_lib.split_data(data_dir, record, train_positions=10_000, held_out_code_shards=1,
                             held_out_responses=0.5, width=32)


@pytest.mark.slow  # the whole toy pipeline: ~30 s on an idle 2-core machine
def test_toy_config_runs_end_to_end(tmp_path):
    from train import main as train_main  # noqa: PLC0415

    assert train_main.main(["--gin_file", "configs/runs/feature_head_toy.gin",
                            f"--gin.WORKDIR='{tmp_path}'"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_metrics"]["loss"] < summary["first_loss"]
    assert (tmp_path / "head" / "feature_head.json").is_file()
    assert len(summary["acceptance"]["code"]["alpha"]) == 5
