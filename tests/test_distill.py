"""Drafter distillation: the divergences, and that distilling a drafter into
a target raises speculative decoding's block efficiency."""

import jax
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import training
from specdec_jax.training import distill
from tests.table_lm import TableLM


def test_divergences_match_their_definitions():
    rng = np.random.default_rng(0)
    teacher, student = rng.normal(size=(2, 3, 11)) * 3
    p = np.exp(teacher) / np.exp(teacher).sum(-1, keepdims=True)
    q = np.exp(student) / np.exp(student).sum(-1, keepdims=True)
    np.testing.assert_allclose(distill.divergence(teacher, student, "tvd"),
                               0.5 * np.abs(p - q).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(distill.divergence(teacher, student, "forward_kl"),
                               (p * np.log(p / q)).sum(-1), rtol=1e-4)
    np.testing.assert_allclose(distill.divergence(teacher, teacher, "tvd"), 0.0, atol=1e-6)
    # a teacher with zero-probability tokens (-inf logits) gives a finite KL
    hard = np.where(np.arange(11) < 3, 0.0, -np.inf)[None, :]
    assert np.isfinite(np.asarray(distill.divergence(hard, student[:1, :1], "forward_kl"))).all()
    with pytest.raises(ValueError, match="unknown divergence 'js'"):
        distill.divergence(teacher, student, "js")


def _models():
    # The target is a bigram table (its next-token law depends on the last token only),
    # so a small drafter can learn it from a few thousand positions and the test is
    # about the objective, not about capacity or generalisation.
    target = TableLM(32, order=1)
    drafter = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=32, hidden_size=32,
                                                intermediate_size=64, num_layers=1,
                                                num_heads=4, num_kv_heads=2))
    return (target, target.init_params(jax.random.PRNGKey(0), scale=2.0), drafter,
            drafter.init_params(jax.random.PRNGKey(1)))


@pytest.mark.long
def test_distillation_raises_block_efficiency(tmp_path):
    target, target_params, drafter, drafter_params = _models()
    rng = np.random.default_rng(0)
    # distil on the target's own samples after random prompts (4 + 12 tokens)
    corpus = distill.teacher_continuations(
        teacher=target, teacher_params=target_params, max_new_tokens=12,
        prompts=rng.integers(0, 32, (256, 4)).tolist(), batch_size=128)
    prompts = rng.integers(0, 32, (16, 4)).tolist()  # held out
    measure = lambda params: distill.block_efficiency(  # noqa: E731
        target=target, target_params=target_params, drafter=drafter, drafter_params=params,
        prompts=prompts, gamma=5, temperature=1.0, max_new_tokens=24, batch_size=16)
    before = measure(drafter_params)
    result = training.train(
        model=drafter, params=drafter_params,
        optimizer=training.OptimizerConfig(name="adamw", learning_rate=1e-2,
                                           schedule="constant"),
        data=training.lm_dataset(corpus, length=16, prompt_lengths=[4] * len(corpus)),
        num_steps=80, batch_size=16,
        workdir=tmp_path, loss_fn=distill.make_distillation_loss(target, kind="tvd"),
        loss_extras=target_params, eval_data=training.lm_dataset(corpus[:32], length=16),
        eval_every=80, progress=False)
    after = measure(result.state.params)
    first, last = result.history[0], result.history[-1]
    # measured: TVD 0.66 -> 0.08, acceptance 0.12 -> 0.73, block efficiency 1.56 -> 4.31
    assert last["loss"] < 0.5 * first["loss"]  # the TVD itself fell
    assert last["eval/tvd"] == pytest.approx(last["eval/loss"])
    assert after["acceptance_rate"] > before["acceptance_rate"] + 0.3
    assert after["block_efficiency"] > before["block_efficiency"]
    assert after["block_efficiency_ci"][0] > before["block_efficiency_ci"][1]  # CIs apart


def test_distillation_loss_needs_the_teacher(tmp_path):
    target, _, drafter, drafter_params = _models()
    with pytest.raises(ValueError, match="pass loss_extras=teacher_params"):
        training.train(model=drafter, params=drafter_params,
                       optimizer=training.OptimizerConfig(), num_steps=1, batch_size=2,
                       data=training.lm_dataset([[1, 2, 3]] * 2, length=3), workdir=tmp_path,
                       loss_fn=distill.make_distillation_loss(target), progress=False)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        distill.make_distillation_loss(target, temperature=0.0)


def test_teacher_samples_length_sorted_and_resumed(tmp_path, monkeypatch):
    """Length-sorted batches give every prompt its own continuation back in
    place (greedy: the same tokens as one padded batch); a rerun reads the
    finished batches from the cache, redoes a batch cut off mid-write, and
    refuses a cache made under other settings."""
    from specdec_jax import api  # noqa: PLC0415

    target, target_params, _, _ = _models()
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 32, n).tolist() for n in (9, 2, 5, 1, 7, 3, 8)]
    common = dict(teacher=target, teacher_params=target_params, prompts=prompts,
                  max_new_tokens=6, temperature=0.0, batch_size=3, progress=False)
    plain = distill.teacher_continuations(**common)
    cache = tmp_path / "teacher.jsonl"
    sorted_ = distill.teacher_continuations(**common, width_bucket=4, cache_path=cache)
    assert sorted_ == plain
    assert all(s[:len(p)] == p and len(s) == len(p) + 6 for s, p in zip(sorted_, prompts))

    lines = cache.read_text().splitlines()
    assert len(lines) == 1 + 3  # the settings, then 3 batches
    cache.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])  # last batch cut off
    calls = []
    real_generate = api.generate
    monkeypatch.setattr(api, "generate", lambda **kw: calls.append(1) or real_generate(**kw))
    assert distill.teacher_continuations(**common, width_bucket=4, cache_path=cache) == plain
    assert len(calls) == 1  # only the cut-off batch ran again
    assert distill.teacher_continuations(**common, width_bucket=4, cache_path=cache) == plain
    assert len(calls) == 1  # and its redone record is whole
    with pytest.raises(ValueError, match="other settings"):
        distill.teacher_continuations(**{**common, "max_new_tokens": 5}, width_bucket=4,
                                      cache_path=cache)
    with pytest.raises(ValueError, match="width_bucket must be"):
        distill.teacher_continuations(**common, width_bucket=0)
