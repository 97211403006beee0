"""Drafter distillation: the divergences, and that distilling a drafter into
a target raises speculative decoding's block efficiency."""

import jax
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import training
from specdec_jax.models.toy import TableLM
from specdec_jax.training import distill


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
