"""Evaluation tasks: a corpus, how its examples become prompts, and its metric.

A task is data, not code paths: the sweep (``jobs/studies/sweep.py``) asks a task
for examples, turns each ``prompt`` into tokens, cuts each decoded output at
the task's stop strings, and hands the texts to the task's metric.

Metrics are corpus-level (BLEU is not a mean of sentence scores), so a metric
splits in two: ``score_examples`` turns outputs into per-example *items*
(a pass/fail, a ROUGE F1, a hypothesis/reference pair) and ``aggregate`` turns
any list of items into the corpus score. The bootstrap confidence interval
resamples items and re-aggregates (``metrics.bootstrap_ci``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Example:
    id: str  # stable across runs: the corpus's own id, or "<corpus>:<index>"
    prompt: str  # what the model is given
    reference: Any  # a reference text, or the HumanEval problem dict


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # "pass@1", "bleu", "rouge2"
    score_examples: Callable[[list[str], list[Example]], list]  # outputs -> items
    aggregate: Callable[[list], float]  # items -> corpus score (higher is better)


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    description: str
    source: str  # where the corpus comes from (package, version)
    licence: str
    metric: Metric
    # load(split, limit) -> examples of a fixed split ("train", "validation",
    # "test"); the order is fixed by a recorded seed, ``limit`` takes a prefix.
    load: Callable[[str, int | None], list[Example]]
    # The output is cut before the first of these (e.g. the end of a function).
    stop_strings: tuple[str, ...] = ()
    # Generation also stops in the loop at the end of a top-level code block
    # (``decode.round.EndOfBlockStop``), so no compute is spent past it.
    stop_at_block_end: bool = False

    def postprocess(self, text: str) -> str:
        """Cuts ``text`` at the first stop string (the stop string is dropped)."""
        cut = len(text)
        for stop in self.stop_strings:
            index = text.find(stop)
            if index != -1:
                cut = min(cut, index)
        return text[:cut]


# Filled when ``specdec_jax.data`` is imported (the package registers its built-in
# tasks there), and by ``register`` for a user's own tasks.
_TASKS: dict[str, Callable[[], Task]] = {}


def register(name: str, factory: Callable[[], Task]) -> None:
    """Registers a task factory (called lazily: no corpus is read at import)."""
    _TASKS[name] = factory


def get_task(name: str) -> Task:
    """The task called ``name``; an unknown name fails with the known ones."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(sorted(_TASKS))}.")
    return _TASKS[name]()

