"""The training core: the teacher-forced forward, resume after ``kill -9``,
data parallelism, checkpoints from another configuration, bad configs."""

import dataclasses
import functools
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import training
from specdec_jax.models import make_prompt
from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM
from tests.simulated_devices import run_on_devices

DECODER = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                            num_layers=2, num_heads=4, num_kv_heads=2))
T5 = T5EncoderDecoderLM(T5Config(vocab_size=32, d_model=32, d_kv=8, d_ff=48, num_heads=4,
                                 num_encoder_layers=2, num_decoder_layers=2))
REPO = pathlib.Path(__file__).resolve().parents[1]


@functools.cache
def _jitted(model, method: str):
    """``model.<method>`` jitted once per model: run eagerly, every small op compiles on its own
    for every new shape (hundreds of compilations, most of a test's time)."""
    return jax.jit(getattr(model, method))


_TEACHER_FORCED = jax.jit(training.teacher_forced, static_argnums=0)
_WIDTH = 8  # cache positions of _decode_step_by_step: one shape for every row


def _decode_step_by_step(model, params, targets, inputs=None):
    """Logits [L, V] for one row, fed one token per ``extend`` call (decoding)."""
    model_extend = _jitted(model, "extend")
    assert len(targets) <= _WIDTH and (inputs is None or len(inputs) <= _WIDTH)
    if inputs is None:
        cache = model.init_cache(1, _WIDTH)
        rows = []
        for token in targets:
            out = model_extend(params, np.asarray([[token]], np.int32), cache)
            rows.append(np.asarray(out.logits[0, 0]))
            cache = out.cache
        return np.stack(rows)
    cache = model.init_cache(1, _WIDTH, _WIDTH)
    first = _jitted(model, "prefill")(params, make_prompt([inputs]), cache)
    cache, rows = first.cache, []
    for token in [model.decoder_start_token_id, *targets[:-1]]:
        out = model_extend(params, np.asarray([[token]], np.int32), cache)
        rows.append(np.asarray(out.logits[0, 0]))
        cache = out.cache
    # prefill's preview of the first step is the same distribution
    np.testing.assert_allclose(np.asarray(first.logits[0, 0]), rows[0], atol=1e-5)
    return np.stack(rows)


def test_training_forward_equals_decoding_logits():
    """The logits trained on are the logits decoded with: one teacher-forced
    call equals prefill + token-by-token extend, for both model families, on a
    ragged batch (padding never leaks into a real row)."""
    params = DECODER.init_params(jax.random.PRNGKey(0))
    rows = [[3, 9, 4, 1, 7], [5, 2]]
    data = training.lm_dataset(rows, length=6)
    logits, labels, weights, _ = _TEACHER_FORCED(
        DECODER, params, training.Batch(targets=data.targets, weights=data.weights))
    for i, row in enumerate(rows):
        np.testing.assert_allclose(np.asarray(logits[i, :len(row)]),
                                   _decode_step_by_step(DECODER, params, row), atol=1e-5)
        assert np.asarray(labels[i, :len(row) - 1]).tolist() == row[1:]
        assert np.asarray(weights[i]).tolist() == [1.0] * (len(row) - 1) + [0.0] * (
            7 - len(row))

    params = T5.init_params(jax.random.PRNGKey(1))
    inputs, targets = [[4, 8, 15, 16, 23], [2, 3]], [[7, 1, 9], [6]]
    data = training.seq2seq_dataset(inputs, targets, input_length=6, target_length=4)
    batch = training.Batch(targets=data.targets, weights=data.weights, inputs=data.inputs,
                           input_lengths=data.input_lengths)
    logits, labels, weights, _ = _TEACHER_FORCED(T5, params, batch)
    for i in range(2):
        n = len(targets[i])
        np.testing.assert_allclose(np.asarray(logits[i, :n]),
                                   _decode_step_by_step(T5, params, targets[i], inputs[i]),
                                   atol=1e-5)
        assert np.asarray(weights[i]).sum() == n


def test_t5_dropout_is_on_in_training_steps_only():
    """A T5 config with dropout decodes exactly like one without (decoding passes
    no dropout RNG); a training step's loss depends on its key and repeats with
    it; evaluation is deterministic; a rate outside [0, 1) is named."""
    dropped = T5EncoderDecoderLM(dataclasses.replace(T5.config, dropout_rate=0.3))
    params = T5.init_params(jax.random.PRNGKey(1))
    data = training.seq2seq_dataset([[4, 8, 15, 16, 23], [2, 3]], [[7, 1, 9], [6]],
                                    input_length=6, target_length=4)
    batch = training.Batch(targets=data.targets, weights=data.weights, inputs=data.inputs,
                           input_lengths=data.input_lengths)
    plain = np.asarray(training.teacher_forced(T5, params, batch)[0])
    np.testing.assert_array_equal(np.asarray(training.teacher_forced(dropped, params, batch)[0]),
                                  plain)
    loss = lambda model, rng: float(training.lm_loss(model, params, batch, rng)[0])  # noqa: E731
    key_a, key_b = jax.random.PRNGKey(5), jax.random.PRNGKey(6)
    assert loss(dropped, key_a) == loss(dropped, key_a)
    assert loss(dropped, key_a) != loss(dropped, key_b)
    assert loss(dropped, key_a) != loss(dropped, None) == loss(T5, key_a)  # rate 0: no dropout
    eval_step = training.make_eval_step(dropped)
    assert float(eval_step(params, batch)["loss_sum"]) == float(
        training.make_eval_step(T5)(params, batch)["loss_sum"])
    with pytest.raises(ValueError, match=r"dropout_rate must be in \[0, 1\), got 1.0"):
        dataclasses.replace(T5.config, dropout_rate=1.0)
    with pytest.raises(ValueError, match="dropout is implemented for T5"):
        rows = training.lm_dataset([[3, 9, 4]], length=4)
        training.teacher_forced(DECODER, DECODER.init_params(jax.random.PRNGKey(0)),
                                training.Batch(targets=rows.targets, weights=rows.weights),
                                jax.random.PRNGKey(0))


def test_training_forward_rejects_the_wrong_batch_kind():
    data = training.lm_dataset([[1, 2, 3]], length=3)
    with pytest.raises(ValueError, match="encoder-decoder model needs batches with encoder"):
        training.teacher_forced(T5, T5.init_params(jax.random.PRNGKey(0)),
                                training.Batch(targets=data.targets, weights=data.weights))


def test_dataset_order_is_a_function_of_seed_and_index():
    data = training.lm_dataset([[i, i + 1] for i in range(10)], length=2)
    epoch = np.concatenate([data.indices(k, 5, seed=3) for k in range(2)])
    assert sorted(epoch.tolist()) == list(range(10))  # one epoch = a permutation
    straddling = data.indices(1, 7, seed=3)  # positions 7..13 cross into epoch 1
    assert straddling[:3].tolist() == data.indices(0, 10, seed=3)[7:].tolist()
    assert data.indices(4, 3, seed=3).tolist() == data.indices(4, 3, seed=3).tolist()
    assert data.indices(0, 10, seed=4).tolist() != data.indices(0, 10, seed=3).tolist()
    with pytest.raises(ValueError, match="has 3 tokens but the width is 2"):
        training.lm_dataset([[1, 2, 3]], length=2)


# --- resume after kill -9 (separate processes, as a real crash would be) ---

RUN = textwrap.dedent("""
    import json, os, signal, sys
    import jax, numpy as np
    import specdec_jax as sj
    from specdec_jax import training
    workdir, kill_at = sys.argv[1], int(sys.argv[2])
    model = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=32, hidden_size=32,
        intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2))
    rng = np.random.default_rng(0)
    data = training.lm_dataset(rng.integers(1, 32, (40, 10)).tolist(), length=10)
    def crash(step, logged):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: a real crash
    result = training.train(
        model=model, params=model.init_params(jax.random.PRNGKey(0)),
        optimizer=training.OptimizerConfig(name="adafactor", learning_rate=1e-2),
        data=data, num_steps=24, batch_size=4, workdir=workdir, checkpoint_every=5,
        callbacks=[crash], progress=False)
    print(json.dumps({"resumed_from": result.resumed_from}))
""")


def _run(workdir, kill_at=0):
    return subprocess.run([sys.executable, "-c", RUN, str(workdir), str(kill_at)],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_resume_after_kill_9_reproduces_the_losses_bit_for_bit(tmp_path):
    whole = _run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = _run(tmp_path / "crashed", kill_at=17)
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = _run(tmp_path / "crashed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["resumed_from"] in (10, 15)
    read = lambda name: [json.loads(line) for line in  # noqa: E731
                         (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    losses = lambda rows: [(r["step"], r["loss"], r["grad_norm"]) for r in rows]  # noqa: E731
    assert len(read("whole")) == 24
    assert losses(read("crashed")) == losses(read("whole"))  # exact floats, every step


def test_checkpoint_of_another_config_or_corrupt_is_named(tmp_path):
    optimizer = training.OptimizerConfig(name="adamw", learning_rate=1e-3, schedule="constant")
    data = training.lm_dataset([[1, 2, 3, 4]] * 4, length=4)
    common = dict(optimizer=optimizer, data=data, num_steps=2, batch_size=2,
                  workdir=tmp_path, checkpoint_every=1, progress=False)
    training.train(model=DECODER, params=DECODER.init_params(jax.random.PRNGKey(0)), **common)
    wider = sj.DecoderOnlyLM(DECODER.config.__class__(**{**DECODER.config.__dict__,
                                                         "vocab_size": 48}))
    with pytest.raises(ValueError, match=r"another configuration: model.vocab_size: "
                                         r"checkpoint 32, this run 48"):
        training.train(model=wider, params=wider.init_params(jax.random.PRNGKey(0)), **common)
    for path in (tmp_path / "checkpoints" / "2" / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(b"\0garbage")
    with pytest.raises(ValueError, match=r"checkpoints/2 is corrupt or incomplete"):
        training.train(model=DECODER, params=DECODER.init_params(jax.random.PRNGKey(0)),
                       **common)


def test_bad_optimizer_configs_name_the_fix():
    with pytest.raises(ValueError, match="unknown optimizer 'adam'; choose one of adafactor"):
        training.OptimizerConfig(name="adam")
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'"):
        training.OptimizerConfig(schedule="step")
    with pytest.raises(ValueError, match="must exceed warmup_steps"):
        training.OptimizerConfig(schedule="cosine", warmup_steps=10, total_steps=5)


# --- data parallel on 8 simulated devices ---

PARALLEL = textwrap.dedent("""
    import tempfile
    import jax, numpy as np
    import specdec_jax as sj
    from specdec_jax import training
    from specdec_jax.runtime import sharding
    assert jax.device_count() == 8
    model = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=32, hidden_size=32,
        intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2))
    data = training.lm_dataset(np.random.default_rng(0).integers(1, 32, (64, 12)).tolist(),
                               length=12)
    def run(mesh, batch_size=16):
        return training.train(
            model=model, params=model.init_params(jax.random.PRNGKey(0)),
            optimizer=training.OptimizerConfig(name="adamw", learning_rate=3e-3,
                                               schedule="constant"),
            data=data, num_steps=6, batch_size=batch_size, workdir=tempfile.mkdtemp(),
            mesh=mesh, progress=False, eval_data=data)
    one = run(sharding.make_mesh(devices=jax.devices()[:1]))
    eight = run(sharding.make_mesh())  # data axis of 8
    assert len(eight.state.params["embedder"]["embedding"].sharding.device_set) == 8
    for a, b in zip(one.history, eight.history):
        for key in ("loss", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a, b)
    assert abs(one.history[-1]["eval/loss"] - eight.history[-1]["eval/loss"]) <= 1e-5
    try:
        run(sharding.make_mesh(), batch_size=12)
    except ValueError as error:
        assert "batch size 12 is not divisible by the mesh's data axis (8 devices)" in str(error)
    else:
        raise AssertionError("a batch of 12 on 8 data shards must fail")
    print("SAME", [round(h["loss"], 6) for h in one.history])
""")


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_data_parallel_on_8_devices_matches_one_device():
    assert "SAME" in run_on_devices(PARALLEL, cwd=REPO).stdout


# --- mixtures and length buckets ---

def _ragged_seq2seq(n=60, seed=0):
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(1, 30, rng.integers(1, 17)).tolist() for _ in range(n)]
    targets = [rng.integers(1, 30, rng.integers(1, 9)).tolist() for _ in range(n)]
    return training.seq2seq_dataset(inputs, targets, input_length=16, target_length=8)


def test_length_buckets_keep_every_example_whole_in_its_first_fitting_bucket():
    data = _ragged_seq2seq()
    mixture = training.bucket_by_length(data, [(16, 8), (4, 8), (8, 8)], name="toy")
    assert mixture.names == ("toy[4x8]", "toy[8x8]", "toy[16x8]")  # sorted by width
    assert [c.inputs.shape[1] for c in mixture.components] == [4, 8, 16]
    assert sum(len(c) for c in mixture.components) == len(data)
    # rates are the buckets' sizes: an epoch visits each example about once
    assert mixture.probabilities.tolist() == pytest.approx(
        [len(c) / len(data) for c in mixture.components])
    rows = {}
    for width, bucket in zip((4, 8, 16), mixture.components):
        assert np.all(bucket.input_lengths <= width)
        if width > 4:  # each example sits in the first bucket that holds it
            assert np.all(bucket.input_lengths > width // 2)
        for i in range(len(bucket)):
            key = (tuple(bucket.inputs[i, :bucket.input_lengths[i]]),
                   tuple(bucket.targets[i][bucket.weights[i] > 0]))
            rows[key] = rows.get(key, 0) + 1
    whole = {}
    for i in range(len(data)):
        key = (tuple(data.inputs[i, :data.input_lengths[i]]),
               tuple(data.targets[i][data.weights[i] > 0]))
        whole[key] = whole.get(key, 0) + 1
    assert rows == whole  # same examples, same tokens: nothing cut, nothing lost
    assert mixture.mean_tokens() == pytest.approx(data.mean_tokens())
    with pytest.raises(ValueError, match="fit none of the buckets"):
        training.bucket_by_length(data, [(8, 8)])
    with pytest.raises(ValueError, match="tokens beyond width 4"):
        data.trim(input_width=4)


def test_mixture_batches_are_a_function_of_seed_and_index():
    data = _ragged_seq2seq()
    make = lambda: training.bucket_by_length(data, [(4, 8), (8, 8), (16, 8)])  # noqa: E731
    in_order, jumping = make(), make()
    far = 3 * training.datasets.MIXTURE_BLOCK + 5  # past a few blocks of draws
    first = jumping.batch(far, 4, seed=1)  # a fresh mixture asked out of order
    for k in range(far):
        in_order.batch(k, 4, seed=1)
    again = in_order.batch(far, 4, seed=1)
    for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(a, b)
    # components are drawn at their rates, and each walks its own epochs in order
    picks = [in_order.locate(k, seed=1) for k in range(far)]
    counts = np.bincount([c for c, _ in picks], minlength=3) / far
    np.testing.assert_allclose(counts, in_order.probabilities, atol=0.03)
    for c, component in enumerate(in_order.components):
        local = [j for comp, j in picks if comp == c]
        assert local == list(range(len(local)))
        # at batch size 1, the first len(component) batches are exactly one epoch
        seen = np.concatenate([component.indices(j, 1, seed=(1, c))
                               for j in range(len(component))])
        assert sorted(seen.tolist()) == list(range(len(component)))
    other = make().batch(far, 4, seed=2)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(first),
                                                         jax.tree_util.tree_leaves(other)))


def test_mixture_rejects_bad_settings():
    data = _ragged_seq2seq()
    with pytest.raises(ValueError, match="one rate per component"):
        training.MixtureDataset(components=(data,), rates=(0.5, 0.5))
    with pytest.raises(ValueError, match="rates must be positive"):
        training.MixtureDataset(components=(data, data), rates=(1.0, 0.0))
    lm = training.lm_dataset([[1, 2, 3]], length=4)
    with pytest.raises(ValueError, match="cannot mix decoder-only and encoder-decoder"):
        training.MixtureDataset(components=(data, lm), rates=(1.0, 1.0))


@pytest.mark.long
def test_training_on_length_buckets_resumes_with_the_same_losses(tmp_path):
    data = training.bucket_by_length(_ragged_seq2seq(), [(4, 8), (8, 8), (16, 8)])
    optimizer = training.OptimizerConfig(name="adamw", learning_rate=1e-3, schedule="constant")
    run = lambda workdir, steps: training.train(  # noqa: E731
        model=T5, params=T5.init_params(jax.random.PRNGKey(0)), optimizer=optimizer,
        data=data, num_steps=steps, batch_size=4, workdir=workdir, checkpoint_every=3,
        progress=False)
    whole = run(tmp_path / "whole", 8)
    run(tmp_path / "split", 3)
    resumed = run(tmp_path / "split", 8)
    assert resumed.resumed_from == 3
    losses = lambda result: [(r["step"], r["loss"]) for r in result.history]  # noqa: E731
    assert losses(resumed) == losses(whole)
    assert len({data.locate(k, 0)[0] for k in range(8)}) > 1  # batches of several shapes
