"""Quality-vs-latency sweep reports (docs/algorithms.md, 'Evaluation protocol'; Table 2
and Figures 2-3 of Narasimhan et al., *Faster Cascades via Speculative Decoding*).

A sweep is a list of *records*, one per sweep point (a method at one lenience ``alpha``), as
stored in a JSON file ``{"settings": {...}, "records": [...]}``::

    {"method": "opt", "alpha": 0.3, "gamma": 5, "temperature": 0.0,
     "task": "humaneval", "metric": "pass@1", "num_examples": 30,
     "quality": {"score": 43.3, "low": 26.7, "high": 60.0},      # 95% bootstrap CI
     "relative_latency": {"cost_model": 0.71, "wallclock": 0.75},  # target AR at batch 1 = 1.0
     "rejection_rate": 0.12, "deferral_rate": 0.05,
     "calls": {"target": 1234, "drafter": 4567}, "tokens": 4800}

``drafter`` and ``target`` are the two autoregressive baselines. Records are grouped by
(task, temperature, gamma); a record whose ``gamma`` is None does not depend on the block size
(the autoregressive baselines, the sequence-level cascade) and is shown in every block-size
group of its (task, temperature). A record with a ``tree`` (a token tree drafted per round)
forms the group "tree <spec>" of its (task, temperature).

Everything here is a pure function of the records: the tables are Markdown strings or lists of
dicts, and the plots are PNG files. matplotlib is optional (the ``eval`` extra) and imported
only when a plot is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdec_jax.jobs import tables
from specdec_jax.runtime import jsonio

# --- record schema ---------------------------------------------------------------------------

DRAFTER = "drafter"
TARGET = "target"
AR_BASELINES = (DRAFTER, TARGET)

REQUIRED_KEYS = ("method", "alpha", "gamma", "temperature", "task", "metric", "quality",
                 "relative_latency", "rejection_rate", "deferral_rate", "calls")
# Keys inside the nested dicts; ``relative_latency.wallclock`` is optional (None when the sweep
# was not timed), so it is not listed.
REQUIRED_NESTED = {
    "quality": ("score", "low", "high"),
    "relative_latency": ("cost_model",),
    "calls": ("target", "drafter"),
}
LATENCY_SOURCES = ("cost_model", "wallclock")
LATENCY_SOURCE_NAMES = {"cost_model": "cost model", "wallclock": "wall clock"}

# --- Table 2 ---------------------------------------------------------------------------------

# Relative latency of the target's own autoregressive run: every latency is normalised by it.
TARGET_RELATIVE_LATENCY = 1.0
# Slack for float noise when comparing a point with the target (a lossless method timed by the
# cost model can come out at 1.0000000001 rather than 1.0).
COMPARISON_TOLERANCE = 1e-9

# --- presentation ----------------------------------------------------------------------------

# Display order (baselines first, then the Faster Cascades paper's order); unknown methods
# follow alphabetically.
METHOD_ORDER = (
    TARGET, DRAFTER, "specdecode", "blockverify", "lossy", "lossy-tuned", "seq-cascade",
    "token-cascade", "oracle", "bild-original", "bild", "chow", "diff", "difflog", "opt",
    "optlog", "token-v1", "token-v2", "token-v3",
)
# The speculative-cascades paper's names for the methods (its tables and legends);
# other methods keep their key.
METHOD_LABELS = {
    TARGET: "Target (AR)",
    DRAFTER: "Drafter (AR)",
    "specdecode": "SpecDecode",
    "blockverify": "BlockVerify",
    "lossy": "SpecDecode [Lossy]",
    "lossy-tuned": "SpecDecode [Lossy, tuned β]",
    "seq-cascade": "SeqCascade [Chow]",
    "seq-cascade-norm": "SeqCascade [Chow, length-normalised]",
    "token-cascade": "TokenCascade [Chow]",
    "oracle": "Oracle cascade",
    "bild-original": "BiLD",
    "bild": "BiLD*",
    "chow": "SpecCascade [Chow]",
    "diff": "SpecCascade [Diff]",
    "difflog": "SpecCascade [DiffLog]",
    "opt": "SpecCascade [OPT]",
    "optlog": "SpecCascade [OPTLog]",
    "token-v1": "SpecCascade [TokenV1]",
    "token-v2": "SpecCascade [TokenV2]",
    "token-v3": "SpecCascade [Token]",
}
MISSING = "—"
SCORE_DIGITS = 2
SCORE_FORMAT = f"{{:.{SCORE_DIGITS}f}}"
LATENCY_FORMAT = "{:.3f}"
RATE_FORMAT = "{:.3f}"
SPEEDUP_FORMAT = "{:.2f}×"
PERCENT_FORMAT = "{:.1f} %"

X_CHOICES = ("relative_latency", "rejection_rate")
REJECTION_XLABEL = "Rejection rate"
PANEL_SIZE_INCHES = (5.5, 4.0)
MAX_PANEL_COLUMNS = 2  # as the Faster Cascades paper: two plots per row, a readable legend
LEGEND_COLUMNS = 3
PLOT_DPI = 120
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "p", "*")
METHOD_COLORMAPS = ("tab10", "tab20")  # tab10 while it has enough colours: tab20 pairs shades
TARGET_COLOR = "black"
DRAFTER_COLOR = "dimgray"
TARGET_BAND_ALPHA = 0.12  # opacity of the shaded band showing the target's CI
ERRORBAR_CAPSIZE = 2.5

EVAL_EXTRA_HINT = 'pip install -e ".[eval]"'

GroupKey = tuple[str, float, Any]  # (task, temperature, gamma or None)


# --- validation and access -------------------------------------------------------------------

def _name(record: dict) -> str:
    """How an error message names a record: its method and alpha."""
    return f"method={record.get('method')!r}, alpha={record.get('alpha')!r}"


def validate_record(record: dict) -> dict:
    """Return ``record`` unchanged if it has every key the reports read, else raise ValueError.

    The message names the missing key and the record's method and alpha, so a bad entry in a
    sweep file of hundreds of points can be found.
    """
    if not isinstance(record, dict):
        raise ValueError(f"a sweep record must be a dict, got {type(record).__name__}.")
    for key in REQUIRED_KEYS:
        if key not in record:
            raise ValueError(f"sweep record ({_name(record)}) is missing required key {key!r}.")
    for key, inner in REQUIRED_NESTED.items():
        value = record[key]
        if not isinstance(value, dict):
            raise ValueError(f"sweep record ({_name(record)}): {key!r} must be a dict with keys "
                             f"{list(inner)}, got {value!r}.")
        for sub in inner:
            if sub not in value:
                raise ValueError(f"sweep record ({_name(record)}) is missing required key "
                                 f"'{key}.{sub}'.")
    for sub in REQUIRED_NESTED["quality"]:
        if record["quality"][sub] is None:
            raise ValueError(f"sweep record ({_name(record)}): 'quality.{sub}' is None.")
    return record


def _validated(records: Iterable[dict]) -> list[dict]:
    records = [validate_record(r) for r in records]
    if not records:
        raise ValueError("no sweep records to report on.")
    return records


def latency_of(record: dict, source: str = "cost_model") -> float:
    """The record's latency relative to the target's autoregressive run, from ``source``.

    ``source`` is ``"cost_model"`` (the calibrated per-call cost model) or ``"wallclock"``
    (measured). A source the sweep did not fill in (None or absent) raises ValueError rather
    than silently mixing the two in one table.
    """
    if source not in LATENCY_SOURCES:
        raise ValueError(f"unknown latency source {source!r}; expected one of {LATENCY_SOURCES}.")
    latencies = record.get("relative_latency")
    if not isinstance(latencies, dict):
        raise ValueError(f"sweep record ({_name(record)}) is missing required key "
                         "'relative_latency'.")
    value = latencies.get(source)
    if value is None:
        hint = " (was the sweep run without timing?)" if source == "wallclock" else ""
        raise ValueError(f"sweep record ({_name(record)}) has no {source!r} relative latency"
                         f"{hint}; pass latency='cost_model' or 'wallclock' accordingly.")
    return float(value)


def _wallclock(record: dict) -> float | None:
    return record["relative_latency"].get("wallclock")


def method_label(method: str) -> str:
    """The speculative-cascades paper's display name for ``method`` (the key itself
    when it has none)."""
    return METHOD_LABELS.get(method, method)


def _method_rank(method: str) -> tuple[int, str]:
    order = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)
    return order, method


def _alpha_rank(alpha: Any) -> tuple[int, float]:
    return (0, 0.0) if alpha is None else (1, float(alpha))


def _record_rank(record: dict) -> tuple:
    return _method_rank(record["method"]), _alpha_rank(record["alpha"])


TREE_GROUP = "tree "  # a token tree's group: "tree 3,2,1,1" in place of a gamma


def _draft_key(record: dict) -> Any:
    """A record's draft shape in its group key: its gamma, or ``"tree <spec>"``
    for a record that drafted a token tree (``tree``; its gamma is None, but it
    depends on the tree: a group of its own, not every block-size group)."""
    return f"{TREE_GROUP}{record['tree']}" if record.get("tree") else record["gamma"]


def _group_rank(key: GroupKey) -> tuple:
    task, temperature, gamma = key
    draft = (1, 0, gamma) if isinstance(gamma, str) else (0, -1 if gamma is None else gamma, "")
    return task, float(temperature), draft


def _groups(records: Sequence[dict]) -> list[tuple[GroupKey, list[dict]]]:
    """Records grouped by (task, temperature, gamma), each group sorted by method then alpha.

    A record with ``gamma`` None does not depend on the block size, so it joins every
    block-size group of its (task, temperature); when that (task, temperature) has no
    block-size group it forms its own group with gamma None.
    """
    by_key: dict[GroupKey, list[dict]] = {}
    shared: dict[tuple[str, float], list[dict]] = {}
    for record in records:
        task, temperature, gamma = record["task"], float(record["temperature"]), \
            _draft_key(record)
        if gamma is None:
            shared.setdefault((task, temperature), []).append(record)
        else:
            by_key.setdefault((task, temperature, gamma), []).append(record)
    for (task, temperature), extra in shared.items():
        keys = [k for k in by_key if k[:2] == (task, temperature)]
        if not keys:
            keys = [(task, temperature, None)]
            by_key[keys[0]] = []
        for key in keys:
            by_key[key].extend(extra)
    return [(key, sorted(by_key[key], key=_record_rank)) for key in sorted(by_key, key=_group_rank)]


def _group_metric(key: GroupKey, group: Sequence[dict]) -> str:
    metrics = sorted({str(r["metric"]) for r in group})
    if len(metrics) != 1:
        raise ValueError(f"task {key[0]!r} mixes quality metrics {metrics}; one metric per task.")
    return metrics[0]


def _group_title(key: GroupKey, metric: str) -> str:
    task, temperature, gamma = key
    if isinstance(gamma, str):  # a token tree's group
        return f"{task} ({metric}), T={temperature:g}, {gamma}"
    gamma_text = MISSING if gamma is None else gamma
    return f"{task} ({metric}), T={temperature:g}, γ={gamma_text}"


def _baseline(key: GroupKey, group: Sequence[dict], method: str, *, required: bool) -> dict | None:
    """The group's single ``method`` run (target or drafter); None if absent and not required."""
    found = [r for r in group if r["method"] == method]
    if len(found) > 1:
        raise ValueError(f"group {_group_title(key, group[0]['metric'])} has {len(found)} "
                         f"{method!r} runs; keep one autoregressive {method} run per group.")
    if not found:
        if required:
            raise ValueError(f"group {_group_title(key, group[0]['metric'])} has no 'target' "
                             "record: Table 2 needs the autoregressive target run (method "
                             "'target') for its quality and latency reference.")
        return None
    return found[0]


def _methods(group: Sequence[dict]) -> list[str]:
    """The non-baseline methods of a group, in display order."""
    return sorted({r["method"] for r in group if r["method"] not in AR_BASELINES},
                  key=_method_rank)


# --- formatting ------------------------------------------------------------------------------

def _fmt(value: Any, template: str) -> str:
    return MISSING if value is None else template.format(float(value))


def _fmt_quality(score: float | None, low: float | None, high: float | None) -> str:
    if score is None:
        return MISSING
    return tables.format_ci(float(score), (float(low), float(high)), digits=SCORE_DIGITS)


def _fmt_alpha(alpha: Any) -> str:
    return MISSING if alpha is None else f"{float(alpha):g}"


def _fmt_count(value: Any) -> str:
    return MISSING if value is None else str(int(value))


# --- the full sweep table --------------------------------------------------------------------

SWEEP_COLUMNS = ("method", "alpha", "quality [95% CI]", "rel. latency (cost model)",
                 "rel. latency (wall clock)", "rejection rate", "deferral rate", "target calls",
                 "drafter calls")


def markdown_table(records: Sequence[dict], *, latency: str = "cost_model") -> str:
    """Every sweep point as a Markdown table, one section per (task, temperature, gamma).

    Rows are sorted by method (baselines first) then alpha. Both latency columns are shown so
    the calibrated cost model can be read against the wall clock; ``latency`` names the one
    Table 2 and the plots use, stated in the caption.
    """
    if latency not in LATENCY_SOURCES:
        raise ValueError(f"unknown latency source {latency!r}; expected one of {LATENCY_SOURCES}.")
    records = _validated(records)
    lines = [f"Relative latency: the target's autoregressive run at batch 1 = 1.00. Table 2 and "
             f"the plots use the {LATENCY_SOURCE_NAMES[latency]} column."]
    for key, group in _groups(records):
        lines += ["", f"#### {_group_title(key, _group_metric(key, group))}", ""]
        rows = []
        for r in group:
            q = r["quality"]
            rows.append((
                r["method"], _fmt_alpha(r["alpha"]), _fmt_quality(q["score"], q["low"], q["high"]),
                _fmt(r["relative_latency"]["cost_model"], LATENCY_FORMAT),
                _fmt(_wallclock(r), LATENCY_FORMAT),
                _fmt(r["rejection_rate"], RATE_FORMAT), _fmt(r["deferral_rate"], RATE_FORMAT),
                _fmt_count(r["calls"]["target"]), _fmt_count(r["calls"]["drafter"]),
            ))
        lines += tables.markdown_table(SWEEP_COLUMNS, rows)
    return "\n".join(lines) + "\n"


# --- Table 2 ---------------------------------------------------------------------------------

def _intervals_overlap(a_low: float, a_high: float, b_low: float, b_high: float) -> bool:
    return max(a_low, b_low) <= min(a_high, b_high)


def table2(records: Sequence[dict], *, latency: str = "cost_model") -> list[dict]:
    """Table 2 of the speculative-cascades paper (Narasimhan et al.): one row per
    (task, temperature, gamma) and method (not baselines).

    (i) *Matching the target's quality*: among the method's points scoring at least the
    target's score, the one with the smallest relative latency ``L``; ``speedup = 1 / L`` (the
    paper's "1.95×") and ``reduction = 1 - L``. None when no point reaches the target's quality.

    (ii) *Best quality without exceeding the target's latency*: the highest-scoring point with
    ``L <= 1`` (ties: the faster one), with its CI and alpha. ``best_ci_overlaps_target`` says
    whether its 95% CI overlaps the target's: when it does, a "beats the target" claim is not
    statistically supported (overlap is the conservative reading, not a formal test).

    Raises ValueError when a group has no ``target`` record.
    """
    records = _validated(records)
    rows = []
    for key, group in _groups(records):
        metric = _group_metric(key, group)
        target = _baseline(key, group, TARGET, required=True)
        t_quality = target["quality"]
        t_score = float(t_quality["score"])
        task, temperature, gamma = key
        for method in _methods(group):
            points = [(r, latency_of(r, latency)) for r in group if r["method"] == method]
            row: dict[str, Any] = {
                "task": task, "temperature": temperature, "gamma": gamma, "metric": metric,
                "method": method, "label": method_label(method), "latency_source": latency,
                "num_points": len(points), "target_score": t_score,
                "target_low": float(t_quality["low"]), "target_high": float(t_quality["high"]),
            }
            matching = [(r, lat) for r, lat in points
                        if float(r["quality"]["score"]) >= t_score - COMPARISON_TOLERANCE]
            if matching:
                r, lat = min(matching, key=lambda p: (p[1], -float(p[0]["quality"]["score"])))
                row.update(match_alpha=r["alpha"], match_latency=lat,
                           speedup=(1.0 / lat if lat > 0 else math.inf), reduction=1.0 - lat)
            else:
                row.update(match_alpha=None, match_latency=None, speedup=None, reduction=None)
            within = [(r, lat) for r, lat in points
                      if lat <= TARGET_RELATIVE_LATENCY + COMPARISON_TOLERANCE]
            if within:
                r, lat = max(within, key=lambda p: (float(p[0]["quality"]["score"]), -p[1]))
                q = r["quality"]
                row.update(
                    best_alpha=r["alpha"], best_latency=lat, best_score=float(q["score"]),
                    best_low=float(q["low"]), best_high=float(q["high"]),
                    best_beats_target=float(q["score"]) > t_score,
                    best_ci_overlaps_target=_intervals_overlap(
                        float(q["low"]), float(q["high"]), row["target_low"], row["target_high"]),
                )
            else:
                row.update(best_alpha=None, best_latency=None, best_score=None, best_low=None,
                           best_high=None, best_beats_target=None, best_ci_overlaps_target=None)
            rows.append(row)
    return rows


TABLE2_COLUMNS = ("method", "speedup at target quality", "latency reduction", "α (match)",
                  "best quality at latency ≤ 1 [95% CI]", "α (best)", "latency (best)",
                  "vs target")


def _verdict(row: dict) -> str:
    """Whether the best point beats the target, and whether the CIs say that is significant."""
    if row["best_score"] is None:
        return MISSING
    if not row["best_beats_target"]:
        return "below target" if row["best_score"] < row["target_score"] else "ties target"
    if row["best_ci_overlaps_target"]:
        return "above target (CIs overlap: not significant)"
    return "above target (CIs disjoint)"


def table2_markdown(rows: Sequence[dict]) -> str:
    """Table 2 rows (from ``table2``) as Markdown, one section per (task, temperature, gamma)."""
    if not rows:
        return "No methods besides the autoregressive baselines: Table 2 is empty.\n"
    sections: dict[tuple, list[dict]] = {}
    for row in rows:
        sections.setdefault((row["task"], row["temperature"], row["gamma"]), []).append(row)
    source = LATENCY_SOURCE_NAMES.get(rows[0]["latency_source"], rows[0]["latency_source"])
    lines = [f"Latency relative to the target's autoregressive run ({source}). Speedup = 1 / "
             "latency of the fastest point whose score reaches the target's; "
             f"{MISSING} = no point reaches it."]
    for key, section in sections.items():
        first = section[0]
        target = _fmt_quality(first["target_score"], first["target_low"], first["target_high"])
        lines += ["", f"#### {_group_title(key, first['metric'])}: target {target}", ""]
        body = [(
            r["label"], _fmt(r["speedup"], SPEEDUP_FORMAT),
            MISSING if r["reduction"] is None else PERCENT_FORMAT.format(100.0 * r["reduction"]),
            _fmt_alpha(r["match_alpha"]), _fmt_quality(r["best_score"], r["best_low"],
                                                       r["best_high"]),
            _fmt_alpha(r["best_alpha"]), _fmt(r["best_latency"], LATENCY_FORMAT), _verdict(r),
        ) for r in section]
        lines += tables.markdown_table(TABLE2_COLUMNS, body)
    return "\n".join(lines) + "\n"


# --- cost model vs wall clock ----------------------------------------------------------------

def agreement(records: Sequence[dict]) -> dict:
    """How well the calibrated cost model predicts the measured wall clock.

    Uses the records that carry both latencies, except ``target`` runs (1.0 in both by
    definition, so they would flatter the fit). Returns ``count``, ``mean_ratio`` (mean of
    wall clock / cost model), ``max_abs_rel_diff`` (max of |cost model - wall clock| / wall
    clock, i.e. relative to the measurement) and ``pearson`` (correlation of the two, None
    when fewer than 3 points or either is constant); the statistics are None when count is 0.
    """
    records = _validated(records)
    # Compare like with like: the wall clock times a subset of examples, so the cost
    # model's prediction on that same subset (``cost_model_subset``) is used when the
    # sweep recorded it (outputs differ in length between methods and examples).
    predicted = lambda r: r["relative_latency"].get("cost_model_subset",
                                                    r["relative_latency"]["cost_model"])
    pairs = [(float(predicted(r)), float(_wallclock(r)))
             for r in records
             if r["method"] != TARGET and predicted(r) is not None
             and _wallclock(r) is not None]
    result: dict[str, Any] = {"count": len(pairs), "mean_ratio": None,
                              "max_abs_rel_diff": None, "pearson": None}
    if not pairs:
        return result
    cost, wall = (np.asarray(v, np.float64) for v in zip(*pairs))
    result["mean_ratio"] = float(np.mean(wall / cost))
    result["max_abs_rel_diff"] = float(np.max(np.abs(cost - wall) / wall))
    if len(pairs) >= 3 and np.std(cost) > 0 and np.std(wall) > 0:
        result["pearson"] = float(np.corrcoef(cost, wall)[0, 1])
    return result


def agreement_markdown(stats: dict) -> str:
    """One sentence stating the cost model's agreement with the wall clock (from ``agreement``)."""
    if not stats["count"]:
        return "No sweep point has both a cost-model and a wall-clock latency to compare.\n"
    pearson = MISSING if stats["pearson"] is None else f"{stats['pearson']:.3f}"
    points = "point" if stats["count"] == 1 else "points"
    return (f"Cost model vs measured wall clock (batch 1, on the wall-clock examples) over "
            f"{stats['count']} sweep {points} (target runs "
            f"excluded): mean ratio wall clock / cost model = {stats['mean_ratio']:.3f}, "
            f"max |relative difference| = {100.0 * stats['max_abs_rel_diff']:.1f} %, "
            f"Pearson r = {pearson}.\n")


# --- plots -----------------------------------------------------------------------------------

def _x_value(record: dict, x: str, latency: str) -> float | None:
    if x == "relative_latency":
        return latency_of(record, latency)
    value = record["rejection_rate"]
    return None if value is None else float(value)


def plot_tradeoffs(records: Sequence[dict], path: str | Path, *, x: str = "relative_latency",
                   latency: str = "cost_model") -> Path:
    """Quality against relative latency or rejection rate, as Narasimhan et al.'s Figures 2-3
    (a PNG).

    One panel per (task, temperature, gamma). Each method is a line through its alpha sweep,
    sorted by x, with the quality CI as error bars; points without an x value (the rejection
    rate of a sequential cascade) are left out. The target's quality is a labelled horizontal
    dotted line over a shaded band for its CI; the drafter is a point when it has an x value,
    else a dashed line. One legend for all panels sits below them.

    Drawn on matplotlib's non-interactive Agg canvas without touching pyplot's global backend,
    so it works headless and leaves an interactive session's backend alone.
    """
    if x not in X_CHOICES:
        raise ValueError(f"unknown x {x!r}; expected one of {X_CHOICES}.")
    if latency not in LATENCY_SOURCES:
        raise ValueError(f"unknown latency source {latency!r}; expected one of {LATENCY_SOURCES}.")
    records = _validated(records)
    try:
        import matplotlib  # noqa: F401  (the eval extra)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(f"plotting needs matplotlib: {EVAL_EXTRA_HINT}") from err

    groups = _groups(records)
    all_methods = sorted({r["method"] for r in records if r["method"] not in AR_BASELINES},
                         key=_method_rank)
    colormap = matplotlib.colormaps[METHOD_COLORMAPS[0 if len(all_methods) <= 10 else 1]]
    style = {m: (colormap(i % colormap.N), MARKERS[i % len(MARKERS)])
             for i, m in enumerate(all_methods)}
    xlabel = (f"Latency relative to target ({LATENCY_SOURCE_NAMES[latency]})"
              if x == "relative_latency" else REJECTION_XLABEL)

    columns = min(len(groups), MAX_PANEL_COLUMNS)
    panel_rows = math.ceil(len(groups) / columns)
    width, height = PANEL_SIZE_INCHES
    figure = Figure(figsize=(width * columns, height * panel_rows))
    FigureCanvasAgg(figure)
    axes = figure.subplots(panel_rows, columns, squeeze=False).ravel()
    legend: dict[str, Any] = {}
    for ax, (key, group) in zip(axes, groups):
        metric = _group_metric(key, group)
        target = _baseline(key, group, TARGET, required=False)
        drafter = _baseline(key, group, DRAFTER, required=False)
        if target is not None:
            tq = target["quality"]
            label = f"{METHOD_LABELS[TARGET]}: {SCORE_FORMAT.format(tq['score'])}"
            ax.axhspan(tq["low"], tq["high"], color=TARGET_COLOR, alpha=TARGET_BAND_ALPHA, lw=0)
            legend[METHOD_LABELS[TARGET]] = ax.axhline(tq["score"], color=TARGET_COLOR,
                                                       linestyle=":")
            ax.annotate(label, xy=(1.0, tq["score"]), xycoords=("axes fraction", "data"),
                        xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom",
                        fontsize="small", color=TARGET_COLOR)
        for method in _methods(group):
            points = [(_x_value(r, x, latency), r["quality"]) for r in group
                      if r["method"] == method]
            points = sorted((p for p in points if p[0] is not None), key=lambda p: p[0])
            if not points:
                continue
            xs = [p[0] for p in points]
            ys = [float(p[1]["score"]) for p in points]
            yerr = [[max(0.0, y - float(p[1]["low"])) for y, p in zip(ys, points)],
                    [max(0.0, float(p[1]["high"]) - y) for y, p in zip(ys, points)]]
            color, marker = style[method]
            label = method_label(method)
            handle = ax.errorbar(xs, ys, yerr=yerr, color=color, marker=marker, markersize=4,
                                 linewidth=1.2, capsize=ERRORBAR_CAPSIZE, label=label)
            legend.setdefault(label, handle)
        if drafter is not None:
            dq = drafter["quality"]
            dx = _x_value(drafter, x, latency)
            if dx is None:
                handle = ax.axhline(dq["score"], color=DRAFTER_COLOR, linestyle="--")
                ax.annotate(f"{METHOD_LABELS[DRAFTER]}: {SCORE_FORMAT.format(dq['score'])}",
                            xy=(1.0, dq["score"]), xycoords=("axes fraction", "data"),
                            xytext=(-4, 3), textcoords="offset points", ha="right",
                            va="bottom", fontsize="small", color=DRAFTER_COLOR)
            else:
                handle = ax.errorbar([dx], [dq["score"]], color=DRAFTER_COLOR, marker="*",
                                     markersize=10, linestyle="none", capsize=ERRORBAR_CAPSIZE,
                                     yerr=[[max(0.0, dq["score"] - dq["low"])],
                                           [max(0.0, dq["high"] - dq["score"])]])
            legend[METHOD_LABELS[DRAFTER]] = handle
        ax.set_title(_group_title(key, metric), fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    figure.tight_layout()
    if legend:
        figure.legend(list(legend.values()), list(legend), loc="upper center",
                      bbox_to_anchor=(0.5, 0.0), ncol=min(LEGEND_COLUMNS, len(legend)),
                      frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=PLOT_DPI, bbox_inches="tight")  # "tight" keeps the legend below
    return path


# --- files -----------------------------------------------------------------------------------

def load_sweep(path: str | Path) -> tuple[dict, list[dict]]:
    """Read a sweep file ``{"settings": {...}, "records": [...]}``: (settings, records)."""
    data = jsonio.read_json(path)
    if not isinstance(data, dict) or "records" not in data:
        raise ValueError(f"{path}: expected a JSON object with a 'records' list.")
    return data.get("settings", {}), [validate_record(r) for r in data["records"]]


def write_reports(records: Sequence[dict], out_dir: str | Path, *, stem: str,
                  latency: str = "cost_model", sandbox: str | None = None) -> dict[str, Path]:
    """Write ``<stem>.md`` (agreement, Table 2, every point) and the two trade-off PNGs.
    ``sandbox``: how executed samples were isolated (pass@1 tasks), stated under the title.

    Returns ``{"markdown": ..., "latency_plot": ..., "rejection_plot": ...}``. The Markdown
    links the figures by file name, so the three files can move together.
    """
    records = _validated(records)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "markdown": out_dir / f"{stem}.md",
        "latency_plot": out_dir / f"{stem}_latency.png",
        "rejection_plot": out_dir / f"{stem}_rejection.png",
    }
    plot_tradeoffs(records, paths["latency_plot"], x="relative_latency", latency=latency)
    plot_tradeoffs(records, paths["rejection_plot"], x="rejection_rate", latency=latency)
    text = "\n".join([
        f"# Quality vs latency: {stem}", "",
        *([f"Executed samples were isolated by: {sandbox}.", ""] if sandbox else []),
        "## Cost model vs wall clock", "", agreement_markdown(agreement(records)),
        "## Table 2: speedup at the target's quality, best quality within its latency", "",
        table2_markdown(table2(records, latency=latency)),
        "## Trade-off plots", "",
        f"![quality vs latency]({paths['latency_plot'].name})", "",
        f"![quality vs rejection rate]({paths['rejection_plot'].name})", "",
        "## Every sweep point", "", markdown_table(records, latency=latency),
    ])
    paths["markdown"].write_text(text)
    return paths
