"""Per-step cost of a feature-level (EAGLE-style) draft head, in-loop, against the
target and a small drafter model, and the speedup each predicts at an assumed
acceptance.

Runs where the real weights are not at hand: ``random:<architecture>:<seed>``
names give the registered shapes with random weights (a step's cost depends on
shapes and dtype, not on values), and a restricted head's token ids are random
(its cost depends on their count only). Every step is timed as ``steps`` calls
inside one jitted loop (``timing.in_loop``; ``timing.in_loop_step`` for the
models: each step feeds the previous step's output, at a fixed cache fill of
``fill`` tokens), the median of ``repeats`` runs per step. Measured:

* the target's ``extend`` of K tokens for each of ``target_widths`` (K = 1 is
  the autoregressive step, K = G + 1 a round's scoring call);
* the drafter model's one-token step (``drafter``; None: not measured);
* for each head MLP width (``intermediate_sizes``; None: the target's) and each
  head vocabulary (the full one, then ``head_vocab_sizes`` ids):
  - *draft step*: ``FeatureHead.step`` on one token + ``FeatureHead.logits`` +
    argmax (one draft after the round's first);
  - *window*: ``FeatureHead.step`` on K tokens (``window_widths``; no logits):
    the catch-up call that re-feeds the accepted positions with the target's
    features at a round's start;
  - *first logits*: ``FeatureHead.logits`` + argmax alone, by vocabulary (the
    round's first draft reads the window call's last prediction).

Argmax stands for the draw for every drafter alike (the models' in-loop steps
take the argmax too). A failing step is recorded with its error and the run
goes on. Prediction (``decode.cost``'s model, batch 1): a round of G drafts costs
the target's call of G + 1 tokens, plus for the drafter model G one-token steps
(``CostModel.round_seconds(drafter_calls=G)``), for the head one window call of
G + 1 tokens with the first logits and G - 1 draft steps (``round_seconds(
drafter_calls=G, catch_ups=1, catch_up_width=G + 1)``), plus ``round_overhead_ms``;
widths not measured take ``CallCost``'s fit. Tokens per round from the assumed
acceptance: a per-token rate ``a`` gives ``cost.tokens_per_round(a, G)``, a list
``[a_1, ..., a_n]`` of per-position rates (``a_i``: draft i is accepted given
drafts 1..i-1 were) gives ``1 + sum_i prod_{j <= i} a_j``. Speedup over the
autoregressive target: ``CostModel.predicted_speedup``.

``benchmarks/configs/feature_steps.gin`` runs it on the Qwen2.5-Coder 1.5B / 0.5B
shapes; ``benchmarks/configs/feature_steps_tiny.gin`` is a smoke run on tiny shapes;
``tools/feature_gpu_check.sh`` is the one-call GPU run::

    python -m benchmarks.main --gin_file=benchmarks/configs/feature_steps.gin \\
        --gin_bindings="OUT_DIR = 'results/bench_feature_steps_gpu'"

Writes ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md`` after every step.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import shared
from specdec_jax import precision
from specdec_jax.decode import cost
from specdec_jax.jobs import resolver, tables
from specdec_jax.models import feature_head
from specdec_jax.models.layers import KERNEL_LAYOUTS, OUT_IN
from specdec_jax.runtime import timing

TARGET = "random:qwen2.5-coder-1.5b:0"
DRAFTER = "random:qwen2.5-coder-0.5b:1"
HEAD_VOCAB_SIZES = (32768, 16384)
INTERMEDIATE_SIZES = (None, 2048)
TARGET_WIDTHS = (1, 4, 5, 6, 7, 8)  # K = 1 and every G + 1 of GAMMAS
WINDOW_WIDTHS = (6,)
GAMMAS = (3, 4, 5, 6, 7)
ACCEPTANCE = (0.6, 0.7, 0.8)
DRAFTER_ROLE = "drafter model"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one run measures (the job's arguments, checked; ``dtype`` resolved)."""

    target: str
    drafter: str | None
    dtype: str
    batch: int
    fill: int
    steps: int
    repeats: int
    kernel_layout: str
    target_widths: list[int]
    window_widths: list[int]
    head_vocab_sizes: list[int]
    intermediate_sizes: list[int | None]
    gammas: list[int]
    acceptance: list
    round_overhead_ms: float
    seed: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _as_list(value) -> list:
    return list(value) if isinstance(value, Iterable) and not isinstance(value, str) \
        else [value]


def check_settings(**s) -> Settings:
    """The job's arguments, checked before any model is loaded (clear errors)."""
    for name in ("target_widths", "window_widths", "head_vocab_sizes", "intermediate_sizes",
                 "gammas"):
        s[name] = _as_list(s[name])
    shared.check_at_least(1, batch=s["batch"], fill=s["fill"], steps=s["steps"],
                          repeats=s["repeats"], gammas=s["gammas"],
                          target_widths=s["target_widths"])
    shared.check_at_least(2, window_widths=s["window_widths"])
    shared.check_at_least(0, seed=s["seed"])
    if 1 not in s["target_widths"]:
        raise ValueError(f"target_widths must include 1 (the autoregressive step every "
                         f"speedup is against); got {s['target_widths']!r}.")
    shared.check_choices("kernel_layout", s["kernel_layout"], KERNEL_LAYOUTS)
    if not isinstance(s["target"], str) or not s["target"]:
        raise ValueError(f"target must be a model name (e.g. {TARGET!r}); got {s['target']!r}.")
    roles = ("target", "drafter") if s["drafter"] else ("target",)
    for role in roles:
        resolver.family_of(s[role])  # an unknown name fails here, listing the known ones
        if s[role].startswith(resolver.RANDOM_PREFIX):
            resolver.parse_random(s[role])
    vocab = resolver.known_vocab_size(s["target"])
    if s["head_vocab_sizes"]:
        shared.check_at_least(1, head_vocab_sizes=s["head_vocab_sizes"])
        if len(set(s["head_vocab_sizes"])) != len(s["head_vocab_sizes"]):
            raise ValueError(f"head_vocab_sizes has repeats: {s['head_vocab_sizes']!r}.")
        if vocab is not None and max(s["head_vocab_sizes"]) >= vocab:
            raise ValueError(f"head_vocab_sizes must be below the target's vocabulary of "
                             f"{vocab} tokens (the full head is always measured); got "
                             f"{s['head_vocab_sizes']!r}.")
    if not s["intermediate_sizes"]:
        raise ValueError("intermediate_sizes is empty; give one or more MLP widths (None: "
                         "the target's).")
    bad = [m for m in s["intermediate_sizes"] if m is not None and
           (isinstance(m, bool) or not isinstance(m, int) or m < 1)]
    if bad:
        raise ValueError(f"intermediate_sizes must be integers >= 1 or None (the target's "
                         f"width); got {s['intermediate_sizes']!r}.")
    s["acceptance"] = check_acceptance(s["acceptance"], max(s["gammas"]))
    overhead = s["round_overhead_ms"]
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or \
            not overhead >= 0:
        raise ValueError(f"round_overhead_ms must be a number >= 0; got {overhead!r}.")
    s["dtype"] = precision.resolve_dtype(s["dtype"])
    for name in ("target_widths", "window_widths", "gammas"):
        s[name] = sorted(set(s[name]))
    return Settings(**s)


def check_acceptance(acceptance, max_gamma: int) -> list:
    """Each entry a per-token rate in [0, 1] or a list of per-position rates
    ``a_1..a_n`` in [0, 1] with ``n >= max_gamma``; returned as floats / lists."""
    if isinstance(acceptance, (int, float)) or not list(acceptance):
        raise ValueError(f"acceptance must be a list of per-token rates (e.g. [0.6, 0.7, 0.8]) "
                         f"and/or per-position lists [a_1, ..., a_G]; got {acceptance!r}.")
    is_rate = lambda a: not isinstance(a, bool) and isinstance(a, (int, float)) and 0 <= a <= 1
    checked = []
    for entry in acceptance:
        if is_rate(entry):
            checked.append(float(entry))
        elif isinstance(entry, (list, tuple)) and entry and all(map(is_rate, entry)):
            if len(entry) < max_gamma:
                raise ValueError(f"per-position acceptance {list(entry)!r} has {len(entry)} "
                                 f"rates; the largest G is {max_gamma}: give one per draft "
                                 "position (a_1 .. a_G).")
            checked.append([float(a) for a in entry])
        else:
            raise ValueError(f"acceptance entries must be rates in [0, 1] or lists of them "
                             f"(per position); got {entry!r}.")
    return checked


# -- the cost model ------------------------------------------------------------------------

def acceptance_label(acceptance) -> str:
    if isinstance(acceptance, (int, float)):
        return f"a = {acceptance:g}"
    return "a_i = " + ", ".join(f"{a:g}" for a in acceptance)


def predicted_speedup(model: cost.CostModel, gamma: int, kind: str, acceptance) -> dict:
    """Tokens per round, round seconds and speedup over the autoregressive
    target of a round of ``gamma`` drafts (module docstring): ``kind`` 'model'
    (G one-token drafter steps) or 'feature' (one window call of G + 1 tokens,
    priced with the first logits, and G - 1 draft steps)."""
    if kind not in ("model", "feature"):
        raise ValueError(f"kind must be 'model' or 'feature'; got {kind!r}.")
    catch_up = dict(catch_ups=1, catch_up_width=gamma + 1) if kind == "feature" else {}
    per_round = cost.tokens_per_round(acceptance, gamma)
    round_s = model.round_seconds(gamma=gamma, drafter_calls=gamma, **catch_up)
    return {"tokens_per_round": per_round, "round_s": round_s,
            "drafting_s": round_s - model.target.call_s(gamma + 1) - model.round_overhead_s,
            "speedup": model.predicted_speedup(tokens_per_round=per_round, round_s=round_s)}


# -- in-loop timing of the head ------------------------------------------------------------

def _head_cache(head: feature_head.FeatureHead, batch: int, fill: int, k: int):
    return head.init_cache(batch, fill + k).replace(lengths=jnp.full((batch,), fill, jnp.int32))


def time_draft_step(head, params, settings: Settings) -> timing.Timed:
    """One draft: ``step`` on one (token, feature) pair, ``logits``, argmax;
    the next step feeds the argmax and the predicted feature."""
    b, d = settings.batch, head.config.feature_size

    def body(params, carry):
        token_B, feature_BxD, cache = carry
        predicted, new_cache = head.step(params, token_B[:, None], feature_BxD[:, None], cache)
        chosen = jnp.argmax(head.logits(params, predicted[:, 0]), -1).astype(jnp.int32)
        return chosen, predicted[:, 0].astype(jnp.float32), new_cache.replace(
            lengths=cache.lengths)

    carry = (jnp.ones((b,), jnp.int32), jnp.zeros((b, d), jnp.float32),
             _head_cache(head, b, settings.fill, 1))
    return timing.in_loop(body, params, carry, steps=settings.steps,
                          repeats=settings.repeats)


def time_window(head, params, settings: Settings, width: int) -> timing.Timed:
    """The catch-up window: ``step`` on ``width`` (token, feature) pairs, no
    logits; the next call feeds the predicted features back."""
    b, d = settings.batch, head.config.feature_size

    def body(params, carry):
        features_BxKxD, cache = carry
        tokens_BxK = jnp.ones((b, width), jnp.int32)
        predicted, new_cache = head.step(params, tokens_BxK, features_BxKxD, cache)
        return predicted.astype(jnp.float32), new_cache.replace(lengths=cache.lengths)

    carry = (jnp.zeros((b, width, d), jnp.float32), _head_cache(head, b, settings.fill, width))
    return timing.in_loop(body, params, carry, steps=settings.steps,
                          repeats=settings.repeats)


def time_first_logits(head, params, settings: Settings) -> timing.Timed:
    """``logits`` + argmax alone (the round's first draft, on the window's last
    prediction); the next call reads the chosen token's embedding row."""
    b, d = settings.batch, head.config.feature_size

    def body(params, carry):
        (feature_BxD,) = carry
        chosen = jnp.argmax(head.logits(params, feature_BxD), -1)
        return (jnp.take(params["embedding"], chosen, axis=0).astype(jnp.float32),)

    return timing.in_loop(body, params, (jnp.zeros((b, d), jnp.float32),),
                          steps=settings.steps, repeats=settings.repeats)


def _tree_bytes(tree) -> int:
    return int(sum(x.nbytes for x in jax.tree_util.tree_leaves(tree)))


def random_token_ids(vocab_size: int, count: int, seed: int) -> np.ndarray:
    """``count`` distinct random ids (a restricted head's cost depends on the count)."""
    return np.random.default_rng(seed).choice(vocab_size, count, replace=False)


# -- the job -------------------------------------------------------------------------------

class _Run:
    """The report and its files, rewritten after every step; progress printed."""

    def __init__(self, report: dict, out_dir: str, name: str):
        self.report, self.start = report, time.perf_counter()
        self.json_path = os.path.join(out_dir, f"{name}.json")
        self.markdown_path = os.path.join(out_dir, f"{name}.md")

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.start:7.1f} s] {text}", flush=True)

    def save(self) -> None:
        self.report["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        finish(self.report)
        shared.write_report(self.report, self.json_path)
        with open(self.markdown_path, "w") as f:
            f.write(markdown(self.report) + "\n")

    def measure(self, entry: dict, fn: Callable[[], timing.Timed]) -> None:
        """Times one step (``entry`` describes it), recording an error instead
        of raising."""
        self.report["steps"].append(entry)
        self.say(f"{entry['name']} ...")
        started = time.perf_counter()
        try:
            timed = fn()
            entry.update(status="ok", step_ms=1e3 * timed.median_s,
                         run_ms=[1e3 * s for s in timed.run_s], compile_s=timed.compile_s)
            self.say(f"{entry['name']}: {entry['step_ms']:.3f} ms/step "
                     f"(compile {timed.compile_s:.1f} s)")
        except Exception as error:  # noqa: BLE001 - one step's failure is a result
            entry.update(status="error", error=f"{type(error).__name__}: {error}"[:2000])
            self.say(f"{entry['name']}: FAILED {entry['error'][:300]}")
        entry["seconds"] = round(time.perf_counter() - started, 1)
        self.save()

    def fail(self, entry: dict, error: Exception) -> None:
        """A step that could not start (its model failed to build)."""
        entry.update(status="error", error=f"{type(error).__name__}: {error}"[:2000])
        self.report["steps"].append(entry)
        self.say(f"{entry['name']}: FAILED {entry['error'][:300]}")
        self.save()


def environment() -> dict:
    """``timing.environment()`` plus the backend, device kind, jaxlib and
    driver (``nvidia-smi``, where present)."""
    env = dict(timing.environment())
    env["backend"] = jax.default_backend()
    env["device_kind"] = jax.devices()[0].device_kind
    for package in ("jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    if shutil.which("nvidia-smi"):
        for key, args in (("nvidia_smi_query", ["--query-gpu=name,driver_version,memory.total",
                                                "--format=csv,noheader"]),
                          ("nvidia_smi", [])):
            try:
                env[key] = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True,
                                          timeout=30).stdout.strip()
            except (OSError, subprocess.SubprocessError) as error:
                env[key] = f"{type(error).__name__}: {error}"
    return env


def run_bench_feature_steps(*, target: str = TARGET, drafter: str | None = DRAFTER,
                            dtype: str = "auto", batch: int = 1, fill: int = 128,
                            steps: int = 32, repeats: int = 5, kernel_layout: str = OUT_IN,
                            target_widths: Sequence[int] = TARGET_WIDTHS,
                            window_widths: Sequence[int] = WINDOW_WIDTHS,
                            head_vocab_sizes: Sequence[int] = HEAD_VOCAB_SIZES,
                            intermediate_sizes: Sequence[int | None] = INTERMEDIATE_SIZES,
                            gammas: Sequence[int] = GAMMAS, acceptance: Sequence = ACCEPTANCE,
                            round_overhead_ms: float = 0.0, seed: int = 0,
                            out_dir: str = "results/bench_feature_steps",
                            name: str = "feature_steps") -> dict:
    """The benchmark (module docstring). ``target`` / ``drafter``: resolver
    names (``random:<architecture>:<seed>``: random weights of its shapes;
    ``drafter`` None: no drafter model). ``dtype``: auto is float32 on CPU and
    bfloat16 on accelerators. ``fill``: tokens in every cache when a step runs.
    ``head_vocab_sizes``: restricted heads measured besides the full one;
    ``intermediate_sizes``: the head's MLP widths (None: the target's).
    ``acceptance``: per-token rates and/or per-position lists (``a_1..a_G``).
    Returns the report, also written to ``<out_dir>/<name>.json`` and ``.md``."""
    settings = check_settings(
        target=target, drafter=drafter or None, dtype=dtype, batch=batch, fill=fill,
        steps=steps, repeats=repeats, kernel_layout=kernel_layout, target_widths=target_widths,
        window_widths=window_widths, head_vocab_sizes=head_vocab_sizes,
        intermediate_sizes=intermediate_sizes, gammas=gammas, acceptance=acceptance,
        round_overhead_ms=round_overhead_ms, seed=seed)
    report = {"environment": environment(), "settings": settings.to_json(),
              "dtype": settings.dtype, "weight_bytes": {}, "steps": []}
    run = _Run(report, out_dir, name)
    run.say(f"bench_feature_steps: {settings.target} <- feature heads and "
            f"{settings.drafter}, {settings.dtype} on {report['environment']['device_kind']} "
            f"({report['environment']['backend']}), batch {settings.batch}, fill "
            f"{settings.fill}, {settings.steps} steps x {settings.repeats} repeats")
    run.save()

    target_model, target_params, _ = resolver.resolve(settings.target, dtype=settings.dtype,
                                                      kernel_layout=settings.kernel_layout)
    report["weight_bytes"]["target"] = _tree_bytes(target_params)
    report["target_config"] = {k: getattr(target_model.config, k) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
        "num_kv_heads", "tie_embeddings", "kernel_layout", "dtype")}
    run.say(f"target loaded ({report['weight_bytes']['target'] / 1e9:.2f} GB)")
    for k in settings.target_widths:
        run.measure({"name": f"target K={k}", "role": "target", "part": "extend", "k": k},
                    lambda k=k: timing.in_loop_step(
                        target_model, target_params, k, settings.batch, fill=settings.fill,
                        steps=settings.steps, repeats=settings.repeats))

    if settings.drafter:
        entry = {"name": "drafter model K=1", "role": DRAFTER_ROLE, "part": "extend", "k": 1}
        try:
            drafter_model, drafter_params, _ = resolver.resolve(
                settings.drafter, dtype=settings.dtype, kernel_layout=settings.kernel_layout)
        except Exception as error:  # noqa: BLE001 - recorded; the heads still run
            run.fail(entry, error)
        else:
            report["weight_bytes"]["drafter"] = _tree_bytes(drafter_params)
            run.measure(entry, lambda: timing.in_loop_step(
                drafter_model, drafter_params, 1, settings.batch, fill=settings.fill,
                steps=settings.steps, repeats=settings.repeats))
            del drafter_params

    vocab = target_model.config.vocab_size
    vocabs = [vocab, *settings.head_vocab_sizes]
    ids = {n: random_token_ids(vocab, n, settings.seed + i)
           for i, n in enumerate(settings.head_vocab_sizes)}
    for m_index, mlp in enumerate(settings.intermediate_sizes):
        width = mlp or target_model.config.intermediate_size
        try:
            head = feature_head.FeatureHead(feature_head.FeatureHeadConfig.for_target(
                target_model, intermediate_size=mlp, kernel_layout=settings.kernel_layout))
            net = jax.tree_util.tree_map(lambda x: x.astype(settings.dtype),
                                         head.init_net(jax.random.PRNGKey(settings.seed)))
            report["weight_bytes"][f"feature net mlp={width}"] = _tree_bytes(net)
        except Exception as error:  # noqa: BLE001
            for k in settings.window_widths:
                run.fail({"name": f"feature window K={k} mlp={width}", "role": "feature",
                          "part": "window", "k": k, "intermediate_size": width}, error)
            for v in vocabs:
                run.fail({"name": f"feature draft step V={v} mlp={width}", "role": "feature",
                          "part": "draft", "k": 1, "vocab": v, "intermediate_size": width},
                         error)
            continue
        full_params = feature_head.drafter_params(target_model, target_params, net)
        for k in settings.window_widths:
            run.measure({"name": f"feature window K={k} mlp={width}", "role": "feature",
                         "part": "window", "k": k, "intermediate_size": width},
                        lambda k=k, h=head, p=full_params: time_window(h, p, settings, k))
        for v in vocabs:
            base = {"role": "feature", "k": 1, "vocab": v}
            try:
                params = full_params if v == vocab else feature_head.drafter_params(
                    target_model, target_params, net, token_ids=ids[v])
            except Exception as error:  # noqa: BLE001
                run.fail({**base, "name": f"feature draft step V={v} mlp={width}",
                          "part": "draft", "intermediate_size": width}, error)
                continue
            if m_index == 0:  # the logits do not depend on the MLP
                run.measure({**base, "name": f"feature first logits V={v}", "part": "logits"},
                            lambda h=head, p=params: time_first_logits(h, p, settings))
            run.measure({**base, "name": f"feature draft step V={v} mlp={width}",
                         "part": "draft", "intermediate_size": width},
                        lambda h=head, p=params: time_draft_step(h, p, settings))
            del params
        del full_params, net
    run.say("done")
    run.save()
    timing.print_markdown(markdown(report))
    return report


# -- derived figures -----------------------------------------------------------------------

def _ok(report: dict) -> dict:
    return {s["name"]: s for s in report["steps"] if s.get("status") == "ok"}


def drafters(report: dict) -> list[dict]:
    """Every drafter whose steps were all measured: its kind and the call costs
    (``decode.cost.CallCost``) the round model prices."""
    ok, s = _ok(report), report["settings"]
    found = []
    if "drafter model K=1" in ok:
        found.append({"drafter": f"drafter model ({s['drafter']})", "kind": "model",
                      "step_ms": ok["drafter model K=1"]["step_ms"],
                      "by_width_s": {1: ok["drafter model K=1"]["step_ms"] / 1e3}})
    config = report.get("target_config", {})
    vocabs = [config.get("vocab_size"), *s["head_vocab_sizes"]]
    for mlp in s["intermediate_sizes"]:
        width = mlp or config.get("intermediate_size")
        for v in vocabs:
            draft = ok.get(f"feature draft step V={v} mlp={width}")
            logits = ok.get(f"feature first logits V={v}")
            windows = {k: ok.get(f"feature window K={k} mlp={width}")
                       for k in s["window_widths"]}
            if not draft or not logits or not all(windows.values()):
                continue
            by_width = {1: draft["step_ms"] / 1e3}
            by_width.update({k: (w["step_ms"] + logits["step_ms"]) / 1e3
                             for k, w in windows.items()})
            restricted = "" if v == config.get("vocab_size") else " (restricted)"
            found.append({"drafter": f"feature head V={v}{restricted} mlp={width}",
                          "kind": "feature", "vocab": v, "intermediate_size": width,
                          "step_ms": draft["step_ms"], "by_width_s": by_width})
    return found


def finish(report: dict) -> None:
    """Adds the ratios to the target's one-token step and the predictions
    (whatever has been measured so far)."""
    ok = _ok(report)
    report.pop("predicted", None)
    if "target K=1" not in ok:
        return
    t1 = ok["target K=1"]["step_ms"]
    for entry in report["steps"]:
        if entry.get("status") == "ok":
            entry["of_target_k1"] = entry["step_ms"] / t1
    s = report["settings"]
    target_cost = cost.CallCost.from_steps(
        {e["k"]: e["step_ms"] / 1e3 for e in ok.values() if e["role"] == "target"})
    rows = []
    for d in drafters(report):
        model = cost.CostModel(target=target_cost,
                               drafter=cost.CallCost.from_steps(d["by_width_s"]),
                               round_overhead_s=s["round_overhead_ms"] / 1e3)
        for a in s["acceptance"]:
            for g in s["gammas"]:
                p = predicted_speedup(model, g, d["kind"], a)
                rows.append({"drafter": d["drafter"], "kind": d["kind"], "gamma": g,
                             "acceptance": a, "acceptance_label": acceptance_label(a),
                             "tokens_per_round": p["tokens_per_round"],
                             "round_ms": 1e3 * p["round_s"],
                             "drafting_ms": 1e3 * p["drafting_s"],
                             "drafting_of_target_k1": 1e3 * p["drafting_s"] / t1,
                             "speedup": p["speedup"],
                             "target_width_measured": str(g + 1) in target_cost.by_width_s,
                             "window_width_measured": d["kind"] != "feature" or
                             (g + 1) in d["by_width_s"]})
    report["predicted"] = rows
    report["errors"] = sum(1 for e in report["steps"] if e.get("status") == "error")


def _fmt(value, spec: str = ".3f") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def markdown(report: dict) -> str:
    env, s = report["environment"], report["settings"]
    lines = [f"Feature-head drafting steps, in-loop ({s['steps']} steps per timing, median of "
             f"{s['repeats']}): target {s['target']}, drafter model {s['drafter']}, "
             f"{report['dtype']}, batch {s['batch']}, cache fill {s['fill']}, kernels "
             f"{s['kernel_layout']}; {env['machine']}, jax {env['jax']}"
             f"{', jaxlib ' + env['jaxlib'] if 'jaxlib' in env else ''}, flax {env['flax']}"
             f"{'; driver ' + env['nvidia_smi_query'] if env.get('nvidia_smi_query') else ''}.",
             ""]
    steps = []
    for e in report["steps"]:
        status = e.get("status", "running")
        if status == "error":
            status = "error: " + e["error"][:120].replace("|", "/").replace("\n", " ")
        steps.append((e["name"], e["k"], e.get("vocab", "–"), e.get("intermediate_size", "–"),
                      _fmt(e.get("step_ms")), _fmt(e.get("of_target_k1")),
                      _fmt(e.get("compile_s"), ".1f"), status))
    lines += tables.markdown_table(("step", "K", "head vocab", "MLP", "ms / step",
                                    "of target K=1", "compile s", "status"), steps)
    rows = report.get("predicted") or []
    if rows:
        gammas = s["gammas"]
        by_g = [f"G={g}" for g in gammas]
        names = list(dict.fromkeys(r["drafter"] for r in rows))
        cells = {(r["drafter"], str(r["acceptance"]), r["gamma"]): r for r in rows}
        first = str(rows[0]["acceptance"])
        lines += ["", "Drafting cost per round, ms (feature head: window call of G + 1 + first "
                  "logits + G - 1 draft steps; drafter model: G steps), and as target K=1 "
                  "steps:", ""] + tables.markdown_table(["drafter", *by_g], [
                      [d, *(f"{cells[d, first, g]['drafting_ms']:.2f} "
                            f"({cells[d, first, g]['drafting_of_target_k1']:.2f})"
                            for g in gammas)] for d in names])
        lines += ["", "Predicted speedup over autoregressive decoding (decode.cost; round = target "
                  f"call of G + 1 + drafting, round overhead {s['round_overhead_ms']} ms; "
                  "assumed acceptance):", ""] + tables.markdown_table(
                      ["drafter", "acceptance", *by_g],
                      [[d, acceptance_label(a), *(f"{cells[d, str(a), g]['speedup']:.2f}x"
                                                 for g in gammas)]
                       for d in names for a in s["acceptance"]])
        fitted = sorted({r["gamma"] + 1 for r in rows if not r["target_width_measured"]})
        windows = sorted({r["gamma"] + 1 for r in rows if not r["window_width_measured"]})
        if fitted or windows:
            lines += ["", f"Widths not measured, priced by CallCost's fit: target K in "
                      f"{fitted or '–'}, window K in {windows or '–'}."]
    errors = report.get("errors", 0)
    if errors:
        lines += ["", f"{errors} step(s) failed (their errors are in the JSON report)."]
    return "\n".join(lines)
