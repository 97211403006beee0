"""The gin training job end to end on a tiny T5: fine-tuning from scratch and
from a t5x checkpoint, pre-training by span corruption, and its errors."""

import json

import jax
import numpy as np
import pytest

from specdec_jax.data import span_corruption
from specdec_jax.training import forward, recipes
from tests.t5x_format import write_t5x_checkpoint
from train import main as train_main

TINY = ["--gin_file", "configs/runs/finetune_t5.gin",
        "--gin.MODEL_SIZE='t5-tiny'",
        "--gin.run_training.vocab_sources=['libc-de']",
        "--gin.run_training.vocab_size=400", "--gin.run_training.extra_ids=10",
        "--gin.run_training.num_steps=3", "--gin.run_training.batch_size=4",
        "--gin.run_training.train_limit=16", "--gin.run_training.eval_examples=8",
        "--gin.run_training.input_length=96", "--gin.run_training.target_length=96",
        "--gin.run_training.warmup_steps=0", "--gin.run_training.progress=False"]

TINY_PRETRAINING = [
    "--gin_file", "configs/runs/pretrain_t5.gin",
    "--gin.MODEL_SIZE='t5-tiny'", "--gin.run_training.vocab_sources=['libc-de']",
    "--gin.run_training.pretraining_sources=['libc-de']",
    "--gin.run_training.vocab_size=400", "--gin.run_training.extra_ids=10",
    "--gin.run_training.num_steps=2", "--gin.run_training.batch_size=4",
    "--gin.run_training.input_length=32", "--gin.run_training.train_limit=16",
    "--gin.run_training.eval_examples=4", "--gin.run_training.progress=False"]


def vocab():
    return recipes.vocabulary(sources=["libc-de"], vocab_size=400, extra_ids=10)


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_finetune_job_writes_a_resumable_run(tmp_path):
    assert train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path}'"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["objective"] == "task" and summary["steps"] == 3
    assert summary["parameters"] == recipes.parameter_count(
        recipes.t5_model("t5-tiny", 410).init_params(jax.random.PRNGKey(0)))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3] and "eval/loss" in lines[-1]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    # Run again with more steps: it resumes from step 3, it does not restart.
    assert train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path}'",
                            "--gin.run_training.num_steps=4"]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["resumed_from"] == 3


@pytest.mark.long
def test_finetune_starts_from_a_t5x_checkpoint(tmp_path):
    model = recipes.t5_model("t5-tiny", vocab().vocab_size)
    params = model.init_params(jax.random.PRNGKey(7))
    write_t5x_checkpoint(tmp_path / "t5x" / "checkpoint_1000", params)
    run = tmp_path / "run"
    assert train_main.main([*TINY, f"--gin.WORKDIR='{run}'",
                            f"--gin.INIT_CHECKPOINT='{tmp_path / 't5x'}'"]) == 0
    # The first logged loss is the checkpoint's loss on the first batch.
    data, _ = recipes.task_dataset("translation_en_de", "train", vocab(), input_length=96,
                                   target_length=96, limit=16)
    expected, _ = forward.lm_loss(model, params, data.batch(0, 4, seed=0), None)
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert first["loss"] != pytest.approx(float(forward.lm_loss(
        model, model.init_params(jax.random.PRNGKey(0)), data.batch(0, 4, seed=0), None)[0]),
        rel=1e-3)  # and not the loss of the random init


def test_checkpoint_with_another_vocabulary_is_refused(tmp_path):
    other = recipes.t5_model("t5-tiny", 420)
    write_t5x_checkpoint(tmp_path / "t5x" / "checkpoint_5", other.init_params(
        jax.random.PRNGKey(0)))
    with pytest.raises(ValueError, match=r"vocab_size: checkpoint 420, this run 410\. The "
                                         r"vocabulary differs"):
        train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path / 'run'}'",
                         f"--gin.INIT_CHECKPOINT='{tmp_path / 't5x'}'"])


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_span_corruption_pretraining_job(tmp_path):
    assert train_main.main([*TINY_PRETRAINING, f"--gin.WORKDIR='{tmp_path}'"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["objective"] == "span_corruption"
    assert (summary["train_examples"], summary["eval_examples"]) == (16, 4)
    # targets are ~15% of each 32-token row plus sentinels and EOS
    assert 4 <= summary["tokens_per_epoch"] / 16 <= 14


@pytest.mark.long
def test_finetune_starts_from_our_own_pretraining_run(tmp_path):
    """Span corruption, then fine-tuning from that run's directory: the fine-tune's
    first loss is the pre-trained parameters' loss; another vocabulary is refused."""
    pre = tmp_path / "pre"
    assert train_main.main([*TINY_PRETRAINING, f"--gin.WORKDIR='{pre}'"]) == 0
    run = tmp_path / "run"
    assert train_main.main([*TINY, f"--gin.WORKDIR='{run}'",
                            f"--gin.INIT_CHECKPOINT='{pre}'"]) == 0
    model, pretrained, _, _ = recipes.load_run(pre)
    data, _ = recipes.task_dataset("translation_en_de", "train", vocab(), input_length=96,
                                   target_length=96, limit=16)
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    expected, _ = forward.lm_loss(model, pretrained, data.batch(0, 4, seed=0), None)
    assert first["loss"] == pytest.approx(float(expected), rel=1e-5)
    random_init = forward.lm_loss(model, model.init_params(jax.random.PRNGKey(0)),
                                  data.batch(0, 4, seed=0), None)[0]
    assert first["loss"] != pytest.approx(float(random_init), rel=1e-3)
    with pytest.raises(ValueError, match=r"was trained with the vocabulary .* fine-tune with "
                                         r"the vocabulary settings"):
        train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path / 'other'}'",
                         "--gin.run_training.vocab_size=420", f"--gin.INIT_CHECKPOINT='{pre}'"])


@pytest.mark.parametrize("binding, message", [
    ("--gin.run_training.objective='mlm'", "unknown objective 'mlm'"),
    ("--gin.MODEL_SIZE='t5-xxl'", "unknown T5 size 't5-xxl'"),
    ("--gin.run_training.optimizer='adam'", "unknown optimizer 'adam'"),
    ("--gin.run_training.batch_size=0", "batch size 0 is not divisible"),
])
def test_bad_training_configs_fail_early(tmp_path, binding, message):
    with pytest.raises(ValueError, match=message):
        train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path}'", binding])


def test_training_job_names_its_required_macro():
    with pytest.raises(ValueError, match="WORKDIR unset"):
        train_main.main(["--gin_file", "configs/runs/finetune_t5.gin"])
    with pytest.raises(SystemExit):
        train_main.main(["--gin_file", "configs/runs/finetune_t5.gin", "--gin.WORKDIR"])


def test_spans_in_the_pretraining_data_invert():
    data = recipes.span_corruption_dataset(vocab(), sources=["libc-de"], length=32, seed=0,
                                           max_rows=5)
    v = vocab()
    for i in range(5):
        inputs = data.inputs[i, :data.input_lengths[i]].tolist()
        targets = data.targets[i][data.weights[i] > 0].tolist()[:-1]  # without EOS
        row = span_corruption.uncorrupt(inputs, targets, vocab_size=v.vocab_size,
                                        num_sentinels=v.extra_ids)
        assert len(row) == 32
    assert np.all(data.weights.sum(1) >= 2)


def test_load_run_names_a_missing_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no finished training run"):
        recipes.load_run(tmp_path)


@pytest.mark.long
def test_t5_pair_members_train_on_first_use_and_feed_the_study(tmp_path, monkeypatch):
    """A study names pair members; absent ones are trained (here the 't5-test'
    recipe, seconds) into the cache, then the sweep runs on them. The distilled
    member comes from the distillation job (configs/runs/distill_t5.gin's job),
    which reports block efficiency before and after."""
    from eval import main as eval_main  # noqa: PLC0415
    from specdec_jax.jobs.studies import t5_quality as pair_job  # noqa: PLC0415
    from specdec_jax.training import t5_pair as pair  # noqa: PLC0415

    monkeypatch.setattr(pair, "member_dir",
                        lambda p, r, t: tmp_path / "cache" / p / t / r)
    with pytest.raises(ValueError, match="is not a member of a T5 pair"):
        pair.parse_member("t5-cpu-huge:translation_en_de")
    args = ["--gin_file", "configs/runs/sweep.gin",
            "--gin.TASK='translation_en_de'", f"--gin.OUT_DIR='{tmp_path}'",
            "--gin.STEM='t5'", "--gin.TARGET='t5-test-large:translation_en_de'",
            "--gin.DRAFTER='t5-test-small-distilled:translation_en_de'",
            "--gin.run_study.methods={'specdecode': []}", "--gin.TEMPERATURES=[1.0]",
            "--gin.run_study.num_examples=2", "--gin.run_study.max_new_tokens=4",
            "--gin.run_study.batch_size=2", "--gin.run_study.wallclock_examples=0",
            "--gin.run_study.calibration_context=8", "--gin.run_study.calibration_widths=[1, 2]",
            "--gin.run_study.progress=False"]
    assert eval_main.main(args) == 0
    for role in pair.ROLES:
        assert (tmp_path / "cache" / "t5-test" / "translation_en_de" / role /
                "summary.json").exists()
    data = json.loads((tmp_path / "t5.json").read_text())
    assert {r["method"] for r in data["records"]} == {"target", "drafter", "specdecode"}
    distilled = tmp_path / "cache" / "t5-test" / "translation_en_de" / "small-distilled"
    summary = json.loads((distilled / "summary.json").read_text())
    for when in ("before", "after"):
        low, high = summary[when]["block_efficiency_ci"]
        assert 1.0 <= low <= summary[when]["block_efficiency"] <= high <= 6.0
    assert "eval/tvd" in summary["final"]
    _, params, _, _ = recipes.load_run(distilled)  # loads like any finished run
    small = json.loads((distilled.parent / "small" / "summary.json").read_text())
    assert recipes.parameter_count(params) == small["parameters"]

    # The pair's report scores every (already trained) member on held-out inputs.
    out = tmp_path / "report" / "pair.md"
    assert pair_job.main(["t5-test", "translation_en_de", "--report", str(out),
                      "--examples", "3"]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())
    assert list(rows) == list(pair.ROLES)
    for row in rows.values():
        quality = row["quality"]
        assert quality["metric"] == "bleu" and quality["num_examples"] == 3
        assert 0.0 <= quality["low"] <= quality["score"] <= quality["high"] <= 100.0
    for role in ("small", "small-distilled"):  # paired against the large model
        d = rows[role]["large_minus_this"]
        assert d["low"] <= d["difference"] <= d["high"]
        assert d["clearly_ahead"] == (d["low"] > 0)
        assert d["difference"] == pytest.approx(rows["large"]["quality"]["score"]
                                                - rows[role]["quality"]["score"])
    text = out.read_text()
    assert "Large minus small:" in text and "Large minus small-distilled:" in text
    assert "t5-test-small-distilled:translation_en_de" in text
    assert f"{summary['before']['block_efficiency']:.3f}" in text


@pytest.mark.long
def test_a_pretrained_pair_member_fine_tunes_from_its_span_corruption_run(tmp_path,
                                                                        monkeypatch):
    import dataclasses  # noqa: PLC0415

    from specdec_jax.training import t5_pair as pair  # noqa: PLC0415

    monkeypatch.setattr(pair, "member_dir", lambda p, r, t: tmp_path / p / t / r)
    monkeypatch.setitem(pair.PAIRS, "t5-test-pretrained", dataclasses.replace(
        pair.PAIRS["t5-test"], pretraining_steps={"translation_en_de": {"small": 2}},
        pretraining_sources={"translation_en_de": ["libc-de"]}))
    small = pair.ensure_member("t5-test-pretrained-small:translation_en_de", progress=False)
    pre = small.parent / "small-span-corruption"
    assert json.loads((pre / "summary.json").read_text())["objective"] == "span_corruption"
    summary = json.loads((small / "summary.json").read_text())
    assert (summary["objective"], summary["init_checkpoint"]) == ("task", str(pre))
    large = pair.ensure_member("t5-test-pretrained-large:translation_en_de", progress=False)
    assert json.loads((large / "summary.json").read_text())["init_checkpoint"] == ""
    assert not (large.parent / "large-span-corruption").exists()
    # The shipped pre-trained recipe covers translation only, and says so.
    with pytest.raises(ValueError, match="pair t5-cpu-pretrained has no recipe for task "
                                         "'summarisation_debian'"):
        pair.ensure_member("t5-cpu-pretrained-small:summarisation_debian")


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_finetune_on_length_buckets_with_an_auxiliary_corpus(tmp_path):
    assert train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path}'",
                            "--gin.run_training.length_buckets=[(32, 32), (96, 96)]",
                            "--gin.run_training.auxiliary={'ding-phrases': 0.25}"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    mixture = summary["mixture"]
    share = lambda prefix: sum(m["rate"] for m in mixture  # noqa: E731
                               if m["name"].startswith(prefix))
    assert share("ding-phrases[") == pytest.approx(0.25)
    assert share("translation_en_de[") == pytest.approx(0.75)
    assert "ding-phrases[32x32]" in {m["name"] for m in mixture}  # short phrases, short rows
    assert summary["task_examples"] + summary["train_dropped"] == 16
    assert summary["auxiliary"] == {"ding-phrases": 0.25}
    # passes over the task's own examples only
    assert summary["epochs"] == pytest.approx(3 * 4 * 0.75 / summary["task_examples"])
    assert summary["length_buckets"] == [[32, 32], [96, 96]]
    # Another mixture is another run: its checkpoint is not resumed by a plain run.
    with pytest.raises(ValueError, match="auxiliary"):
        train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path}'", "--gin.run_training.num_steps=4"])


@pytest.mark.parametrize("binding, message", [
    ("--gin.run_training.auxiliary={'ding-phrases': 1.0}", r"must be in \(0, 1\)"),
    ("--gin.run_training.auxiliary={'wmt': 0.5}", "does not serve task"),
    ("--gin.run_training.length_buckets=[(128, 32)]", "exceed input_length 96"),
])
def test_bad_mixtures_name_the_fix(tmp_path, binding, message):
    with pytest.raises(ValueError, match=message):
        train_main.main([*TINY, f"--gin.WORKDIR='{tmp_path}'", binding])


def test_span_corruption_refuses_length_buckets(tmp_path):
    with pytest.raises(ValueError, match="objective='task' only"):
        recipes.run_training(workdir=str(tmp_path), model_size="t5-tiny",
                             objective="span_corruption", vocab_sources=["libc-de"],
                             vocab_size=400, extra_ids=10, length_buckets=[(32, 32)])
