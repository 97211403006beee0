"""The command line rejects bad drafting specs before loading any weights."""

import pytest

from specdec_jax import cli


@pytest.mark.parametrize("argv, message", [
    (["--draft", "qwen2.5-coder-0.5b+mag"], "pass --k-matrix"),
    (["--draft", "nope+mag", "--k-matrix", "[[2,10],[0,10]]"], "unknown drafter 'nope'"),
    (["--draft", "mag+qwen2.5-coder-0.5b", "--k-matrix", "[[2,10],[0,10]]"], "list it last"),
    (["--draft", "qwen2.5-coder-0.5b+mag", "--k-matrix", "[[2,10],[3,10]]"],
     "upper-triangular"),
    (["--draft", "qwen2.5-coder-0.5b+mag", "--k-matrix", "[[2,-1],[0,10]]"], "negative"),
    (["--draft", "mag", "--lenience", "0.5"], "lenience must be >= 1"),
])
def test_bad_draft_specs_exit_with_a_named_error(argv, message, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("weights were loaded before the spec was checked")

    monkeypatch.setattr("specdec_jax.checkpoints.load.load_model", no_loading)
    assert cli.main(["generate", *argv]) == 2
    assert message in capsys.readouterr().err
