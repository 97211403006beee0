"""SpecDec++ (docs/algorithms.md): the acceptance head, adaptive draft lengths in
the jitted loop, and exactness. Where a row stops drafting depends only on the
drafter's side, so token and block verification of the ragged blocks keep the
target's law (chi-square on enumerable toy models, T = 1), and greedy
SpecDec++ equals greedy target decoding token for token.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import target_functions
from specdec_jax.api import sampling_params
from specdec_jax.checkpoints.acceptance_head_io import drafter_fingerprint, load_head, save_head
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
from specdec_jax.drafting.adaptive import AdaptiveDrafter, small_target_widths, target_widths
from specdec_jax.models.interface import make_prompt
from specdec_jax.verify.block import BlockVerifier, SeedBlockVerifier
from specdec_jax.verify.token import (
    TokenVerifier,
    block_lengths,
    correction_or_bonus,
    gather_token_probs,
    leading_accepts,
)
from tests.exactness import (
    DRAFTER,
    DRAFTER_PARAMS,
    LENGTH,
    P_MIN,
    PROMPT,
    ROWS,
    TARGET,
    TARGET_PARAMS,
    V,
    chi_square_pvalue,
    exact_sequence_probs,
)

K_MAX = 4
# The toy drafter's hidden state is the one-hot of its context (V ** 1 rows).
HEAD = AcceptanceHead(HeadConfig(hidden_size=V, depth=1))


def head_params(bias: float | None = None, seed: int = 21) -> dict:
    """A random head whose predictions differ by context (so rows stop at
    different lengths), or a constant one (``bias``: its logit)."""
    params = HEAD.init_params(jax.random.PRNGKey(seed))
    kernel = 2.0 * jax.random.normal(jax.random.PRNGKey(seed + 1), (V, 1))
    if bias is not None:
        kernel = jnp.zeros((V, 1))
    return {**params, "output": {"kernel": kernel,
                                 "bias": jnp.full((1,), 0.5 if bias is None else bias)}}


ADAPTIVE = AdaptiveDrafter(DRAFTER, HEAD)


def generate(verifier, *, threshold=0.5, temperature=1.0, rows=ROWS, max_new_tokens=LENGTH,
             head=None, gamma=K_MAX, prompts=None, seed=0, drafter=ADAPTIVE):
    decoder = SpeculativeDecoder(target=TARGET, drafter=drafter,
                                 target_fn=target_functions.get_target("specdecode"), gamma=gamma,
                                 max_new_tokens=max_new_tokens, verifier=verifier)
    params = drafter.select_params({drafter.name: DRAFTER_PARAMS,
                                    drafter.head_name: head_params() if head is None else head})
    prompt = make_prompt(prompts or [list(PROMPT)] * rows)
    return jax.jit(decoder.generate)(
        TARGET_PARAMS, params, prompt, jax.random.PRNGKey(seed),
        sampling_params(temperature=temperature, stop_threshold=threshold))


def target_probs():
    return exact_sequence_probs(lambda c: TARGET.next_probs(TARGET_PARAMS, c))


@pytest.mark.long
@pytest.mark.parametrize("verifier", [TokenVerifier(), BlockVerifier()], ids=["token", "block"])
def test_adaptive_drafting_keeps_the_target_law(verifier):
    out = generate(verifier)
    assert np.all(np.asarray(out.lengths) == LENGTH)
    assert chi_square_pvalue(np.asarray(out.tokens), target_probs()) > P_MIN
    stats = out.stats
    per_round = np.asarray(stats.drafted).sum() / np.asarray(stats.target_calls).sum()
    assert 1.0 < per_round < K_MAX, f"rows stop at different lengths ({per_round:.2f})"
    assert np.asarray(stats.rejections).sum() > 0


@dataclasses.dataclass(frozen=True)
class BonusFromResidual(TokenVerifier):
    """Known-wrong: caps acceptance at the row's count but, when a short block
    is accepted whole, draws the next token from the residual at its end
    instead of the target's law there (ignores the count for the bonus)."""

    def __call__(self, key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state=None,
                 count_B=None):
        accept_key, sample_key = jax.random.split(key)
        u_BxG = jax.random.uniform(accept_key, drafts_BxG.shape)
        accepted_B = jnp.minimum(
            leading_accepts(u_BxG * gather_token_probs(q_BxGxV, drafts_BxG)
                            < gather_token_probs(pi_BxGxV, drafts_BxG)),
            block_lengths(drafts_BxG, count_B))
        next_B = correction_or_bonus(sample_key, accepted_B, q_BxGxV, pi_BxGxV, bonus_BxV)
        return self.output(accepted_B, next_B, state)

    @staticmethod
    def output(accepted_B, next_B, state):
        from specdec_jax.verify.token import VerifyOutput  # noqa: PLC0415

        return VerifyOutput(num_accepted=accepted_B, next_token=next_B, state=state)


@pytest.mark.long
def test_ignoring_the_count_for_the_bonus_is_caught():
    """The chi-square test separates the known-wrong verifier (measured
    p = 1.5e-297; the correct token verifier on the same draws: p = 0.067)."""
    out = generate(BonusFromResidual())
    assert chi_square_pvalue(np.asarray(out.tokens), target_probs()) < 1e-12


@pytest.mark.parametrize("verifier", [TokenVerifier(), BlockVerifier()], ids=["token", "block"])
def test_greedy_specdecpp_equals_greedy_target(verifier):
    prompts = [[1, 2], [3], [0, 3, 1], [2, 2]]
    out = generate(verifier, temperature=0.0, rows=None, prompts=prompts, max_new_tokens=12)
    ar = SpeculativeDecoder(target=TARGET, drafter=DRAFTER,
                            target_fn=target_functions.get_target("specdecode"), gamma=1,
                            max_new_tokens=12)
    reference = jax.jit(ar.generate)(TARGET_PARAMS, DRAFTER_PARAMS, make_prompt(prompts),
                                     jax.random.PRNGKey(0), sampling_params())
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))


@pytest.mark.parametrize("bias, drafts, fed", [(-8.0, 1, 2), (8.0, 8, 9)])
def test_target_pays_only_for_the_longest_row(bias, drafts, fed):
    """A head that predicts rejection stops every row after one draft: the
    target scores 2 positions a round, not K_max + 1 = 9; one that predicts
    acceptance drafts K_max."""
    out = generate(TokenVerifier(), head=head_params(bias=bias), gamma=8, rows=16,
                   max_new_tokens=20)
    calls = np.asarray(out.stats.target_calls).sum()
    assert np.asarray(out.stats.drafted).sum() == drafts * calls
    assert np.asarray(out.stats.target_fed).sum() == fed * calls
    assert target_widths(8) == (2, 4, 8, 9)  # the suite runs on CPU
    assert small_target_widths("tpu") == small_target_widths("gpu") == (2, 8)
    assert target_widths(8, small_target_widths("tpu")) == (2, 8, 9)
    assert target_widths(5, small_target_widths("tpu")) == (2, 6)


def test_head_is_a_residual_mlp_with_its_own_layers():
    head = AcceptanceHead(HeadConfig(hidden_size=8, depth=3))
    params = head.init_params(jax.random.PRNGKey(0), prior_acceptance=0.8)
    assert sorted(params) == ["output", "residual_0", "residual_1", "residual_2"]
    kernels = [np.asarray(params[f"residual_{k}"]["kernel"]) for k in range(3)]
    assert not np.allclose(kernels[0], kernels[1])  # no weight sharing
    hidden = jax.random.normal(jax.random.PRNGKey(1), (5, 8))
    np.testing.assert_allclose(head.accept_probs(params, hidden), 0.8, rtol=1e-5)
    x = hidden
    for k in range(3):
        layer = params[f"residual_{k}"]
        x = x + jax.nn.silu(x @ layer["kernel"] + layer["bias"])
    params["output"]["kernel"] = jnp.ones((8, 1))
    np.testing.assert_allclose(head.logits(params, hidden),
                               x.sum(-1) + params["output"]["bias"][0], rtol=1e-5)


def test_head_saves_with_its_drafter_and_refuses_another(tmp_path):
    params = head_params()
    save_head(tmp_path / "head", HEAD, params, drafter_name="toy",
              fingerprint=drafter_fingerprint(DRAFTER_PARAMS))
    head, loaded, meta = load_head(tmp_path / "head", drafter_name="toy",
                                   drafter_params=DRAFTER_PARAMS)
    assert head == HEAD and meta["drafter"] == "toy"
    jax.tree_util.tree_map(np.testing.assert_array_equal, loaded, params)
    other = DRAFTER.init_params(jax.random.PRNGKey(99))
    with pytest.raises(ValueError, match="trained for drafter 'toy'.*Train a head"):
        load_head(tmp_path / "head", drafter_name="toy", drafter_params=other)
    with pytest.raises(ValueError, match="not for 'qwen"):
        load_head(tmp_path / "head", drafter_name="qwen2.5-coder-0.5b",
                  drafter_params=DRAFTER_PARAMS)
    # The same drafter in the decode layout ([out, in] kernels) is the same
    # weights: its fingerprint, read through the model's layout, matches.
    import specdec_jax as sj
    decoder = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=V, hidden_size=8,
                                                intermediate_size=16, num_layers=1, num_heads=2,
                                                num_kv_heads=1))
    decoder_params = decoder.init_params(jax.random.PRNGKey(3))
    save_head(tmp_path / "decoder-head", HEAD, params, drafter_name="toy",
              fingerprint=drafter_fingerprint(decoder_params))
    laid_model, laid = sj.decode_layout(decoder, decoder_params)
    assert laid_model.config.kernel_layout == "out_in"
    assert drafter_fingerprint(laid, laid_model) == drafter_fingerprint(decoder_params)
    assert drafter_fingerprint(laid) != drafter_fingerprint(decoder_params)  # layout unread
    load_head(tmp_path / "decoder-head", drafter_name="toy", drafter_params=laid,
              drafter=laid_model)
    with pytest.raises(ValueError, match="trained for drafter 'toy'"):
        load_head(tmp_path / "decoder-head", drafter_name="toy", drafter_params=laid)


def test_bad_settings_fail_with_the_fix():
    with pytest.raises(ValueError, match=r"stop_threshold .* must be in \(0, 1\)"):
        sampling_params(stop_threshold=1.0)
    with pytest.raises(ValueError, match="depth D must be in 0..4"):
        HeadConfig(hidden_size=4, depth=5)
    with pytest.raises(ValueError, match="K_max .* must be >= 1"):
        generate(TokenVerifier(), gamma=0, rows=2)
    with pytest.raises(ValueError, match="block-seed .* cannot verify adaptive"):
        generate(SeedBlockVerifier(), rows=2)
    with pytest.raises(KeyError, match="acceptance head"):
        ADAPTIVE.select_params({"drafter": DRAFTER_PARAMS})


@pytest.mark.long  # reads the whole standard library: CI runs it with -m long
def test_stdlib_prompts_are_a_recorded_seeded_sample_disjoint_from_humaneval():
    from specdec_jax.data import humaneval  # noqa: PLC0415
    from specdec_jax.data.stdlib_prompts import stdlib_prompts  # noqa: PLC0415

    entry_points = [p["entry_point"] for p in humaneval.load_problems()]
    prompts, record = stdlib_prompts(500, seed=0, exclude_names=entry_points)
    again, record_again = stdlib_prompts(500, seed=0, exclude_names=entry_points)
    assert prompts == again and record == record_again and record["size"] == 500
    assert record["candidates"] >= 500 and "standard library" in record["source"]
    names = {i.split(":")[1] for i, _, _ in prompts}
    assert not names & set(entry_points)
    for _, text, body in prompts[:50]:
        compile(text + "    pass\n", "<prompt>", "exec")  # a well-formed def + docstring
        assert text.startswith("def ") and '"""' in text
        if body:  # the real implementation completes the prompt into valid code
            compile(text + body, "<function>", "exec")
    assert stdlib_prompts(500, seed=1)[1]["sha256"] != record["sha256"]
    with pytest.raises(ValueError, match="offers"):
        stdlib_prompts(10**6)


def test_acceptance_data_labels_mix_and_shards(tmp_path):
    """Labels are min(1, p(Y)/q(Y)) at the response's contexts, about 85% of
    the positions come from Y, the build resumes, and another pair's data is
    refused."""
    from specdec_jax.training import acceptance_data as data  # noqa: PLC0415

    rng = np.random.default_rng(0)
    sequences = [([1, 2], rng.integers(0, V, 12).tolist()) for _ in range(20)]
    pair = data.pair_record(target_name="table2", target_params=TARGET_PARAMS,
                            drafter_name="table1", drafter_params=DRAFTER_PARAMS)
    kwargs = dict(target=TARGET, target_params=TARGET_PARAMS, drafter=DRAFTER,
                  drafter_params=DRAFTER_PARAMS, pair=pair, sequences=sequences,
                  prompts_record={"source": "random"}, source="corpus", batch_size=4,
                  shard_batches=2, progress=False)
    manifest = data.build_shards(tmp_path, **kwargs)
    assert len(manifest["shards"]) == 3  # 20 sequences, 8 per shard
    features, labels, _ = data.load_shards(tmp_path, pair)
    assert 0.75 < len(labels) / (20 * 12) < 0.95  # r = 0.15 of positions keep X
    assert data.build_shards(tmp_path, **kwargs) == manifest  # nothing left to do

    # Recompute every label: the drafter's feature is the one-hot of the token
    # just fed (Y_i); the label's context is the prompt and X_<i.
    fn = data.make_example_fn(TARGET, DRAFTER, temperature=1.0)
    batch = next(data._batches(sequences[:4], 4, 14))[1]
    f, y, keep = jax.device_get(fn(TARGET_PARAMS, DRAFTER_PARAMS, batch, jax.random.PRNGKey(0)))
    checked = 0
    for b, t in zip(*np.nonzero(keep)):
        context = tuple(int(x) for x in np.asarray(batch.targets)[b, :t + 1])
        token = int(np.argmax(f[b, t]))
        want = min(1.0, TARGET.next_probs(TARGET_PARAMS, context)[token] /
                   DRAFTER.next_probs(DRAFTER_PARAMS, context)[token])
        np.testing.assert_allclose(y[b, t], want, rtol=1e-4)
        checked += 1
    assert checked > 30

    other = data.pair_record(target_name="table2", target_params=DRAFTER_PARAMS,
                             drafter_name="table1", drafter_params=DRAFTER_PARAMS)
    with pytest.raises(ValueError, match="acceptance data built for another model "
                                         r"\(pair.target_fingerprint: "):
        data.load_shards(tmp_path, other)


def test_acceptance_data_writes_atomically_resumes_to_the_same_data_and_refuses_a_partial_one(
        tmp_path, monkeypatch):
    """A kill while the manifest after the second shard is written leaves the
    first manifest whole: the partial build is refused on load, and the
    resumed build gives the data of an uninterrupted one."""
    import os  # noqa: PLC0415

    from specdec_jax.training import acceptance_data as data  # noqa: PLC0415

    rng = np.random.default_rng(2)
    sequences = [([1, 2], rng.integers(0, V, 6).tolist()) for _ in range(12)]
    pair = data.pair_record(target_name="table2", target_params=TARGET_PARAMS,
                            drafter_name="table1", drafter_params=DRAFTER_PARAMS)
    kwargs = dict(target=TARGET, target_params=TARGET_PARAMS, drafter=DRAFTER,
                  drafter_params=DRAFTER_PARAMS, pair=pair, sequences=sequences,
                  prompts_record={"source": "random"}, source="corpus", batch_size=2,
                  shard_batches=2, progress=False)
    data.build_shards(tmp_path / "whole", **kwargs)
    real_replace = os.replace

    class Killed(Exception):
        pass

    def replace(src, dst):
        if str(dst).endswith(data.MANIFEST) and (tmp_path / "cut" / "shard-00001.npz").exists():
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Killed):
        data.build_shards(tmp_path / "cut", **kwargs)
    monkeypatch.setattr(os, "replace", real_replace)
    stored = json.loads((tmp_path / "cut" / data.MANIFEST).read_text())
    assert list(stored["shards"]) == ["shard-00000.npz"] and not stored["finished"]
    with pytest.raises(ValueError, match="did not finish.*run the build command again"):
        data.load_shards(tmp_path / "cut", pair)
    data.build_shards(tmp_path / "cut", **kwargs)
    whole, resumed = data.load_shards(tmp_path / "whole", pair), data.load_shards(
        tmp_path / "cut", pair)
    np.testing.assert_array_equal(resumed[0], whole[0])
    np.testing.assert_array_equal(resumed[1], whole[1])
    assert len(resumed[2]["shards"]) == 3


@pytest.mark.parametrize("w_rej", [1.0, 6.0])
def test_best_constant_minimises_the_weighted_loss(w_rej):
    """The closed form against a grid search of the weighted soft-label BCE
    (for w_rej = 1 it is the label mean; for w_rej = 6 it is far below it)."""
    from specdec_jax.training import acceptance_training as train  # noqa: PLC0415

    labels = np.random.default_rng(0).beta(4, 1, 1000)
    grid = np.linspace(0.001, 0.999, 9981)
    loss = -(labels.mean() * np.log(grid) + w_rej * (1 - labels.mean()) * np.log(1 - grid))
    constant = train.best_constant(labels, w_rej=w_rej)
    assert abs(constant - grid[np.argmin(loss)]) < 2e-4
    assert (abs(constant - labels.mean()) < 1e-9) == (w_rej == 1.0)


def test_head_trains_on_the_core_and_beats_the_constant_predictor(tmp_path):
    """Toy pair data (the drafter's feature is the one-hot of the candidate
    token, which partly predicts its acceptance): the trained head's held-out
    binary KL is below the best constant's; the head is saved for its drafter
    and drives the adaptive drafter."""
    from specdec_jax.training import acceptance_data as data  # noqa: PLC0415
    from specdec_jax.training import acceptance_training as train

    rng = np.random.default_rng(1)
    sequences = [([1, 2], rng.integers(0, V, 16).tolist()) for _ in range(64)]
    pair = data.pair_record(target_name="table2", target_params=TARGET_PARAMS,
                            drafter_name="table1", drafter_params=DRAFTER_PARAMS)
    data.build_shards(tmp_path / "data", target=TARGET, target_params=TARGET_PARAMS,
                      drafter=DRAFTER, drafter_params=DRAFTER_PARAMS, pair=pair,
                      sequences=sequences, prompts_record={"source": "random"},
                      source="corpus", batch_size=8, shard_batches=2, progress=False)
    summary = train.train_head(workdir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"),
                               pair=pair, depth=1, w_rej=1.0, learning_rate=0.05, epochs=4,
                               batch_size=32, progress=False)
    assert summary["binary_kl"]["held_out"] < 0.9 * summary["constant_binary_kl"]["held_out"]
    assert summary["binary_kl"]["train"] < summary["constant_binary_kl"]["train"]
    scored = train.evaluate_head(str(tmp_path / "run" / "head"), str(tmp_path / "data"), 1)
    assert scored["binary_kl"] == pytest.approx(summary["binary_kl"]["held_out"], rel=1e-5)
    assert scored["constant_binary_kl"] == pytest.approx(summary["constant_binary_kl"]["held_out"])
    assert scored["mean_label"] == pytest.approx(summary["mean_label"]["held_out"])
    head, params, _ = load_head(tmp_path / "run" / "head", drafter_name="table1",
                                drafter_params=DRAFTER_PARAMS)
    drafter = AdaptiveDrafter(DRAFTER, head)
    out = generate(TokenVerifier(), head=params, drafter=drafter, rows=8, max_new_tokens=8)
    assert np.all(np.asarray(out.lengths) == 8)
    with pytest.raises(ValueError, match="held_out_shards must be in"):
        train.split_shards(str(tmp_path / "data"), pair, held_out_shards=4)


@pytest.mark.long
def test_specdecpp_jobs_build_data_from_both_sources_and_train_a_head(tmp_path):
    """The gin jobs end to end on the byte-level toy pair (scores mean nothing)."""
    import json  # noqa: PLC0415

    from train import main as train_main  # noqa: PLC0415

    toys = ["--gin.TARGET='toy-bytes-large'", "--gin.DRAFTER='toy-bytes-small'"]
    for source in ("target", "corpus"):
        out = tmp_path / source
        assert train_main.main([
            "--gin_file", "configs/runs/specdecpp_data.gin", *toys, f"--gin.OUT_DIR='{out}'",
            "--gin.run_specdecpp_data.num_prompts=12",
            "--gin.run_specdecpp_data.max_new_tokens=6",
            f"--gin.run_specdecpp_data.source='{source}'",
            "--gin.run_specdecpp_data.batch_size=2", "--gin.run_specdecpp_data.shard_batches=2",
            "--gin.run_specdecpp_data.progress=False"]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["settings"]["source"] == source
        assert manifest["settings"]["prompts"]["size"] == 12
        assert len(manifest["shards"]) == 3 and manifest["pair"]["drafter"] == "toy-bytes-small"
    head_dir = tmp_path / "head"
    assert train_main.main([
        "--gin_file", "configs/runs/specdecpp_train.gin", f"--gin.DATA_DIR='{tmp_path / 'target'}'",
        f"--gin.WORKDIR='{head_dir}'", "--gin.DEPTH=0", "--gin.W_REJ=1.0",
        "--gin.run_specdecpp_train.epochs=1.0", "--gin.run_specdecpp_train.batch_size=8",
        "--gin.run_specdecpp_train.held_out_shards=1",  # of the toy build's 3
        "--gin.run_specdecpp_train.progress=False"]) == 0
    summary = json.loads((head_dir / "summary.json").read_text())
    assert summary["depth"] == 0 and summary["train_examples"] > summary["held_out_examples"] > 0
    assert (head_dir / "head" / "head.json").exists()
    # Scored on shards it trained on (either source: same prompts per shard): refused.
    from specdec_jax.training.acceptance_training import evaluate_head  # noqa: PLC0415

    assert evaluate_head(str(head_dir / "head"), str(tmp_path / "corpus"), 1)["binary_kl"] >= 0
    # The heads benchmark (benchmarks/configs/specdecpp_heads.gin): that head on both builds.
    from benchmarks import main as bench_main  # noqa: PLC0415

    assert bench_main.main([
        "--gin_file", "benchmarks/configs/specdecpp_heads.gin",
        f"--gin.DATA=['{tmp_path / 'corpus'}', '{tmp_path / 'target'}']",
        f"--gin.HEADS=['{head_dir / 'head'}']", "--gin.HELD_OUT_SHARDS=1",
        f"--gin.OUT_PATH='{tmp_path / 'heads.json'}'",
        f"--gin.MARKDOWN_PATH='{tmp_path / 'heads.md'}'"]) == 0
    scored = json.loads((tmp_path / "heads.json").read_text())
    assert [r["data_source"] for r in scored] == ["corpus", "target"]
    assert scored[0]["binary_kl"] == pytest.approx(
        evaluate_head(str(head_dir / "head"), str(tmp_path / "corpus"), 1)["binary_kl"])
    assert "| binary KL |" in (tmp_path / "heads.md").read_text()
    for source in ("target", "corpus"):
        with pytest.raises(ValueError, match="trained on some of the last 2 shards"):
            evaluate_head(str(head_dir / "head"), str(tmp_path / source), 2)
    # A head that does not say how many shards it held out is refused on its prompts.
    meta_path = head_dir / "head" / "head.json"
    meta = json.loads(meta_path.read_text())
    del meta["training"]["held_out_shards"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not record how many shards"):
        evaluate_head(str(head_dir / "head"), str(tmp_path / "corpus"), 1)
    meta["training"]["held_out_shards"] = 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(FileExistsError, match="this run is finished"):  # before any training
        train_main.main(["--gin_file", "configs/runs/specdecpp_train.gin",
                         f"--gin.DATA_DIR='{tmp_path / 'target'}'", f"--gin.WORKDIR='{head_dir}'",
                         "--gin.run_specdecpp_train.progress=False"])

    # The benchmark on the toy pair (benchmarks/configs/specdecpp.gin): greedy SpecDec++
    # and greedy SpecDec reproduce the greedy target; the rates and the cost
    # model's agreement with the timed runs are sane.
    from benchmarks import specdecpp as bench_specdecpp  # noqa: PLC0415

    report_path = tmp_path / "bench.json"
    argv = ["--gin_file", "benchmarks/configs/specdecpp.gin", *toys,
            f"--gin.HEAD='{head_dir / 'head'}'", "--gin.bench_specdecpp.num_prompts=3",
            "--gin.bench_specdecpp.max_new_tokens=12", "--gin.bench_specdecpp.timed_prompts=2",
            "--gin.bench_specdecpp.thresholds=[0.3, 0.8]", "--gin.bench_specdecpp.ks=[3]",
            "--gin.bench_specdecpp.k_max=6", "--gin.bench_specdecpp.target_widths=[3, 7]",
            "--gin.bench_specdecpp.batch_size=2", "--gin.bench_specdecpp.calibration_repeats=1",
            f"--gin.OUT_PATH='{report_path}'"]
    assert bench_main.main([*argv, f"--gin.MARKDOWN_PATH='{tmp_path / 'bench.md'}'"]) == 0
    report = json.loads(report_path.read_text())
    # Phase 1 is logged per (configuration, batch); a rerun reads it back, runs nothing.
    log_lines = (tmp_path / "bench.counts.jsonl").read_text().splitlines()
    assert len(log_lines) == 1 + 3 * 2
    from specdec_jax.data import humaneval  # noqa: PLC0415
    from specdec_jax.runtime.resume import ResumeLog  # noqa: PLC0415

    # counts_only: phase 1 alone (its own log here) and a Markdown of the rates only.
    assert bench_main.main([*argv, "--gin.bench_specdecpp.counts_only=True",
                           f"--gin.OUT_PATH='{tmp_path / 'counts.json'}'",
                           f"--gin.MARKDOWN_PATH='{tmp_path / 'counts.md'}'"]) == 0
    counts_md = (tmp_path / "counts.md").read_text()
    assert "| SpecDec K=3 | 36 |" in counts_md and "best h" not in counts_md
    assert "wall_clock" not in json.loads((tmp_path / "counts.json").read_text())
    prompts = [list(p.encode()) for p in humaneval.load_prompts(3)]
    # The log names the head's weights, not just its path: counts made with a
    # head that was since retrained in place are refused, not reused.
    from specdec_jax.checkpoints import orbax_io, tree_paths  # noqa: PLC0415

    header = json.loads(log_lines[0])["settings"]
    trained = orbax_io.restore_params(head_dir / "head" / "params")
    assert header["head_params"] == tree_paths.params_fingerprint(trained)
    retrained = {**header, "head_params": tree_paths.params_fingerprint(
        jax.tree_util.tree_map(lambda x: x + 1, trained))}
    with pytest.raises(ValueError, match="other settings"):
        ResumeLog(tmp_path / "bench.counts.jsonl", retrained)
    resumed = bench_specdecpp.phase_counts(
        lambda *_: pytest.fail("a logged batch ran again"),
        bench_specdecpp.configurations(thresholds=[0.3, 0.8], ks=[3]), prompts, batch_size=2,
        seed=0, log=ResumeLog(tmp_path / "bench.counts.jsonl",
                              json.loads(log_lines[0])["settings"]))
    assert {k: v["rows"] for k, v in resumed.items()} == {
        k: v["rows"] for k, v in report["counts"].items()}
    # A log committed gzipped resumes too (unpacked beside it first).
    import gzip  # noqa: PLC0415

    original = (tmp_path / "bench.counts.jsonl").read_bytes()
    (tmp_path / "bench.counts.jsonl.gz").write_bytes(gzip.compress(original))
    (tmp_path / "bench.counts.jsonl").unlink()
    with pytest.raises(ValueError, match="other settings"):  # the unpacked log's header
        bench_specdecpp.counts_log(out=str(report_path), settings={}, prompts=[],
                                   head_meta={"config": {}}, head_params={})
    assert (tmp_path / "bench.counts.jsonl").read_bytes() == original
    assert all(g["identical_to_target"] for g in report["greedy"].values())
    for counts in report["counts"].values():
        assert counts["tokens"] == 3 * 12
        assert 1 / 7 <= counts["verification_rate"]["value"] <= 1.0
        assert counts["discard_rate"]["value"] >= 0.0
        assert counts["predicted_tokens_per_s"] > 0
    # The calibrated cost model priced every timed run (3 configurations and the
    # autoregressive target on 2 prompts) and its agreement is reported.
    # (Toy timings are noise: a decode time, end to end minus a prefill, can be < 0.)
    assert report["agreement"]["n"] == 4 * 2 and report["agreement"]["mean_bias"] is not None
    assert all(w["modelled_tokens_per_s"] > 0 for w in report["wall_clock"].values())
    assert report["calibration"]["target"].keys() == {"1", "2", "3", "4", "7"}
    assert report["cost_model"]["target"]["by_width_s"].keys() == {"1", "2", "3", "4", "7"}
    bench_md = (tmp_path / "bench.md").read_text()
    assert "| SpecDec++ (best h)" in bench_md and "Pearson r =" in bench_md
    assert report["target_widths"] == [3, 7]
    assert (tmp_path / "bench.png").exists()
    # specdecpp_device.gin: another device's step costs priced over these counts, no models.
    steps = {"environment": {"machine": "some gpu", "jax": "0"}, "by_dtype": {"bfloat16": {
        "steps": {"target": {"1": {str(w): {"step_s": 0.001 * w} for w in (1, 4, 7)}},
                  "drafter": {"1": {"1": {"step_s": 0.0005}}}}}}}
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    assert bench_main.main(["--gin_file", "benchmarks/configs/specdecpp_device.gin",
                           f"--gin.OUT_PATH='{report_path}'",
                           f"--gin.MARKDOWN_PATH='{tmp_path / 'bench.md'}'",
                           f"--gin.DEVICE_STEPS='{tmp_path / 'steps.json'}'"]) == 0
    device = json.loads(report_path.read_text())["device_predictions"][0]
    assert set(device["configurations"]) == set(report["counts"])
    assert device["configurations"]["SpecDec K=3"]["target_width"] == 4
    assert "## Predicted on some gpu (bfloat16" in (tmp_path / "bench.md").read_text()
    with pytest.raises(ValueError, match="unknown data source"):
        train_main.main(["--gin_file", "configs/runs/specdecpp_data.gin", *toys,
                         f"--gin.OUT_DIR='{tmp_path / 'x'}'",
                         "--gin.run_specdecpp_data.source='web'"])


def test_cost_model_prices_counts_at_their_widths_and_agrees_with_itself():
    """The calibrated cost model prices a configuration's counts: drafted tokens
    at the drafter's one-token call, target calls at K + 1 (fixed K), at the
    mean draft per round + 1 rounded up to a compiled width (SpecDec++), or at
    width 1 (autoregressive), plus the round overhead for speculative rounds.
    Timed runs that take exactly the modelled time agree perfectly."""
    from benchmarks import specdecpp as bench  # noqa: PLC0415
    from specdec_jax.decode import cost as cost_lib  # noqa: PLC0415

    cost = cost_lib.CostModel(
        target=cost_lib.CallCost.from_steps({1: 0.2, 2: 0.25, 3: 0.3, 4: 0.35, 7: 0.5}),
        drafter=cost_lib.CallCost.from_steps({1: 0.1, 2: 0.12}), round_overhead_s=0.01)
    fixed = {"name": "SpecDec K=2", "kind": "fixed", "k": 2}
    adaptive = {"name": "SpecDec++ h=0.5", "kind": "specdecpp", "h": 0.5}
    rows = [{"tokens": 10, "target_calls": 4, "drafted": 8}]
    # K = 2: 8 drafter calls, 4 calls of width 3, 4 round overheads.
    assert bench.decode_seconds(cost, fixed, rows) == (pytest.approx(0.8 + 1.2 + 0.04), 3)
    # SpecDec++: 8 drafts in 4 rounds -> 2 a round -> width 3 -> compiled 4 (of 2, 4, 7).
    assert bench.decode_seconds(cost, adaptive, rows, compiled=(2, 4, 7)) == (
        pytest.approx(0.8 + 1.4 + 0.04), 4)
    ar = [{"tokens": 5, "target_calls": 5, "drafted": 0}]
    assert bench.decode_seconds(cost, bench.AUTOREGRESSIVE, ar) == (pytest.approx(1.0), 1)
    # Timed runs made by the model itself: Pearson r = 1, no bias, ratio 1.
    report = {"target_widths": [2, 4, 7], "counts": {}, "wall_clock": {}}
    for config, runs in ((fixed, [{"tokens": n, "target_calls": c, "drafted": d}
                                  for n, c, d in ((10, 4, 8), (12, 5, 10), (9, 3, 6))]),
                         (adaptive, [{"tokens": n, "target_calls": c, "drafted": d}
                                     for n, c, d in ((10, 3, 8), (12, 6, 6))]),
                         (bench.AUTOREGRESSIVE, ar)):
        for run in runs:
            run["decode_s"] = bench.decode_seconds(cost, config, [run], compiled=(2, 4, 7))[0]
        report["wall_clock"][config["name"]] = {"runs": runs, "tokens_per_s": 1.0}
        if config is not bench.AUTOREGRESSIVE:
            report["counts"][config["name"]] = {"config": config, "rows": runs}
    bench.summarise_wall_clock(report, cost)
    agreement = report["agreement"]
    assert agreement["n"] == 6 and agreement["pearson"] == pytest.approx(1.0)
    assert agreement["mean_bias"] == pytest.approx(0.0, abs=1e-12)
    assert agreement["mean_ratio"] == pytest.approx(1.0)
    assert report["counts"]["SpecDec K=2"]["predicted_tokens_per_s"] == pytest.approx(
        31 / sum(r["decode_s"] for r in report["wall_clock"]["SpecDec K=2"]["runs"]))
    assert report["cost_model"] == cost.to_json()
    # A report made before the calibration is priced by its stored fit, flat in width.
    legacy, source = bench.cost_model_of({"latency_model": {"t_draft": 0.1, "t_target": 0.3}})
    assert "latency_model" in source
    assert bench.decode_seconds(legacy, fixed, rows)[0] == pytest.approx(0.8 + 1.2)
    with pytest.raises(ValueError, match="neither a calibrated cost_model"):
        bench.cost_model_of({})


def test_device_predictions_price_rounds_at_the_device_steps():
    from benchmarks import specdecpp as bench  # noqa: PLC0415

    counts = {"SpecDec K=2": {"config": {"kind": "fixed", "k": 2},
                              "rows": [{"tokens": 10, "target_calls": 4, "drafted": 8}]},
              "SpecDec++ h=0.5": {"config": {"kind": "specdecpp", "h": 0.5},
                                  "rows": [{"tokens": 6, "target_calls": 3, "drafted": 2},
                                           {"tokens": 4, "target_calls": 2, "drafted": 4}]}}
    steps = {"environment": {"machine": "gpu", "jax": "0"}, "by_dtype": {"bfloat16": {"steps": {
        "target": {"1": {"1": {"step_s": 0.002}, "3": {"step_s": 0.003}}},
        "drafter": {"1": {"1": {"step_s": 0.001}}}}}}}
    device = bench.device_predictions({"counts": counts}, steps, "bfloat16")
    fixed, adaptive = device["configurations"]["SpecDec K=2"], device["configurations"][
        "SpecDec++ h=0.5"]
    # K = 2: 8 drafter steps + 4 calls of width 3 for 10 tokens; AR 500 tokens/s.
    assert fixed["target_width"] == 3 and fixed["tokens_per_s"] == pytest.approx(10 / 0.020)
    assert fixed["speedup"] == pytest.approx(1.0)
    # SpecDec++: 6 drafts in 5 rounds -> mean 1.2 -> width 3 (rounded up to a measured one).
    assert adaptive["target_width"] == 3
    assert adaptive["tokens_per_s"] == pytest.approx(10 / (0.006 + 0.015))
    assert device["best"] == {"fixed": "SpecDec K=2", "specdecpp": "SpecDec++ h=0.5"}
    counts["SpecDec K=2"]["config"]["k"] = 4  # width 5: wider than any step measured
    with pytest.raises(ValueError, match=r"target_step_widths = \[\.\.\., 5\]"):
        bench.device_predictions({"counts": counts}, steps, "bfloat16")
    with pytest.raises(ValueError, match="set device_dtype to one of them"):
        bench.device_predictions({"counts": counts}, steps, "float32")


def test_head_sources_compare_two_logs_on_the_batches_both_cover(tmp_path):
    from benchmarks import specdecpp_head_sources  # noqa: PLC0415
    from specdec_jax.decode import cost as cost_lib  # noqa: PLC0415

    fixed = [{"tokens": 10, "target_calls": 4, "drafted": 8, "accepted": 6, "discarded": 2}]

    def log(path, adaptive_calls, extra_batch):
        # Consistent rows: tokens = accepted + target calls, drafted = accepted + discarded.
        accepted = 10 - adaptive_calls
        lines = [{"settings": {"thresholds": [0.5], "ks": [2]}},
                 {"key": ["SpecDec K=2", 0], "value": fixed},
                 {"key": ["SpecDec++ h=0.5", 0], "value": [
                     {"tokens": 10, "target_calls": adaptive_calls, "drafted": accepted + 1,
                      "accepted": accepted, "discarded": 1}]}]
        if extra_batch:  # a batch only this log covers, with other fixed-K rows
            lines.append({"key": ["SpecDec K=2", 1], "value": [{**fixed[0], "tokens": 12}]})
        path.write_text("\n".join(json.dumps(x) for x in lines))
        return str(path)

    import gzip  # noqa: PLC0415

    logs = {"corpus": log(tmp_path / "a.jsonl", 5, True),
            "target": log(tmp_path / "b.jsonl", 3, False)}
    # A log committed gzipped is read by its suffix.
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress((tmp_path / "b.jsonl").read_bytes()))
    logs["target"] = str(tmp_path / "b.jsonl.gz")
    # Calls flat in width: 0.3 s a target call, 0.1 s a drafter call.
    cost = cost_lib.CostModel(
        target=cost_lib.CallCost.from_steps({w: 0.3 for w in range(1, 12)}),
        drafter=cost_lib.CallCost.from_steps({1: 0.1}))
    result = specdecpp_head_sources.compare(logs, {0}, cost, None)
    assert result["SpecDec++ h=0.5"]["corpus"]["verification_rate"]["value"] == 0.5
    assert result["SpecDec++ h=0.5"]["target"]["verification_rate"]["value"] == 0.3
    # 10 tokens: 8 drafts at 0.1 s and 3 target calls at 0.3 s.
    assert result["SpecDec++ h=0.5"]["target"]["cpu_predicted_tokens_per_s"] == pytest.approx(
        10 / 1.7)
    with pytest.raises(ValueError, match="pick batches both cover"):
        specdecpp_head_sources.compare(logs, {0, 1}, cost, None)  # batch 1: corpus only

    # The job (benchmarks/configs/specdecpp_head_sources.gin), priced by a report's cost model.
    from benchmarks import main as bench_main  # noqa: PLC0415

    (tmp_path / "report.json").write_text(json.dumps({"cost_model": cost.to_json()}))
    assert bench_main.main([
        "--gin_file", "benchmarks/configs/specdecpp_head_sources.gin",
        f"--gin.LOGS={{'corpus': '{logs['corpus']}', 'target': '{tmp_path / 'b.jsonl'}'}}",
        "--gin.BATCHES=[0]", f"--gin.COST_REPORT='{tmp_path / 'report.json'}'",
        "--gin.DEVICE_STEPS=None", f"--gin.OUT_PATH='{tmp_path / 'sources.json'}'",
        f"--gin.MARKDOWN_PATH='{tmp_path / 'sources.md'}'"]) == 0
    assert json.loads((tmp_path / "sources.json").read_text()) == result
    assert "calibrated cost model" in (tmp_path / "sources.md").read_text()


def test_head_sources_job_runs_as_shipped(tmp_path):
    """benchmarks/configs/specdecpp_head_sources.gin as is: the shipped counts logs
    (plain or gzipped) on the 16 prompts both cover, priced by the shipped CPU
    report and the H200 steps; fixed K agrees between the logs."""
    from benchmarks import main as bench_main  # noqa: PLC0415

    assert bench_main.main([
        "--gin_file", "benchmarks/configs/specdecpp_head_sources.gin",
        f"--gin.OUT_PATH='{tmp_path / 'sources.json'}'",
        f"--gin.MARKDOWN_PATH='{tmp_path / 'sources.md'}'"]) == 0
    result = json.loads((tmp_path / "sources.json").read_text())
    assert set(result["SpecDec K=2"]) == {"corpus", "target"}
    assert set(result["SpecDec++ h=0.5"]) == {"corpus", "target"}
    for heads in result.values():
        for row in heads.values():
            assert row["cpu_predicted_tokens_per_s"] > 0
            assert row["device_predicted_tokens_per_s"] > 0


@pytest.mark.parametrize("gin_file, bindings, error, message", [
    ("specdecpp", ["bench_specdecpp.timed_prompts=50"], ValueError,
     r"timed_prompts must be in \[1, num_prompts = 40\]"),
    ("specdecpp", ["bench_specdecpp.thresholds=[0.5, 1.0]"], ValueError,
     r"thresholds must be a non-empty list of h in \(0, 1\)"),
    ("specdecpp", ["bench_specdecpp.ks=[0, 2]"], ValueError, "ks must be integer"),
    ("specdecpp", ["bench_specdecpp.target_widths=[3, 7]"], ValueError,
     r"must be >= 1 and end at K_max \+ 1 = 21"),
    ("specdecpp", ["HEAD='/nonexistent/head'"], FileNotFoundError, "holds no acceptance head"),
    ("specdecpp_heads", ["DATA=['/nonexistent/data']"], FileNotFoundError,
     "holds no acceptance data"),
    ("specdecpp_heads", ["DATA='/one/dir'"], ValueError, "data must be a non-empty list"),
    ("specdecpp_head_sources", ["LOGS=['corpus=x.jsonl']"], ValueError,
     "logs must map each head's name"),
    ("specdecpp_head_sources", ["BATCHES=[]"], ValueError, "batches must be a non-empty"),
    ("specdecpp_head_sources", ["COST_REPORT='/nonexistent.json'"], FileNotFoundError,
     "cost_report='/nonexistent.json' does not exist"),
    ("specdecpp_device", ["OUT_PATH='/nonexistent.json'"], FileNotFoundError,
     "out='/nonexistent.json' does not exist"),
])
def test_bad_benchmark_settings_are_refused_before_loading(monkeypatch, tmp_path, gin_file,
                                                           bindings, error, message):
    from benchmarks import main as bench_main  # noqa: PLC0415
    from specdec_jax.jobs import resolver  # noqa: PLC0415

    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    head = tmp_path / "head"
    head.mkdir()
    (head / "head.json").write_text("{}")
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    defaults = {"specdecpp": [f"HEAD='{head}'"],
                "specdecpp_heads": [f"DATA=['{data}']", f"HEADS=['{head}']"]}.get(gin_file, [])
    with pytest.raises(error, match=message):
        bench_main.main(["--gin_file", f"benchmarks/configs/{gin_file}.gin",
                        *(f"--gin.{b}" for b in [*defaults, *bindings])])


def test_a_bucketed_call_leaves_the_cache_as_a_switch_over_whole_caches_does():
    """``extend_bucketed`` writes only the fed window back after its switch
    (``interface.switch_writing_windows``): at every width its logits and cache
    equal, bit for bit, those of a ``lax.switch`` whose branches return the
    whole cache, and a narrow call leaves the entries after its window as
    they were."""
    from specdec_jax.decode.round import extend_bucketed
    from specdec_jax.models import DecoderConfig, DecoderOnlyLM

    model = DecoderOnlyLM(DecoderConfig(vocab_size=16, hidden_size=32, intermediate_size=64,
                                        num_layers=2, num_heads=4, num_kv_heads=2))
    params = model.init_params(jax.random.PRNGKey(3))
    cache = model.prefill(params, make_prompt([[3, 1, 4, 1, 5], [9, 2, 6]]),
                          model.init_cache(2, 16)).cache
    # Stale entries past each row's length: a narrow call must leave them.
    cache = cache.replace(keys=tuple(k + 7.0 for k in cache.keys))
    tokens = jnp.asarray([[2, 7, 1, 8], [2, 8, 1, 8]], jnp.int32)
    widths = (1, 2, 4)

    @jax.jit
    def whole_caches(needed):
        def run(width):
            def fn(cache):
                out = model.extend(params, tokens[:, :width], cache)
                return jnp.pad(out.logits, ((0, 0), (0, 4 - width), (0, 0))), out.cache
            return fn
        branch = jnp.sum(needed > jnp.asarray(widths)).astype(jnp.int32)
        return jax.lax.switch(branch, [run(w) for w in widths], cache)

    bucketed_fn = jax.jit(lambda needed: extend_bucketed(model, params, tokens, needed, cache,
                                                         widths))
    for needed in range(1, 5):
        logits, _, bucketed, width = bucketed_fn(jnp.int32(needed))
        assert int(width) == {1: 1, 2: 2, 3: 4, 4: 4}[needed]
        want_logits, want = whole_caches(jnp.int32(needed))
        np.testing.assert_array_equal(np.asarray(logits), np.asarray(want_logits))
        np.testing.assert_array_equal(np.asarray(bucketed.lengths), np.asarray(want.lengths))
        for ours, theirs in zip(bucketed.keys + bucketed.values, want.keys + want.values,
                                strict=True):
            np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
        after_B = np.asarray(cache.lengths) + int(width)
        for ours, before in zip(bucketed.keys, cache.keys, strict=True):
            for b, start in enumerate(after_B):
                np.testing.assert_array_equal(np.asarray(ours)[b, :, start:],
                                              np.asarray(before)[b, :, start:])
