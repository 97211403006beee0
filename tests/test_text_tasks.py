"""Translation and summarisation tasks over real Debian corpora (text_tasks, corpora).

The first run fetches two .debs (~41 MB) and the package-description list into the cache
(seconds); later runs read the cache only.
"""

import random
import shutil

import pytest

from specdec_jax.checkpoints import fetch
from specdec_jax.data import corpora, metrics, tasks, text_tasks

TASK_NAMES = (text_tasks.TRANSLATION_TASK, text_tasks.SUMMARISATION_TASK)
# (id, prompt, reference) that must stay where they are: ids are stable.
KNOWN = {
    text_tasks.TRANSLATION_TASK: [
        ("trans-de-en:3653", "translate English to German: May contain traces of nuts.",
         "Kann Spuren von Nüssen enthalten."),
        ("debian-handbook:778", "translate English to German: Installing the apache2 package "
         "is all that is needed.", "Die Installation des Pakets apache2 genügt."),
    ],
    text_tasks.SUMMARISATION_TASK: [
        ("debian-descriptions:0", 'summarize: 0 A.D. (pronounced "zero ey-dee") is a free',
         "Real-time strategy game of ancient warfare"),
    ],
}


@pytest.fixture(scope="module")
def splits():
    """{task name: {split: examples}}, loaded through the public Task interface."""
    out = {}
    for name in TASK_NAMES:
        task = text_tasks.FACTORIES[name]()
        out[name] = {split: task.load(split, None) for split in text_tasks.SPLITS}
    return out


def test_record_counts_match_the_pins():
    assert len(corpora.handbook_pairs()) == corpora.HANDBOOK_RECORDS
    assert len(corpora.ding_pairs()) == corpora.DING_RECORDS
    assert len(corpora.description_records()) == corpora.DESCRIPTION_RECORDS
    for corpus in corpora.CORPORA.values():
        assert corpus.source and corpus.licence and corpus.records > 0


@pytest.mark.parametrize("name", TASK_NAMES)
def test_splits_have_the_recorded_sizes_and_are_disjoint(splits, name):
    sizes = {split: len(examples) for split, examples in splits[name].items()}
    assert sizes == text_tasks.SPLIT_SIZES[name]
    ids = [set(e.id for e in examples) for examples in splits[name].values()]
    assert sum(map(len, ids)) == sum(sizes.values())  # ids unique within and across splits
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_splits_are_deterministic(splits, name):
    text_tasks._splits.cache_clear()  # rebuild from the corpus, not from the memo
    again = text_tasks.FACTORIES[name]().load("test", None)
    assert [e.id for e in again] == [e.id for e in splits[name]["test"]]
    ordered = sorted(splits[name]["test"], key=text_tasks._shuffle_key)
    assert [e.id for e in ordered] == [e.id for e in splits[name]["test"]]
    assert text_tasks.load_split(name, "test", 10) == splits[name]["test"][:10]


@pytest.mark.parametrize("name", TASK_NAMES)
def test_prompts_and_references_are_non_empty_lines(splits, name):
    prefix = {text_tasks.TRANSLATION_TASK: text_tasks.TRANSLATION_PREFIX,
              text_tasks.SUMMARISATION_TASK: text_tasks.SUMMARISATION_PREFIX}[name]
    for examples in splits[name].values():
        for e in examples:
            assert e.prompt.startswith(prefix) and e.prompt[len(prefix):].strip()
            assert isinstance(e.reference, str) and e.reference.strip()
            assert "\n" not in e.prompt and "\n" not in e.reference


@pytest.mark.parametrize("name", TASK_NAMES)
def test_known_pairs_appear(splits, name):
    by_id = {e.id: e for examples in splits[name].values() for e in examples}
    for example_id, prompt_start, reference_start in KNOWN[name]:
        assert by_id[example_id].prompt.startswith(prompt_start)
        assert by_id[example_id].reference.startswith(reference_start)


def test_task_metadata():
    translation = text_tasks.translation_en_de()
    assert translation.metric is metrics.BLEU
    assert "debian-handbook 11.20220922" in translation.source
    assert "trans-de-en 1.9-6" in translation.source
    assert "CC-BY-SA" in translation.licence and "GPL-2+" in translation.licence
    summary = text_tasks.summarisation()
    assert summary.name == "summarisation_debian" and summary.metric is metrics.ROUGE2
    assert "bookworm" in summary.source
    assert summary.postprocess("a synopsis\nmore text") == "a synopsis"


def test_unknown_split_and_bad_limit_fail_with_the_allowed_values():
    task = text_tasks.translation_en_de()
    with pytest.raises(ValueError, match="unknown split 'dev'; choose one of train, "
                                         "validation, test"):
        task.load("dev", None)
    with pytest.raises(ValueError, match=r"limit must be in \[1, 1000\]"):
        task.load("test", 1001)
    with pytest.raises(ValueError, match=r"limit must be in \[1, 1000\]"):
        task.load("validation", 0)


def test_deb_hash_mismatch_names_file_hashes_and_fix(tmp_path, monkeypatch):
    pin = corpora.TRANS_DE_EN
    corpora.fetch_deb(pin)  # the real .deb, in the real cache
    real = corpora.data_dir() / corpora.DEB_SUBDIR / pin.filename
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    copy = corpora.data_dir() / corpora.DEB_SUBDIR / pin.filename
    copy.parent.mkdir(parents=True)
    shutil.copyfile(real, copy)
    with open(copy, "ab") as f:
        f.write(b"corrupt")
    actual = fetch.sha256_file(copy)
    with pytest.raises(ValueError) as err:
        corpora.fetch_deb(pin)
    message = str(err.value)
    assert str(copy) in message and pin.sha256 in message and actual in message
    assert "Delete" in message and "update the pin" in message
    assert not (corpora.data_dir() / f"{pin.package}-{pin.version}").exists()


def test_snapshot_hash_mismatch_is_reported(tmp_path, monkeypatch):
    corpora.description_records()
    real = corpora.data_dir() / corpora.DESCRIPTIONS_SNAPSHOT["file"]
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    copy = corpora.data_dir() / corpora.DESCRIPTIONS_SNAPSHOT["file"]
    copy.parent.mkdir(parents=True)
    shutil.copyfile(real, copy)
    with open(copy, "ab") as f:
        f.write(b"{}\n")
    with pytest.raises(ValueError, match="does not match the pinned "
                       + corpora.DESCRIPTIONS_SNAPSHOT["sha256"]):
        corpora.description_records()


def _score(metric, outputs, examples):
    return metric.aggregate(metric.score_examples(outputs, examples))


def _shuffled(texts):
    texts = list(texts)
    random.Random(0).shuffle(texts)
    return texts


@pytest.mark.parametrize("task, metric, module", [
    (text_tasks.TRANSLATION_TASK, metrics.BLEU, "sacrebleu"),
    (text_tasks.SUMMARISATION_TASK, metrics.ROUGE2, "rouge_score")])
def test_metric_of_references_is_100_and_of_shuffled_ones_low(splits, task, metric, module):
    pytest.importorskip(module)
    examples = splits[task]["test"]
    references = [e.reference for e in examples]
    assert _score(metric, references, examples) == pytest.approx(100.0)
    assert _score(metric, _shuffled(references), examples) < 5.0


def test_iterate_gives_plain_dicts_of_a_split(splits):
    rows = list(text_tasks.iterate(text_tasks.SUMMARISATION_TASK, "validation", limit=3))
    examples = splits[text_tasks.SUMMARISATION_TASK]["validation"][:3]
    assert rows == [{"id": e.id, "inputs": e.prompt, "targets": e.reference} for e in examples]


def test_register_all_registers_both_factories(monkeypatch):
    monkeypatch.setattr(tasks, "_TASKS", {})
    text_tasks.register_all()
    assert set(tasks._TASKS) == set(TASK_NAMES)
    assert {tasks._TASKS[name]().name for name in TASK_NAMES} == set(TASK_NAMES)


def test_ratio_ci_is_a_ratio_of_totals():
    """Tokens per target call over prompts: total / total (2.5 here), not the
    mean of per-prompt ratios (2.0); every resample lies between the rows'
    own ratios; an empty denominator gives 0, not a ZeroDivisionError."""
    rows = [{"tokens": 1, "calls": 1}, {"tokens": 9, "calls": 3}]
    score, low, high = metrics.ratio_ci(rows, "tokens", "calls")
    assert score == 2.5
    assert 1.0 <= low <= score <= high <= 3.0 and low < high
    assert metrics.ratio_ci([{"tokens": 0, "calls": 0}], "tokens", "calls")[0] == 0.0


def test_paired_difference_sees_what_overlapping_intervals_hide():
    """System a beats b by exactly 1 point on every example of a wide spread:
    their own intervals overlap, the paired interval is [1, 1]. Two systems
    that differ only by noise get a paired interval around 0."""
    spread = [float(x) for x in range(0, 100, 5)]
    better = [x + 1.0 for x in spread]
    _, low_a, high_a = metrics.bootstrap_ci(better, metrics.ROUGE2.aggregate)
    _, low_b, high_b = metrics.bootstrap_ci(spread, metrics.ROUGE2.aggregate)
    assert low_a < high_b and low_b < high_a  # overlapping intervals
    diff, low, high = metrics.paired_difference_ci(better, spread, metrics.ROUGE2.aggregate)
    assert (diff, low, high) == pytest.approx((1.0, 1.0, 1.0))
    noise = [x + (3.0 if i % 2 else -3.0) for i, x in enumerate(spread)]
    diff, low, high = metrics.paired_difference_ci(noise, spread, metrics.ROUGE2.aggregate)
    assert low < 0.0 < high
    with pytest.raises(ValueError, match="same examples on both sides"):
        metrics.paired_difference_ci(better, spread[:-1], metrics.ROUGE2.aggregate)


@pytest.mark.long  # scans the whole Ding corpus: CI runs it with -m long
def test_ding_phrases_are_training_only_words_and_phrases(splits):
    phrases = corpora.ding_phrase_pairs()
    assert len(phrases) == corpora.DING_PHRASE_RECORDS
    sentences = {en for en, _ in corpora.ding_pairs()}
    assert not sentences & {en for en, _ in phrases}
    assert ("the Romance languages", "die romanischen Sprachen") in phrases
    assert not any(corpora._DING_TEMPLATE.search(en + " " + de) for en, de in phrases)
    examples = text_tasks.auxiliary_examples("ding-phrases")
    held_out = {e.prompt for split in ("validation", "test")
                for e in splits[text_tasks.TRANSLATION_TASK][split]}
    assert examples and not held_out & {e.prompt for e in examples}
    assert all(e.prompt.startswith(text_tasks.TRANSLATION_PREFIX) for e in examples)
    with pytest.raises(ValueError, match="unknown auxiliary corpus 'wmt'"):
        text_tasks.auxiliary_examples("wmt")


def test_ui_messages_are_clean_training_only_message_pairs(splits):
    messages = corpora.ui_message_pairs()
    assert len(messages) == corpora.UI_MESSAGE_RECORDS
    # LibreOffice's "STR_MACNAME\x04~Macro name" -> "~Makroname": context and accelerator go.
    assert ("Macro name", "Makroname") in messages
    assert ("Page background", "Seitenhintergrund") in messages
    assert ("can't write superblock", "der Superblock kann nicht geschrieben werden") in messages
    assert not any(corpora._MESSAGE_CODE.search(en + de) or corpora._ACCELERATOR.search(en + de)
                   or "\x04" in en or en == de for en, de in messages)
    assert len({en for en, _ in messages}) == len(messages)
    examples = text_tasks.auxiliary_examples("ui-messages")
    held_out = {e.prompt for split in ("validation", "test")
                for e in splits[text_tasks.TRANSLATION_TASK][split]}
    assert examples and not held_out & {e.prompt for e in examples}
