"""Pieces several benchmarks share: random prompts, batch-1 wall clock timed
interleaved, report files (plain or gzip) and the argument checks every job
runs before it loads a model."""

from __future__ import annotations

from collections.abc import Collection, Iterable

import jax
import numpy as np

from specdec_jax import api
from specdec_jax.data import humaneval
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import jsonio, timing
from specdec_jax.runtime.progress import tqdm


def random_prompts(vocab_size: int, batch: int, length: int, count: int, seed: int = 0):
    """``count`` prompts of ``batch`` rows of ``length`` random token ids (a
    step's cost depends on shapes, not on which tokens)."""
    rng = np.random.default_rng(seed)
    return [make_prompt(rng.integers(0, vocab_size, (batch, length)).tolist())
            for _ in range(count)]


def wallclock(fns, params, prompts, width, seed, temperature):
    """Per-prompt seconds per token at batch 1, prefill included (what a user
    waits), for every labelled generate function. The functions are timed
    interleaved, prompt by prompt in a rotating order, so a machine that
    drifts in speed over the run biases no configuration against another.

    Returns, per label, ``seconds_per_token``, ``seconds`` and ``tokens`` (per
    prompt) and ``round_s`` (total seconds over total target calls)."""
    sp = api.sampling_params(temperature=temperature)
    example = make_prompt([prompts[0]], pad_to=width)
    compiled = {label: timing.Compiled(fn, *params, example, jax.random.PRNGKey(0), sp)
                for label, fn in tqdm(fns.items(), desc="compile (batch 1)")}
    labels = list(fns)
    per_token = {label: [] for label in labels}
    per_prompt = {label: [] for label in labels}
    tokens = {label: [] for label in labels}
    calls = dict.fromkeys(labels, 0)
    for i, p in enumerate(tqdm(prompts, desc="wall clock")):
        prompt, key = make_prompt([p], pad_to=width), jax.random.PRNGKey(1000 * seed + i)
        shift = i % len(labels)
        for label in labels[shift:] + labels[:shift]:
            timed = compiled[label].time(*params, prompt, key, sp)
            length = int(timed.output.lengths[0])
            per_token[label].append(timed.median_s / length)
            per_prompt[label].append(timed.median_s)
            tokens[label].append(length)
            calls[label] += int(timed.output.stats.target_calls[0])
    return {label: {"seconds_per_token": per_token[label], "seconds": per_prompt[label],
                    "tokens": tokens[label],
                    "round_s": sum(per_prompt[label]) / max(calls[label], 1)}
            for label in labels}


# --- report files ----------------------------------------------------------------------------

def read_report(path: str) -> dict:
    """A stored benchmark report, plain JSON or gzip-compressed (``.gz``)."""
    return jsonio.read_json(path)


write_report = timing.write_report  # plain or .gz by suffix, after every section


# --- argument checks (before any model is loaded) --------------------------------------------

def check_at_least(minimum: int, **values) -> None:
    """Every value (an int, or a collection of ints) is >= ``minimum``."""
    for name, value in values.items():
        items = list(value) if isinstance(value, Iterable) else [value]
        if not items:
            raise ValueError(f"{name} is empty; give at least one value.")
        bad = [v for v in items if isinstance(v, bool) or not isinstance(v, int) or v < minimum]
        if bad:
            raise ValueError(f"{name} must be integer(s) >= {minimum}; got {value!r}.")


def check_choices(name: str, values, choices: Collection, *, allow_empty: bool = False) -> None:
    """Every one of ``values`` is one of ``choices``."""
    values = [values] if isinstance(values, str) else list(values)
    if not values and not allow_empty:
        raise ValueError(f"{name} is empty; choose from {', '.join(map(repr, choices))}.")
    unknown = [v for v in values if v not in choices]
    if unknown:
        raise ValueError(f"{name} has {unknown!r}; choose from "
                         f"{', '.join(map(repr, choices))}.")


def check_temperatures(name: str, values) -> None:
    values = [values] if isinstance(values, (int, float)) else list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
                         for v in values):
        raise ValueError(f"{name} must be one or more numbers >= 0; got {values!r}.")


def check_humaneval_prompts(**counts) -> None:
    """Each count of HumanEval prompts is within the benchmark's 164 problems."""
    for name, count in counts.items():
        if count > humaneval.NUM_PROBLEMS:
            raise ValueError(f"HumanEval has {humaneval.NUM_PROBLEMS} prompts; lower {name} "
                             f"(got {count}).")


def humaneval_prompts(encode, count: int) -> list[list[int]]:
    """The first ``count`` HumanEval prompts as token ids."""
    return [encode(text) for text in humaneval.load_prompts(count)]
