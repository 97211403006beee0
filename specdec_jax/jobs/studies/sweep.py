"""Quality-vs-latency sweeps of every method on one task (SpecCascade §6).

A sweep is a list of *points* (method, alpha, gamma, temperature). Each point
generates the task's examples in batches, decodes and cuts the outputs at the
task's stop strings, scores them (quality with a 95% bootstrap interval), and
keeps the per-example counters of ``GenerationStats``. Latency comes two ways
(``cost.py``): the calibrated cost model prices every point's counts, and a
wall-clock phase times a subset at batch 1, interleaving the points example by
example so drift hits every method alike. Relative latency is over the
autoregressive target (method ``target``), which every sweep runs.

The JSON file is rewritten after every point: a killed sweep resumes where it
stopped, and refuses to resume a file whose settings differ.

Methods: ``drafter`` and ``target`` (autoregressive), every target function of
``decode.methods`` (a chain round each), the baselines ``oracle``,
``token-cascade`` and ``bild-original`` (``decode.cascade_baselines``), and
``seq-cascade``, which is derived from the drafter's and the target's outputs
(the sequence-level cascade runs exactly those two generations).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import api, verify
from specdec_jax.data import metrics
from specdec_jax.data.tasks import Example, Task
from specdec_jax.decode import cost as cost_lib
from specdec_jax.decode import methods as method_table
from specdec_jax.decode.cascade_baselines import MAX_CONSECUTIVE_DRAFTS, sequence_defers
from specdec_jax.decode.cost import CostModel
from specdec_jax.decode.tree import check_greedy_temperature
from specdec_jax.jobs.resolver import ModelPair
from specdec_jax.models.interface import make_prompt, supports_trees
from specdec_jax.runtime import distributed, jsonio, resume, sharding, timing
from specdec_jax.runtime.progress import tqdm

AUTOREGRESSIVE = ("drafter", "target")
# Derived from the drafter's and the target's runs; recomputed on every pass.
# "seq-cascade" scores q(response), which shrinks with length (long answers
# always defer unless alpha is near 1); "seq-cascade-norm" its per-token
# geometric mean (the length-normalised option of the sequence-level cascade,
# docs/algorithms.md, 'Cascade baselines outside the round').
DERIVED = ("seq-cascade", "seq-cascade-norm")
NO_ALPHA = ("drafter", "target", "specdecode")
SEQ_CASCADE_RANGE = (0.0, 1.0)
PROMPT_WIDTH_MULTIPLE = 16  # pad prompts to a multiple: one compiled width per sweep
DEFAULT_VERIFIER = "token"


@dataclasses.dataclass(frozen=True)
class Point:
    method: str
    alpha: float | None
    gamma: int | None  # None for the autoregressive runs, seq-cascade and trees
    temperature: float
    # A token tree drafted per round instead of a chain (``decode.tree.TreeSpec``);
    # None: a chain of ``gamma`` drafts.
    tree: str | None = None
    verifier: str = DEFAULT_VERIFIER  # token, block; for trees, a tree verifier

    @property
    def key(self) -> str:
        # The chain's key at the defaults, so sweeps stored before trees resume.
        key = f"{self.method}|alpha={self.alpha}|gamma={self.gamma}|T={self.temperature}"
        if self.tree is not None:
            key += f"|tree={self.tree}"
        if self.verifier != DEFAULT_VERIFIER:
            key += f"|verifier={self.verifier}"
        return key


def method_range(method: str) -> tuple[float, float]:
    """The alpha range a method's errors quote (``alpha_in_range`` decides)."""
    if method in DERIVED:
        return SEQ_CASCADE_RANGE
    if method in AUTOREGRESSIVE or method == method_table.AUTOREGRESSIVE:
        raise ValueError(f"method {method!r} takes no alpha.")
    try:
        return method_table.get_method(method).alpha_range
    except ValueError:
        raise ValueError(f"unknown method {method!r}; choose one of "
                         f"{', '.join(all_methods())}.") from None


def alpha_in_range(method: str, alpha: float) -> bool:
    """The methods' own validation (``decode.methods``; Lossy's range is open at
    1), plus the derived sequence cascades' closed [0, 1]."""
    if method in DERIVED:
        low, high = SEQ_CASCADE_RANGE
        return low <= alpha <= high
    try:
        method_table.get_method(method).check_alpha(alpha)
    except ValueError:
        return False
    return True


def all_methods() -> tuple[str, ...]:
    return (AUTOREGRESSIVE + method_table.METHOD_NAMES[1:] + DERIVED)


def drafts_block(method: str) -> bool:
    """Whether a grid method's rounds verify a drafted block (a chain method:
    it takes a verifier and may draft trees)."""
    entry = method_table.METHODS.get(method)
    return entry is not None and entry.verifies_block


def fixed_gamma(method: str) -> int | None:
    """The draft length a cascade baseline fixes, not gamma (the oracle drafts
    none, the draft-until baselines up to their cap: App. E.1), or None."""
    kind = method_table.METHODS[method].kind if method in method_table.METHODS else None
    return {method_table.ORACLE: 0, method_table.DRAFT_UNTIL: MAX_CONSECUTIVE_DRAFTS}.get(kind)


def plan_points(*, methods: dict[str, Sequence[float]], gammas: Sequence[int],
                temperatures: Sequence[float], trees: Sequence[str] = (),
                verifier: str = DEFAULT_VERIFIER, where: str = "trees") -> list[Point]:
    """Every point of the grid, ``target`` and ``drafter`` first (the rest is
    priced relative to the target; seq-cascade is derived from both).

    ``methods`` maps a method to its alpha grid (ignored for ``drafter``,
    ``target``, ``specdecode``). An alpha outside a method's range is an error.
    ``trees``: token trees (``'3,2,1,1'``, ``'dynamic:5,2,3'``: the CLI's
    ``--tree``) each method with a target function also drafts, beside its
    chains of ``gammas`` drafts (``gammas`` empty: trees only). ``verifier``
    verifies every speculative point: ``token`` or ``block`` (on trees their
    tree forms, recursive rejection sampling and traversal verification), or a
    tree verifier when every point is a tree. ``where`` names the trees'
    argument in errors (``run_study.trees``).
    """
    trees = _check_trees(trees, methods, verifier, where)
    if any(g < 1 for g in gammas) or not (gammas or trees):
        raise ValueError(f"gammas must be a list of integers >= 1, got {gammas} (empty only "
                         "with trees).")
    if gammas and verifier not in verify.VERIFIERS:
        raise ValueError(f"verifier {verifier!r} verifies token trees only, and the grid has "
                         f"chains (gammas {list(gammas)}); use 'token' or 'block' (their tree "
                         "forms verify the trees), or draw trees only.")
    for temperature in temperatures:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}.")
        if trees:
            check_greedy_temperature(verifier, temperature, where=f"{where}: verifier")
    points = []
    for temperature in temperatures:
        points += [Point(m, None, None, temperature) for m in AUTOREGRESSIVE]
        for method, alphas in methods.items():
            if method in AUTOREGRESSIVE:
                continue
            low, high = method_range(method)
            grid = [None] if method in NO_ALPHA else list(alphas)
            if not grid:
                raise ValueError(f"method {method!r} needs at least one alpha in "
                                 f"[{low}, {high}].")
            bad = [a for a in grid if a is not None and not alpha_in_range(method, a)]
            if bad:
                raise ValueError(f"alpha grid of {method!r} has {bad} outside [{low}, {high}], "
                                 "the method's range.")
            method_gammas = [None] if method in DERIVED else \
                [fixed_gamma(method)] if fixed_gamma(method) is not None else list(gammas)
            for gamma in method_gammas:
                points += [Point(method, None if a is None else float(a), gamma, temperature,
                                 verifier=verifier if drafts_block(method)
                                 else DEFAULT_VERIFIER)
                           for a in grid]
            if drafts_block(method):
                points += [Point(method, None if a is None else float(a), None, temperature,
                                 tree=tree, verifier=verifier)
                           for tree in trees for a in grid]
    seen, unique = set(), []
    for point in points:
        if point.key not in seen:
            seen.add(point.key)
            unique.append(point)
    return unique


def _check_trees(trees: Sequence[str], methods, verifier: str, where: str) -> list[str]:
    """The tree specs, checked before any model loads (``api.decoder_spec``)
    against every method of the grid that drafts them; a string alone is one
    tree, not a list of characters."""
    trees = [trees] if isinstance(trees, str) else list(trees or ())
    drafting = [m for m in methods if drafts_block(m)]
    if trees and not drafting:
        raise ValueError(f"{where} = {trees}: none of the methods {list(methods)} drafts a "
                         "tree (the speculative methods with a target function do); drop the "
                         "trees or add one, e.g. 'specdecode'.")
    names = api.ArgumentNames(tree=where, verifier=f"{where}: verifier")
    for tree in trees:
        for method in drafting:
            api.decoder_spec(method, drafter=api.DrafterFacts(), tree=tree, verifier=verifier,
                             names=names)
    return [str(tree).replace(" ", "") for tree in trees]


def check_tree_models(pair: ModelPair, points: Sequence[Point], where: str = "trees") -> None:
    """Token trees need a target and a drafter that score trees (decoder-only
    models; checked once the pair is loaded)."""
    if not any(p.tree is not None for p in points):
        return
    for role, model in (("target", pair.target), ("drafter", pair.drafter)):
        if not supports_trees(model):
            raise ValueError(f"{where}: the {role} {type(model).__name__} cannot score token "
                             "trees (score_tree / commit_path: decoder-only models); drop the "
                             "trees or pick a decoder-only pair.")


def _structure(point: Point, max_new_tokens: int) -> tuple:
    """What a point's compiled program depends on (alpha and T are traced)."""
    return point.method, point.gamma, max_new_tokens, point.tree, point.verifier


def _generate_fn(pair: ModelPair, point: Point, max_new_tokens: int,
                 cache: dict | None = None):
    """The jitted generate function of a point's structure. Alpha and the
    temperature are traced, so points that differ only in them share one
    function (and its compilations) through ``cache``."""
    structure = _structure(point, max_new_tokens)
    if cache is not None and structure in cache:
        return cache[structure]
    fn = _build_generate_fn(pair, point, max_new_tokens)
    if cache is not None:
        cache[structure] = fn
    return fn


def _build_generate_fn(pair: ModelPair, point: Point, max_new_tokens: int):
    if point.method in AUTOREGRESSIVE:
        model = pair.target if point.method == "target" else pair.drafter
        fn = distributed.in_step(api.make_generate_fn(
            target=model, method="autoregressive", max_new_tokens=max_new_tokens,
            eos_ids=pair.eos_ids, stop_rule=pair.stop_rule))
        params = pair.target_params if point.method == "target" else pair.drafter_params
        return lambda prompt, key, sp: fn(params, None, prompt, key, sp)
    # in_step: across processes, every new program starts on all of them together.
    fn = distributed.in_step(api.make_generate_fn(
        target=pair.target, drafter=pair.drafter, method=point.method,
        gamma=point.gamma if point.gamma else None, max_new_tokens=max_new_tokens,
        eos_ids=pair.eos_ids, stop_rule=pair.stop_rule, tree=point.tree,
        verifier=point.verifier if drafts_block(point.method) else None))
    return lambda prompt, key, sp: fn(pair.target_params, pair.drafter_params, prompt, key, sp)


def _sampling(point: Point):
    return api.sampling_params(temperature=point.temperature,
                               alpha=0.0 if point.alpha is None else point.alpha)




def prompt_width(pair: ModelPair, examples: Sequence[Example]) -> int:
    longest = max(len(pair.encode(ex.prompt)) for ex in examples)
    return -(-longest // PROMPT_WIDTH_MULTIPLE) * PROMPT_WIDTH_MULTIPLE


def generate_point(pair: ModelPair, point: Point, examples: Sequence[Example], *,
                   max_new_tokens: int, batch_size: int, width: int, seed: int,
                   order: Sequence[int] | None = None, progress: bool = True,
                   cache: dict | None = None) -> list[dict]:
    """Per-example outputs and counters of one point (batched; the last batch is
    padded with copies of its first prompt, which are discarded).

    ``order`` groups examples into batches (e.g. by the target's output
    length, so rows of a batch finish together and little compute is spent on
    finished rows); rows come back in the examples' order. ``cache`` shares
    compiled functions between points (see ``_generate_fn``)."""
    fn = _generate_fn(pair, point, max_new_tokens, cache)
    sp = _sampling(point)
    rows = []
    order = list(range(len(examples))) if order is None else list(order)
    batches = range(0, len(examples), batch_size)
    for index in tqdm(batches, desc=point.key, leave=False, disable=not progress):
        chunk = [examples[i] for i in order[index:index + batch_size]]
        prompt = _batch_prompt(pair, chunk, batch_size, width)
        out = fn(prompt, jax.random.fold_in(jax.random.PRNGKey(seed), index), sp)
        # Every process gets the whole batch back (rows of other processes too).
        out, prompt_lengths = jax.tree_util.tree_map(distributed.gather, (out, prompt.lengths))
        tokens, lengths = out.tokens, out.lengths
        if int(out.stats.nan_logits.sum()):
            raise FloatingPointError(f"{point.key}: NaN logits; check the weights and dtype.")
        for row, ex in enumerate(chunk):
            text = pair.decode(tokens[row, :lengths[row]].tolist())
            rows.append({"id": ex.id, "text": text, "prompt_tokens": int(prompt_lengths[row]),
                         **cost_lib.row_counters(out.stats, row, point.method == "drafter")})
    position = {i: n for n, i in enumerate(order)}
    return [rows[position[i]] for i in range(len(examples))]


def _batch_prompt(pair: ModelPair, chunk: Sequence[Example], batch_size: int, width: int):
    """The batch's prompt, padded to ``batch_size`` rows with copies of its
    first example (their outputs are dropped). On a mesh, each process
    tokenises only the rows its devices hold."""
    def row_tokens(row: int) -> list[int]:
        return pair.encode(chunk[row if row < len(chunk) else 0].prompt)

    if pair.mesh is None:
        return make_prompt([row_tokens(r) for r in range(batch_size)], pad_to=width)
    return sharding.prompt_from_rows(row_tokens, batch_size, width, pair.mesh)


def score_rows(task: Task, rows: list[dict], examples: Sequence[Example]) -> None:
    """Cuts outputs at the task's stop strings and adds each example's metric item."""
    outputs = [task.postprocess(r["text"]) for r in rows]
    items = task.metric.score_examples(outputs, list(examples))
    for row, output, item in zip(rows, outputs, items, strict=True):
        row["output"] = output
        row["item"] = list(item) if isinstance(item, tuple) else item


def summarise(task: Task, point: Point, rows: list[dict], cost: CostModel | None) -> dict:
    """The record of one point (``report.py`` documents the schema)."""
    score, low, high = metrics.bootstrap_ci(
        [tuple(r["item"]) if isinstance(r["item"], list) else r["item"] for r in rows],
        task.metric.aggregate)
    total = lambda key: sum(r[key] for r in rows)
    target_calls = total("target_calls")
    record = {
        # The baselines draft up to their own cap, not gamma: gamma None puts them
        # in every gamma's table and plot (report.py), beside the AR runs.
        "method": point.method, "alpha": point.alpha,
        "gamma": None if fixed_gamma(point.method) is not None else point.gamma,
        "draft_cap": point.gamma,
        **({"tree": point.tree} if point.tree is not None else {}),
        **({"verifier": point.verifier} if point.verifier != DEFAULT_VERIFIER else {}),
        "temperature": point.temperature, "task": task.name, "metric": task.metric.name,
        "num_examples": len(rows), "key": point.key,
        "quality": {"score": score, "low": low, "high": high},
        "relative_latency": {"cost_model": None, "wallclock": None},
        "rejection_rate": total("rejections") / target_calls if target_calls and
        point.method not in AUTOREGRESSIVE else None,
        "deferral_rate": total("deferred") / max(total("emitted"), 1),
        "calls": {"target": target_calls, "drafter": total("drafter_calls")},
        "tokens": total("emitted"),
        "per_example": rows,
    }
    if cost is not None:
        record["cost_seconds"] = cost_seconds(cost, rows)
    return record


def cost_seconds(cost: CostModel, rows: list[dict]) -> list[float]:
    """Each stored row's counted calls priced at batch 1 (``CostModel.price``),
    its prompt's prefill included."""
    return [cost.price(cost_lib.counters_as_stats(r), prompt_tokens=r["prompt_tokens"])
            for r in rows]


def derive_seq_cascade(task: Task, point: Point, drafter: dict, target: dict,
                       cost: CostModel | None) -> dict:
    """SeqCascade [Chow] from the two autoregressive records of the same examples."""
    rows = []
    logprob = jnp.asarray([r["logprob"] for r in drafter["per_example"]])
    lengths = jnp.asarray([r["emitted"] for r in drafter["per_example"]])
    defers = np.asarray(sequence_defers(logprob, lengths, point.alpha,
                                        length_normalised=point.method.endswith("-norm")))
    for d, t, defer in zip(drafter["per_example"], target["per_example"], defers, strict=True):
        row = dict(t if defer else d)
        for name in ("calls", "fed", "single"):
            row[f"drafter_{name}"] = d[f"drafter_{name}"]
            row[f"target_{name}"] = t[f"target_{name}"] if defer else 0
        row["deferred"] = float(row["emitted"]) if defer else 0.0
        rows.append(row)
    return summarise(task, point, rows, cost)


def relative_latencies(records: list[dict]) -> None:
    """Fills ``relative_latency.cost_model``: a point's priced seconds over the
    target's, summed over the same examples."""
    targets_by_t = {r["temperature"]: r for r in records if r["method"] == "target"}
    for record in records:
        base = targets_by_t.get(record["temperature"])
        if base is None or "cost_seconds" not in record or "cost_seconds" not in base:
            continue
        record["relative_latency"]["cost_model"] = sum(record["cost_seconds"]) / \
            sum(base["cost_seconds"])


def _length_order(records: list[dict], point: Point) -> list[int] | None:
    """Examples sorted by the target's output length at this temperature, once
    the target has run (batching only: results do not depend on it)."""
    for record in records:
        if record["method"] == "target" and record["temperature"] == point.temperature:
            lengths = [r["emitted"] for r in record["per_example"]]
            return sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return None


def _write(path: pathlib.Path, data: dict) -> None:
    jsonio.write_json(path, data)


def load_or_start(path: pathlib.Path, settings: dict) -> dict:
    """The stored sweep when its settings match, a fresh one when there is none."""
    if not path.exists():
        return {"settings": settings, "records": [], "wallclock": {}}
    data = jsonio.read_json(path)
    differ = resume.differences(data.get("settings", {}), resume.as_json(settings))
    if differ:
        raise ValueError(f"{path} holds a sweep with other settings ({'; '.join(differ)}). "
                         "Resume with the same settings, or write to another output file.")
    data.setdefault("wallclock", {})
    return data


def run_sweep(*, pair: ModelPair, task: Task, examples: Sequence[Example],
              points: Sequence[Point], out_path: str | os.PathLike, settings: dict,
              max_new_tokens: int, batch_size: int, seed: int = 0,
              cost: CostModel | None = None, calibration: dict | None = None,
              wallclock_examples: int = 0, wallclock_trials: int = 1,
              progress: bool = True) -> dict:
    """Runs (or resumes) a sweep; returns the stored data (settings, records...)."""
    path = pathlib.Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = load_or_start(path, settings)
    isolation = metrics.execution_isolation(task.metric)
    if isolation is not None:  # how this machine's sandbox isolated the executed samples
        data["sandbox"] = isolation
    if cost is not None:
        data["cost_model"] = cost.to_json()
        data["calibration"] = calibration
        for record in data["records"]:  # a recalibrated model reprices stored points
            if "per_example" in record:
                record["cost_seconds"] = cost_seconds(cost, record["per_example"])
        relative_latencies(data["records"])
    data["environment"] = timing.environment()
    data["records"] = [r for r in data["records"] if r["method"] not in DERIVED]
    done = {r["key"] for r in data["records"]}
    width = prompt_width(pair, examples)
    todo = [p for p in points if p.key not in done and p.method not in DERIVED]
    cache: dict = {}  # one compilation per structure and shape, shared with the wall clock
    bar = tqdm(todo, desc=f"sweep {task.name}", disable=not progress)
    for point in bar:
        bar.set_postfix_str(point.key)
        start = time.perf_counter()
        rows = generate_point(pair, point, examples, max_new_tokens=max_new_tokens,
                              batch_size=batch_size, width=width, seed=seed,
                              order=_length_order(data["records"], point), progress=progress,
                              cache=cache)
        score_rows(task, rows, examples)
        record = summarise(task, point, rows, cost)
        record["sweep_seconds"] = time.perf_counter() - start
        data["records"].append(record)
        relative_latencies(data["records"])
        _write(path, data)
    by_key = {r["key"]: r for r in data["records"]}
    for point in points:
        if point.method in DERIVED:
            base = [by_key.get(Point(m, None, None, point.temperature).key)
                    for m in AUTOREGRESSIVE]
            if None not in base:
                data["records"].append(derive_seq_cascade(task, point, *base, cost))
    relative_latencies(data["records"])
    _wallclock_ratios(data)
    _write(path, data)
    if wallclock_examples:
        wallclock_phase(pair, points, examples[:wallclock_examples], data, path,
                        max_new_tokens=max_new_tokens, width=width, seed=seed,
                        trials=wallclock_trials, progress=progress, cache=cache)
    return data


def wallclock_phase(pair: ModelPair, points: Sequence[Point], examples: Sequence[Example],
                    data: dict, path: pathlib.Path, *, max_new_tokens: int, width: int,
                    seed: int, trials: int, progress: bool, cache: dict | None = None) -> None:
    """Times every generated point at batch 1 on ``examples``, interleaved
    (example by example, all points in turn), ``trials`` times; stores seconds
    per point and example, and the ratio to the target in each record."""
    timed = [p for p in points if p.method not in DERIVED]
    store = data["wallclock"]
    cache = {} if cache is None else cache
    warm: set[tuple] = set()
    jobs = [(trial, ex) for trial in range(trials) for ex in examples]
    for trial, ex in tqdm(jobs, desc="wall clock (batch 1)", disable=not progress):
        slot = f"{trial}|{ex.id}"
        if slot in store and all(p.key in store[slot] for p in timed):
            continue
        prompt = make_prompt([pair.encode(ex.prompt)], pad_to=width)
        key = jax.random.PRNGKey(seed)
        times = store.setdefault(slot, {})
        for point in timed:
            fn, sp = _generate_fn(pair, point, max_new_tokens, cache), _sampling(point)
            if _structure(point, max_new_tokens) not in warm:
                # compile (if new) and warm up once per program, outside the timing
                warm.add(_structure(point, max_new_tokens))
                jax.block_until_ready(fn(prompt, key, sp))
            start = time.perf_counter()
            jax.block_until_ready(fn(prompt, key, sp))
            times[point.key] = time.perf_counter() - start
        _write(path, data)
    _wallclock_ratios(data)
    _write(path, data)


def _wallclock_ratios(data: dict) -> None:
    """Wall-clock ratio to the target on the timed examples, and the cost model's
    prediction of the same ratio on the same examples (``cost_model_subset``):
    outputs differ in length between examples and methods, so only the latter is
    a fair check of the cost model."""
    by_key = {r["key"]: r for r in data["records"]}
    for record in data["records"]:
        base = Point("target", None, None, record["temperature"]).key
        usable = [(slot.split("|", 1)[1], times) for slot, times in data["wallclock"].items()
                  if record["key"] in times and base in times]
        if not usable or base not in by_key:
            continue
        # A ratio of total seconds, with a bootstrap interval over the examples.
        ratio, low, high = metrics.bootstrap_ci(
            [(t[record["key"]], t[base]) for _, t in usable],
            lambda pairs: sum(a for a, _ in pairs) / sum(b for _, b in pairs))
        record["relative_latency"]["wallclock"] = ratio
        record["relative_latency"]["wallclock_ci95"] = [low, high]
        if "cost_seconds" in record and "cost_seconds" in by_key[base]:
            ids = [row["id"] for row in record["per_example"]]
            chosen = [ids.index(example_id) for example_id, _ in usable]
            cost = [sum(r["cost_seconds"][i] for i in chosen) for r in (record, by_key[base])]
            record["relative_latency"]["cost_model_subset"] = cost[0] / cost[1]
