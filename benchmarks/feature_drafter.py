"""The feature draft head against the other drafters on a real pair
(Qwen2.5-Coder 1.5B target; the 0.5B drafter, Max-Gram and their horizontal
cascade; HumanEval prompts).

Figures, per drafter and temperature:
* counted (batched; rows are independent): target calls, tokens emitted,
  the accepted-drafts histogram; tokens per target call with a 95% normal CI
  over prompts; at T = 0 whether every output equals the target's own greedy
  output (it must);
* wall clock at batch 1 on a subset, prefill included, every configuration
  timed interleaved prompt by prompt (``shared.wallclock``): the speedup over
  the autoregressive target per prompt, mean with a 95% CI;
* predicted accelerator speedup: the counted calls priced with in-loop step
  costs measured on a GPU from random weights of the same shapes
  (``benchmarks/configs/feature_steps.gin``'s JSON): ``AR seconds / (target calls
  x t_target(G + 1) + drafter calls x their step)``, labelled as predicted.

    python -m benchmarks.main --gin_file=benchmarks/configs/feature_drafter.gin \\
        --gin.HEAD="'results/feature_head/head'"
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import shared
from specdec_jax import api, precision
from specdec_jax.checkpoints.feature_head_io import load_feature_head
from specdec_jax.data import bigram
from specdec_jax.decode import cost as cost_lib
from specdec_jax.drafting import MaxGramDrafter, ModelDrafter, cs_drafter
from specdec_jax.jobs import tables
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm

CONFIGS = ("feature", "drafter", "mag", "drafter+mag")
PHASES = ("counted", "wallclock", "report")
AR = "autoregressive"


def _check(*, num_prompts, max_new_tokens, gamma, batch_size, wallclock_prompts, configs,
           temperatures, phases, cascade_split):
    shared.check_at_least(1, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                          gamma=gamma, batch_size=batch_size)
    shared.check_at_least(0, wallclock_prompts=wallclock_prompts)
    shared.check_humaneval_prompts(num_prompts=num_prompts)
    if wallclock_prompts > num_prompts:
        raise ValueError(f"wallclock_prompts={wallclock_prompts} exceeds num_prompts="
                         f"{num_prompts}; time a subset of the counted prompts.")
    shared.check_choices("configs", configs, CONFIGS)
    shared.check_choices("phases", phases, PHASES)
    shared.check_temperatures("temperatures", temperatures)
    if len(cascade_split) != 2 or min(cascade_split) < 1:
        raise ValueError(f"cascade_split must be two positive segment lengths (0.5B tokens, "
                         f"Max-Gram tokens), got {cascade_split!r}.")


def build_drafters(configs, *, drafter_name, drafter_model, feature_drafter, vocab, gamma,
                   cascade_split) -> dict:
    """label -> (drafter, gamma) for the configurations asked for."""
    mag = MaxGramDrafter(vocab)
    neural = ModelDrafter(drafter_model, name=drafter_name)
    table = {"feature": (feature_drafter, gamma), "drafter": (neural, gamma),
             "mag": (mag, gamma + 1),
             "drafter+mag": (cs_drafter([[cascade_split[0], cascade_split[1]], [0, 0]],
                                        [neural, mag]), sum(cascade_split))}
    return {label: table[label] for label in configs}


def counted(fn, target_params, named, prompts, width, temperature, batch_size, seed=0):
    """Per-prompt counters of one configuration, in batches of ``batch_size``."""
    sp = api.sampling_params(temperature=temperature)
    rows = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        padded = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one compiled shape
        out = fn(target_params, named, make_prompt(padded, pad_to=width),
                 jax.random.PRNGKey(seed * 1000 + start), sp)
        stats = jax.device_get(out.stats)
        tokens = np.asarray(out.tokens)
        for row in range(len(chunk)):
            length = int(out.lengths[row])
            rows.append({
                "tokens": tokens[row, :length].tolist(),
                "target_calls": int(stats.target_calls[row]),
                "target_fed": int(stats.target_fed[row]),
                "target_single_calls": int(stats.target_single_calls[row]),
                "drafter_calls_by_model": stats.drafter_calls_by_model[row].tolist(),
                "drafter_tokens_by_model": stats.drafter_tokens_by_model[row].tolist(),
                "drafter_single_calls_by_model":
                    stats.drafter_single_calls_by_model[row].tolist(),
                "histogram": stats.accepted_histogram[row].tolist()})
    return rows


def summarize(rows, ar_rows=None) -> dict:
    per_call = [len(r["tokens"]) / max(r["target_calls"], 1) for r in rows]
    mean, half = tables.mean_ci(per_call)
    summary = {"tokens_per_target_call": mean, "ci95": half,
               "tokens": int(sum(len(r["tokens"]) for r in rows)),
               "target_calls": int(sum(r["target_calls"] for r in rows)),
               "histogram": np.sum([r["histogram"] for r in rows], axis=0).tolist()}
    if ar_rows is not None:
        summary["identical_to_target"] = all(a["tokens"] == b["tokens"]
                                             for a, b in zip(rows, ar_rows))
    return summary


def gpu_costs(path: str, *, head_vocab: int, intermediate_size: int) -> dict:
    """Call costs from a GPU feature-steps report (``bench_feature_steps``):
    ``{"target", "drafter", "feature": CallCost}``. The feature head is priced
    with the measured variant of its MLP width and the smallest measured head
    at least as wide as its own (``head_vocab`` 0: the full head); its window
    call adds the first logits, which the window step does not include."""
    with open(path) as f:
        steps = {s["name"]: s["step_ms"] / 1e3 for s in json.load(f)["steps"]
                 if s.get("status") == "ok"}

    def pick(prefix):
        return {int(name.split("K=")[1]): sec for name, sec in steps.items()
                if name.startswith(prefix)}

    vocabs = sorted(int(n.split("V=")[1].split()[0]) for n in steps
                    if n.startswith("feature first logits"))
    wide = [v for v in vocabs if v >= head_vocab] if head_vocab else vocabs[-1:]
    if not wide:
        raise ValueError(f"{path} has no feature-head timing with >= {head_vocab} ids.")
    v, m = wide[0], intermediate_size
    draft = steps.get(f"feature draft step V={v} mlp={m}")
    window = steps.get(f"feature window K=6 mlp={m}")
    if draft is None or window is None:
        raise ValueError(f"{path} has no feature-head timing for MLP width {m} (V={v}); "
                         "rerun benchmarks/configs/feature_steps.gin with that width.")
    return {"target": cost_lib.CallCost.from_steps(pick("target K=")),
            "drafter": cost_lib.CallCost.from_steps(pick("drafter model K=")),
            "feature": cost_lib.CallCost.from_steps(
                {1: draft, 6: window + steps[f"feature first logits V={v}"]}),
            "feature_variant": f"V={v} mlp={m}"}


def predicted_speedup(rows, costs: dict, drafter_costs: Sequence[str]) -> float:
    """AR seconds over the counted calls priced with ``costs`` (``target`` and
    one entry per drafter model, named by ``drafter_costs``; ``CostModel.price``)."""
    model = cost_lib.CostModel(target=costs["target"], drafter=costs["drafter"], models=costs)
    tokens = sum(len(r["tokens"]) for r in rows)
    spent = sum(model.price(r, drafters=drafter_costs) for r in rows)
    return model.predicted_speedup(tokens_per_round=tokens, round_s=spent)


def markdown(report: dict) -> str:
    proto = report["protocol"]
    lines = [f"# Feature draft head vs other drafters ({report['target']}, HumanEval "
             f"{proto['num_prompts']} prompts x {proto['max_new_tokens']} tokens, G = "
             f"{proto['gamma']})", "",
             f"Machine: {report['environment'].get('machine', '?')}; precision "
             f"{report.get('precision')}; head {report['head']}.", ""]
    rows = []
    for temp, block in sorted(report.get("counted", {}).items()):
        wall = report.get("wallclock", {}).get(temp, {})
        for label, summary in block.items():
            if label == AR:
                continue
            ident = summary.get("identical_to_target")
            pred = summary.get("predicted_gpu_speedup")
            measured = wall.get(label)
            rows.append((temp, label, tables.format_ci(summary["tokens_per_target_call"],
                                                       summary["ci95"], digits=2),
                         "" if ident is None else ("yes" if ident else "NO"),
                         "" if pred is None else f"{pred:.2f}x",
                         tables.format_ci(*measured, digits=2, unit="x") if measured else ""))
    lines += tables.markdown_table(
        ("T", "drafter", "tokens / target call (95% CI)", "identical to target (T=0)",
         "predicted GPU speedup", "measured CPU speedup (95% CI)"), rows)
    if report.get("gpu_steps"):
        lines += ["", f"Predicted GPU speedups price the counted calls with in-loop step costs "
                  f"from {report['gpu_steps']} (random weights of the real shapes); modelled, "
                  "not measured."]
    return "\n".join(lines)


def run_bench_feature_drafter(*, head: str, target: str = "qwen2.5-coder-1.5b",
                              drafter: str = "qwen2.5-coder-0.5b", num_prompts: int = 40,
                              max_new_tokens: int = 128, gamma: int = 5,
                              temperatures: Sequence[float] = (0.0, 1.0),
                              batch_size: int = 8, wallclock_prompts: int = 8,
                              configs: Sequence[str] = CONFIGS,
                              cascade_split: Sequence[int] = (4, 6),
                              bigram_table: str = "qwen2.5-coder",
                              gpu_steps: str | None = None,
                              phases: Sequence[str] = ("counted", "wallclock"),
                              out: str = "results/bench_feature_drafter.json",
                              markdown_path: str | None = None) -> dict:
    """Runs the phases into ``out`` (resumable by section) and prints the table."""
    configs, phases, temperatures = list(configs), list(phases), list(temperatures)
    cascade_split = tuple(cascade_split)
    _check(num_prompts=num_prompts, max_new_tokens=max_new_tokens, gamma=gamma,
           batch_size=batch_size, wallclock_prompts=wallclock_prompts, configs=configs,
           temperatures=temperatures, phases=phases, cascade_split=cascade_split)
    try:
        report = shared.read_report(out)
    except FileNotFoundError:
        report = {}
    if phases == ["report"]:
        timing.print_markdown(markdown(report), markdown_path)
        return report
    report.setdefault("environment", timing.environment())
    report.update(precision=precision.resolve_dtype("auto"), target=target, head=head,
                  protocol={"num_prompts": num_prompts, "max_new_tokens": max_new_tokens,
                            "gamma": gamma, "batch_size": batch_size,
                            "wallclock_prompts": wallclock_prompts,
                            "cascade_split": list(cascade_split)})
    save = lambda: shared.write_report(report, out)  # noqa: E731

    pair = load_pair(target=target, drafter=drafter)
    feature_drafter, feature_params, meta = load_feature_head(
        head, target_name=target, target=pair.target, target_params=pair.target_params)
    report["head_meta"] = {k: v for k, v in meta.items() if k != "token_ids"}
    vocab = pair.target.vocab_size
    named = {drafter: pair.drafter_params, feature_drafter.name: feature_params,
             "mag": jnp.asarray(bigram.load_table(bigram_table, vocab))}
    drafters = build_drafters(configs, drafter_name=drafter, drafter_model=pair.drafter,
                              feature_drafter=feature_drafter, vocab=vocab, gamma=gamma,
                              cascade_split=cascade_split)
    prompts = shared.humaneval_prompts(pair.encode, num_prompts)
    width = max(len(p) for p in prompts)

    def generate_fn(label):
        """A jitted ``fn(target_params, named, prompt, key, sp)``: every
        configuration takes the one name -> params dict."""
        if label == AR:
            return api.make_generate_fn(target=pair.target, method=AR,
                                        max_new_tokens=max_new_tokens, eos_ids=pair.eos_ids)
        d, g = drafters[label]
        decoder = api.make_decoder(target=pair.target, drafter=d, gamma=g,
                                   max_new_tokens=max_new_tokens, eos_ids=pair.eos_ids)
        return jax.jit(lambda tp, named, *rest: decoder.generate(tp, d.select_params(named),
                                                                 *rest))

    costs = None
    if gpu_steps:
        costs = gpu_costs(gpu_steps, head_vocab=len(meta.get("token_ids") or ()),
                          intermediate_size=feature_drafter.head.config.intermediate_size)
        report["gpu_feature_variant"] = costs.pop("feature_variant")
    report["gpu_steps"] = gpu_steps
    cost_names = {"feature": ["feature"], "drafter": ["drafter"], "mag": [],
                  "drafter+mag": ["drafter"]}
    rows_by = {}
    if "counted" in phases:
        for temp in temperatures:
            block = report.setdefault("counted", {}).setdefault(str(temp), {})
            for label in tqdm([AR] + configs, desc=f"counted T={temp}"):
                rows = counted(generate_fn(label), pair.target_params, named, prompts, width,
                               temp, batch_size)
                rows_by[(temp, label)] = rows
                ar_rows = rows_by.get((temp, AR)) if temp == 0 and label != AR else None
                block[label] = summarize(rows, ar_rows)
                if costs is not None and label != AR:
                    block[label]["predicted_gpu_speedup"] = predicted_speedup(
                        rows, costs, cost_names[label])
                save()
    if "wallclock" in phases and wallclock_prompts:
        labels = [AR] + configs
        fns = {label: generate_fn(label) for label in labels}
        for temp in temperatures:
            timed = shared.wallclock(fns, (pair.target_params, named),
                                     prompts[:wallclock_prompts], width, seed=0,
                                     temperature=temp)
            ar_s = np.asarray(timed[AR]["seconds"])
            block = report.setdefault("wallclock", {}).setdefault(str(temp), {})
            for label in configs:
                block[label] = list(tables.mean_ci(ar_s / np.asarray(timed[label]["seconds"])))
            block["raw"] = timed
            save()
    timing.print_markdown(markdown(report), markdown_path)
    return report
