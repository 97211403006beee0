"""One quality-vs-latency study: models and task in, JSON + Markdown + plots out.

``run_study`` is what ``python -m eval.main --gin_file=configs/runs/...``
calls (gin binds its keyword arguments; this module knows nothing of gin).
It loads the pair, calibrates the cost model on this machine, runs (or
resumes) the sweep, and writes the reports.

Models are any names ``jobs.resolver`` knows: registry models, GGUF
files, Hugging Face directories, the project's T5 pair members, or the
byte-level toys ``toy-bytes-small`` / ``toy-bytes-large`` (random weights,
UTF-8 bytes as tokens: CI runs the whole pipeline on them in seconds; their
quality numbers mean nothing).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import jax

from specdec_jax import api, precision
from specdec_jax.checkpoints.tree_paths import params_fingerprint
from specdec_jax.data import tasks
from specdec_jax.decode import cost as cost_lib
from specdec_jax.jobs import resolver, tables
from specdec_jax.jobs.studies import report, sweep
from specdec_jax.runtime import calibration, distributed, jsonio, sharding, timing


def job_mesh(model_parallel: int | None):
    """The mesh of a job: None (one device, as always) unless the job spans
    processes or asks for model parallelism; then every device of every
    process, ``model_parallel`` (default 1) along ``model``, the rest along
    ``data`` (the batch size must divide by it)."""
    if jax.process_count() == 1 and model_parallel is None:
        return None
    return sharding.make_mesh(model=model_parallel or 1)


def _examples_and_pair(the_task, split: str, num_examples: int, points, where: str, *,
                       target: str, drafter: str, dtype: str, drafter_head_vocab,
                       draft_weights, mesh=None) -> tuple[list, resolver.ModelPair]:
    """A job's examples and its loaded pair, refused (naming ``where``) when a
    planned tree point needs models the pair lacks (``sweep.check_tree_models``)."""
    examples = the_task.load(split, num_examples)
    pair = resolver.load_pair(target=target, drafter=drafter, dtype=dtype,
                              stop_at_block_end=the_task.stop_at_block_end, mesh=mesh,
                              drafter_head_vocab=drafter_head_vocab,
                              draft_weights=draft_weights)
    sweep.check_tree_models(pair, points, where)
    return examples, pair


def run_study(*, task: str, target: str, drafter: str, methods: dict[str, Sequence[float]],
              out_dir: str, stem: str, split: str = "test", num_examples: int = 30,
              gammas: Sequence[int] = (5,), temperatures: Sequence[float] = (0.0,),
              max_new_tokens: int = 160, batch_size: int = 10, seed: int = 0,
              dtype: str = "auto", wallclock_examples: int = 3, wallclock_trials: int = 1,
              calibration_context: int = 256,
              calibration_widths: Sequence[int] = calibration.CALIBRATION_WIDTHS,
              progress: bool = True, drafter_head_vocab: int = 0,
              draft_weights: str = "f32", trees: Sequence[str] = (),
              verifier: str = sweep.DEFAULT_VERIFIER) -> dict:
    """Runs the sweep and writes ``<out_dir>/<stem>.json``, ``.md`` and two PNGs.

    ``methods`` maps each method to its alpha grid (see ``sweep.plan_points``).
    ``trees``: token trees (``'3,2,1,1'``, ``'dynamic:5,2,3'``, as ``specdec-jax
    generate --tree``) each speculative method also drafts, beside its chains
    of ``gammas`` drafts; each tree is a group of its own in the reports.
    ``verifier``: ``token`` or ``block`` (on trees: recursive rejection
    sampling, traversal verification). Returns the stored sweep (settings,
    records, cost model, wall clock).
    """
    dtype = precision.resolve_dtype(dtype)  # recorded as resolved: "float32" on CPU
    the_task = tasks.get_task(task)
    points = sweep.plan_points(methods=methods, gammas=gammas, temperatures=temperatures,
                               trees=trees, verifier=verifier, where="run_study.trees")
    if max_new_tokens < 1 or batch_size < 1 or num_examples < 1:
        raise ValueError("max_new_tokens, batch_size and num_examples must all be >= 1.")
    examples, pair = _examples_and_pair(
        the_task, split, num_examples, points, "run_study.trees", target=target, drafter=drafter,
        dtype=dtype, drafter_head_vocab=drafter_head_vocab, draft_weights=draft_weights)
    settings = {"task": task, "split": split, "num_examples": num_examples,
                "target": target, "drafter": drafter, "max_new_tokens": max_new_tokens,
                "seed": seed, "dtype": dtype, "batch_size": batch_size,
                "example_ids": [ex.id for ex in examples]}
    if drafter_head_vocab:  # absent when 0: sweeps stored before the option still resume
        settings["drafter_head_vocab"] = drafter_head_vocab
    if draft_weights != "f32":  # likewise absent at the default
        settings["draft_weights"] = draft_weights
    if resolver.family_of(target).name == "t5-pair":
        # Trained members change when retrained: a stored sweep of other weights
        # must not be resumed (registry checkpoints are pinned by sha256).
        settings["weights"] = {"target": params_fingerprint(pair.target_params),
                               "drafter": params_fingerprint(pair.drafter_params)}
    out = pathlib.Path(out_dir)
    json_path = jsonio.existing(out / f"{stem}.json")  # a committed sweep may be compressed
    stored = sweep.load_or_start(json_path, settings)  # fails early on a settings mismatch
    if "prefill_per_token_s" in stored.get("cost_model", {}).get("target", {}):
        cost = cost_lib.CostModel.from_json(stored["cost_model"])
        measured = stored.get("calibration")
    else:
        cost, measured = calibration.calibrate(
            target=pair.target, target_params=pair.target_params, drafter=pair.drafter,
            drafter_params=pair.drafter_params, context=calibration_context,
            widths=tuple(calibration_widths))
    data = sweep.run_sweep(pair=pair, task=the_task, examples=examples, points=points,
                           out_path=json_path, settings=settings,
                           max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed,
                           cost=cost, calibration=measured,
                           wallclock_examples=wallclock_examples,
                           wallclock_trials=wallclock_trials, progress=progress)
    records = [{k: v for k, v in r.items() if k not in ("per_example", "cost_seconds")}
               for r in data["records"]]
    report.write_reports(records, out, stem=stem, sandbox=data.get("sandbox"))
    return data


# How run_generate's arguments are spelled in its errors (``api.decoder_spec``).
RUN_GENERATE_NAMES = api.ArgumentNames(
    method="run_generate.method", gamma="run_generate.gamma", tree="run_generate.tree",
    verifier="run_generate.verifier", drafter="run_generate.drafter")


def run_generate(*, task: str, target: str, drafter: str, out_path: str,
                 method: str = "specdecode", alpha: float | None = None,
                 gamma: int | None = None, tree: str | None = None,
                 verifier: str = sweep.DEFAULT_VERIFIER,
                 temperature: float = 0.0, split: str = "test", num_examples: int = 3,
                 max_new_tokens: int = 160, batch_size: int = 3, seed: int = 0,
                 dtype: str = "auto", model_parallel: int | None = None,
                 progress: bool = True, drafter_head_vocab: int = 0,
                 draft_weights: str = "f32") -> dict:
    """One method on a task's first examples: outputs, scores and counters as
    one sweep record (JSON at ``out_path``), the outputs printed.

    A chain of ``gamma`` drafts a round (default ``api.DEFAULT_GAMMA``), or
    the token tree ``tree`` (``'3,2,1,1'``, ``'dynamic:5,2,3'``: ``specdec-jax
    generate --tree``), verified by ``verifier`` (chains: token, block,
    block-seed; trees: greedy, rrs, rrs-replacement, traversal, or token /
    block for their tree forms).

    Across processes (``launch --num_processes ...``) or with
    ``model_parallel``, the models are sharded over a mesh of every device
    (``job_mesh``), each process tokenises only its rows of each batch, and
    process 0 alone writes and prints."""
    dtype = precision.resolve_dtype(dtype)  # recorded as resolved: "float32" on CPU
    the_task = tasks.get_task(task)
    if tree is not None and method in sweep.AUTOREGRESSIVE:
        raise ValueError(f"run_generate.tree = {tree!r}: method {method!r} drafts nothing; "
                         "drop the tree or pick a speculative method.")
    if tree is not None:  # a chain's grid checks its own points (sweep.plan_points)
        api.decoder_spec(method, drafter=api.DrafterFacts(), gamma=gamma, tree=tree,
                         verifier=verifier, temperature=temperature, alpha=alpha,
                         names=RUN_GENERATE_NAMES)
    grid = {} if method in sweep.AUTOREGRESSIVE else {method: [] if alpha is None else [alpha]}
    points = [p for p in sweep.plan_points(
        methods=grid, gammas=[] if tree is not None else [gamma or api.DEFAULT_GAMMA],
        temperatures=[temperature], trees=() if tree is None else [tree],
        verifier=verifier, where="run_generate.tree") if p.method == method]
    if not points:
        raise ValueError(f"method {method!r} needs an alpha (and cannot be derived alone).")
    examples, pair = _examples_and_pair(
        the_task, split, num_examples, points, "run_generate.tree", target=target,
        drafter=drafter, dtype=dtype, drafter_head_vocab=drafter_head_vocab,
        draft_weights=draft_weights, mesh=job_mesh(model_parallel))
    rows = sweep.generate_point(pair, points[0], examples, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, width=sweep.prompt_width(pair, examples),
                                seed=seed, progress=progress)
    sweep.score_rows(the_task, rows, examples)
    record = sweep.summarise(the_task, points[0], rows, None)
    if not distributed.is_writer():
        return record
    path = pathlib.Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    for row in rows:
        print(f"--- {row['id']} ({the_task.metric.name} item {row['item']}):\n{row['output']}")
    return record


def run_benchmark(*, task: str, target: str, drafter: str, out_path: str,
                  methods: dict[str, Sequence[float]] | None = None,
                  gammas: Sequence[int] = (3, 5, 7), temperatures: Sequence[float] = (0.0,),
                  split: str = "test", num_examples: int = 5, max_new_tokens: int = 160,
                  trials: int = 1, seed: int = 0, dtype: str = "auto",
                  progress: bool = True, drafter_head_vocab: int = 0,
                  draft_weights: str = "f32", trees: Sequence[str] = (),
                  verifier: str = sweep.DEFAULT_VERIFIER) -> dict:
    """Wall-clock speed at batch 1: every method against autoregressive target
    decoding on a task's first examples, timed interleaved (example by example,
    all methods in turn; compilation and one warm-up call excluded). ``trees``
    and ``verifier``: as ``run_study``'s (each tree a row beside the chains).

    Writes ``out_path`` (JSON: settings, per-example seconds, one record per
    point with ``speedup`` = target seconds / method seconds on the same
    examples) and prints a Markdown table. Quality is the sweep's job
    (``run_study``); this one answers "how much faster, here, now".
    """
    dtype = precision.resolve_dtype(dtype)  # recorded as resolved: "float32" on CPU
    methods = {"specdecode": []} if methods is None else methods
    derived = [m for m in methods if m in sweep.DERIVED]
    if derived:
        raise ValueError(f"{derived} are derived from the autoregressive runs and have no "
                         "wall clock of their own; drop them from run_benchmark.methods.")
    if max_new_tokens < 1 or num_examples < 1 or trials < 1:
        raise ValueError("max_new_tokens, num_examples and trials must all be >= 1.")
    the_task = tasks.get_task(task)
    points = sweep.plan_points(methods=methods, gammas=gammas, temperatures=temperatures,
                               trees=trees, verifier=verifier, where="run_benchmark.trees")
    examples, pair = _examples_and_pair(
        the_task, split, num_examples, points, "run_benchmark.trees", target=target,
        drafter=drafter, dtype=dtype, drafter_head_vocab=drafter_head_vocab,
        draft_weights=draft_weights)
    data = {"settings": {"task": task, "split": split, "target": target, "drafter": drafter,
                         "drafter_head_vocab": drafter_head_vocab,
                         "draft_weights": draft_weights, "max_new_tokens": max_new_tokens,
                         "trials": trials, "dtype": dtype,
                         "example_ids": [ex.id for ex in examples]},
            "environment": timing.environment(), "wallclock": {},
            "records": [{"key": p.key, "method": p.method, "alpha": p.alpha,
                         "gamma": p.gamma, "tree": p.tree, "verifier": p.verifier,
                         "temperature": p.temperature,
                         "relative_latency": {}} for p in points]}
    path = pathlib.Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep.wallclock_phase(pair, points, examples, data, path, max_new_tokens=max_new_tokens,
                          width=sweep.prompt_width(pair, examples), seed=seed, trials=trials,
                          progress=progress)
    rows = []
    show = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    for record in data["records"]:
        seconds = [times[record["key"]] for times in data["wallclock"].values()]
        record["seconds_per_example"] = sum(seconds) / len(seconds)
        record["speedup"] = 1.0 / record["relative_latency"]["wallclock"]
        low, high = record["relative_latency"]["wallclock_ci95"]
        record["speedup_ci95"] = [1.0 / high, 1.0 / low]
        draft = f"tree {record['tree']}" if record.get("tree") else show(record["gamma"])
        rows.append((record["method"], show(record["alpha"]), draft,
                     f"{record['temperature']:g}", f"{record['seconds_per_example']:.3f}",
                     tables.format_ci(record["speedup"], record["speedup_ci95"], digits=2,
                                      unit="x")))
    lines = tables.markdown_table(("method", "alpha", "G", "T", "seconds / example",
                                   "speedup vs target (95% CI)"), rows)
    path.write_text(json.dumps(data, indent=1))
    print(f"{target} / {drafter} on {len(examples)} {task} examples, batch 1, {dtype}, "
          f"{data['environment']['machine']}:\n" + "\n".join(lines))
    return data
