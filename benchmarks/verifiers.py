"""Token vs block verification on a real pair, in the layout of Sun et al.'s Table 2.

Block efficiency (tokens per target call) is measured per (prompt, seed) unit:
every prompt is prefilled once, and each (G, verifier) configuration decodes
all units from those caches in batches (efficiency does not depend on batching;
every row is an independent sample). Wall clock is measured at batch 1 with
prefill included, per prompt, normalised by autoregressive target decoding of
the same prompt in the same run. 95% confidence intervals are normal intervals
over units; improvements are paired (same prompt and seed) differences, so
prompt difficulty cancels. The verification kernel's share of a round is its
jitted time on [1, G, V] inputs over the measured batch-1 round time.

    # 50 prompts x 3 seeds, G 4 6 8:
    python -m benchmarks.main --gin_file=benchmarks/configs/verifiers.gin
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import shared
from specdec_jax import api, precision
from specdec_jax.decode.round import required_cache_length
from specdec_jax.jobs import tables
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm
from specdec_jax.verify import get_verifier

VERIFIERS = ("token", "block", "block-seed")
PHASES = ("efficiency", "wallclock")


def prefill_once(decoder, params, prompts, max_length, group=10):
    """Prefills every distinct prompt once, in length-sorted groups (little
    padding), into caches of one shared ``max_length``; returns the stacked
    ``Prefilled`` (row i = prompt i). Every (seed, gamma, verifier) decode
    gathers its rows from it, so the prompts are fed once per run, not once per
    configuration."""
    prefill = jax.jit(decoder.prefill, static_argnames="max_length")
    width = max(len(p) for p in prompts)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    chunks = []
    for start in tqdm(range(0, len(order), group), desc="prefill"):
        rows = [prompts[i] for i in order[start:start + group]]
        pad_to = -(-max(len(r) for r in rows) // 32) * 32  # few distinct shapes to compile
        chunk = prefill(*params, make_prompt(rows, pad_to=min(pad_to, width)),
                        max_length=max_length)
        chunks.append(chunk.replace(prompt_width=width))
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *chunks)
    inverse = np.argsort(order)
    return jax.tree_util.tree_map(lambda x: x[inverse], stacked)


def efficiency_units(decoder, params, prefilled, units, temperature, batch_size):
    """Block efficiency (tokens / target calls) of every (prompt, seed) unit,
    decoded in batches from the shared prefill."""
    sp = api.sampling_params(temperature=temperature)
    decode = jax.jit(decoder.decode)
    compiled = None
    eff = {}
    for n in tqdm(range(0, len(units), batch_size), desc=f"{decoder.verifier.__class__.__name__}"
                  f" G={decoder.gamma}", leave=False):
        batch = units[n:n + batch_size]
        rows = [i for i, _ in batch]
        rows += [rows[-1]] * (batch_size - len(rows))
        sub = jax.tree_util.tree_map(lambda x, r=np.asarray(rows): x[r], prefilled)
        # One key per batch; rows within a batch draw independent randomness.
        key = jax.random.PRNGKey(1000 * batch[0][1] + n)
        if compiled is None:
            compiled = timing.Compiled(decode, *params, sub, key, sp)
        out = compiled.time(*params, sub, key, sp).output
        lengths = np.asarray(out.lengths)
        calls = np.asarray(out.stats.target_calls)
        for row, unit in enumerate(batch):
            eff[unit] = lengths[row] / calls[row]
    return [eff[u] for u in units]


def verifier_kernel_seconds(name, gamma, vocab, repeats=50):
    verifier = get_verifier(name)
    key = jax.random.PRNGKey(0)
    q = jax.nn.softmax(jax.random.normal(key, (1, gamma, vocab)), -1)
    pi = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (1, gamma, vocab)), -1)
    drafts = jnp.argmax(q, -1).astype(jnp.int32)
    state = verifier.init_state(1)
    fn = jax.jit(verifier.__call__)
    compiled = timing.Compiled(fn, key, drafts, q, pi, pi[:, 0], state)
    return compiled.time(key, drafts, q, pi, pi[:, 0], state, repeats=repeats).median_s


def run_bench_verifiers(*, target: str = "qwen2.5-coder-1.5b",
                        drafter: str = "qwen2.5-coder-0.5b", num_prompts: int = 50,
                        seeds: Sequence[int] = (0, 1, 2), gammas: Sequence[int] = (4, 6, 8),
                        temperature: float = 1.0, max_new_tokens: int = 48,
                        batch_size: int = 30, wallclock_prompts: int = 5,
                        phases: Sequence[str] = PHASES,
                        out: str = "results/bench_verifiers.json",
                        markdown_path: str | None = None) -> dict:
    """Block efficiency (and, with the ``wallclock`` phase, batch-1 wall clock)
    of token, block and block-seed verification at each G; writes ``out``
    (JSON) and prints the Markdown table (also to ``markdown_path`` if given).

    ``batch_size``: rows per efficiency batch; ``wallclock_prompts``: prompts
    timed at batch 1 (per seed) for wall clock; ``phases`` = ``("wallclock",)``
    alone adds wall clock to the efficiency figures already in ``out``."""
    phases = list(phases)
    shared.check_choices("phases", phases, PHASES)
    shared.check_at_least(1, num_prompts=num_prompts, gammas=list(gammas),
                          max_new_tokens=max_new_tokens, batch_size=batch_size,
                          wallclock_prompts=wallclock_prompts)
    shared.check_at_least(0, seeds=list(seeds))
    shared.check_temperatures("temperature", temperature)
    shared.check_humaneval_prompts(num_prompts=num_prompts)
    if "efficiency" not in phases and not os.path.exists(out):
        raise ValueError(f"phases={phases} adds wall clock to the efficiency figures in {out}, "
                         "which does not exist; run the 'efficiency' phase first.")
    seeds, gammas = list(seeds), list(gammas)

    pair = load_pair(target=target, drafter=drafter)
    prompts = shared.humaneval_prompts(pair.encode, num_prompts)
    width = max(len(p) for p in prompts)
    params = (pair.target_params, pair.drafter_params)
    common = dict(target=pair.target, max_new_tokens=max_new_tokens)
    static = {(g, name): dict(drafter=pair.drafter, method="specdecode", gamma=g, verifier=name,
                              **common) for g in gammas for name in VERIFIERS}
    if "efficiency" in phases:
        report = {"environment": timing.environment(),
                  "precision": precision.resolve_dtype("auto"),
                  "target": target, "drafter": drafter,
                  "temperature": temperature, "num_prompts": len(prompts),
                  "seeds": seeds, "max_new_tokens": max_new_tokens,
                  "batch_size": batch_size, "rows": {}}
        largest = api.make_decoder(drafter=pair.drafter, gamma=max(gammas), **common)
        prefilled = prefill_once(largest, params, prompts, required_cache_length(
            width, max_new_tokens, max(gammas)))
        units = [(i, s) for s in seeds for i in range(len(prompts))]
        for gamma in gammas:
            row = report["rows"].setdefault(f"G={gamma}", {})
            for name in tqdm(VERIFIERS, desc=f"G={gamma}"):
                values = efficiency_units(api.make_decoder(**static[gamma, name]), params,
                                          prefilled, units, temperature, batch_size)
                eff, eff_ci = tables.mean_ci(values)
                row[name] = {"block_efficiency": eff, "ci95": eff_ci, "units": list(values)}
            paired_improvements(row, "units", "improvement_pct")
            shared.write_report(report, out)
    else:  # wall clock only: add it to the efficiency figures of an earlier run
        report = shared.read_report(out)
    if "wallclock" in phases:
        timed_prompts = prompts[:wallclock_prompts]
        fns = {"AR": api.make_generate_fn(method="autoregressive", **common)}
        fns.update({f"G={g} {name}": api.make_generate_fn(**static[g, name])
                    for g in gammas for name in VERIFIERS})
        clock = shared.wallclock(fns, params, timed_prompts, width, seeds[0], temperature)
        ar_per_token = np.asarray(clock["AR"]["seconds_per_token"])
        report["wallclock_prompts"] = len(timed_prompts)
        report["wallclock_environment"] = timing.environment()
        report["autoregressive_tokens_per_s"] = float(1 / ar_per_token.mean())
        for gamma in gammas:
            row = report["rows"][f"G={gamma}"]
            for name in VERIFIERS:
                c = clock[f"G={gamma} {name}"]
                normalized = np.asarray(c["seconds_per_token"]) / ar_per_token
                kernel_s = verifier_kernel_seconds(name, gamma, pair.target.vocab_size)
                mean, ci = tables.mean_ci(normalized)
                row[name].update({
                    "wallclock_normalized": mean, "wallclock_ci95": ci,
                    "wallclock_units": normalized.tolist(),
                    "tokens_per_s": float(1 / np.mean(c["seconds_per_token"])),
                    "round_s": c["round_s"], "verify_kernel_s": kernel_s,
                    "verify_share_of_round": kernel_s / c["round_s"]})
            paired_improvements(row, "wallclock_units", "wallclock_improvement_pct")
        shared.write_report(report, out)
    timing.print_markdown(markdown(report), markdown_path)
    return report


def paired_improvements(row, units_key, metric):
    """Each block verifier vs token, paired by unit (same prompt and seed), so
    prompt difficulty cancels; in % of token's mean, with a 95% CI."""
    token = np.asarray(row["token"][units_key])
    for name in VERIFIERS[1:]:
        d, d_ci = tables.mean_ci(np.asarray(row[name][units_key]) - token)
        row[name][metric] = 100 * d / token.mean()
        row[name][metric + "_ci95"] = 100 * d_ci / token.mean()


def markdown(report) -> str:
    """Sun et al.'s Table 2 layout, one row per G, with the seeded block
    verifier added (wall-clock columns show "–" until the wall-clock phase has
    run)."""
    env = report["environment"]
    clock = ("wall clock: not measured" if "wallclock_prompts" not in report else
             f"wall clock: batch 1, {report['wallclock_prompts']} prompts, AR "
             f"{report['autoregressive_tokens_per_s']:.2f} tokens/s")
    lines = [f"{report['target']} <- {report['drafter']}, HumanEval x{report['num_prompts']} "
             f"prompts x {len(report['seeds'])} seeds, T={report['temperature']}, "
             f"{report['max_new_tokens']} new tokens, {report['precision']}, {env['machine']}, "
             f"{env['cpu_count']} cores, jax {env['jax']}; {clock}", ""]

    def cell(r, key, ci_key, digits=3, sign=False):
        if key not in r:
            return "–"
        return tables.format_ci(r[key], r[ci_key], digits=digits, sign=sign)

    rows = []
    for key, row in report["rows"].items():
        tok, blk, seed = (row[n] for n in VERIFIERS)
        parts = [key[2:], cell(tok, "block_efficiency", "ci95")]
        for r in (blk, seed):
            parts += [cell(r, "block_efficiency", "ci95"),
                      cell(r, "improvement_pct", "improvement_pct_ci95", 2, True)]
        parts.append(cell(tok, "wallclock_normalized", "wallclock_ci95"))
        for r in (blk, seed):
            parts += [cell(r, "wallclock_normalized", "wallclock_ci95"),
                      cell(r, "wallclock_improvement_pct", "wallclock_improvement_pct_ci95",
                           2, True)]
        if "tokens_per_s" in tok:
            parts.append(" / ".join(f"{r['tokens_per_s']:.2f}" for r in (tok, blk, seed)))
            parts.append(" / ".join(f"{100 * r['verify_share_of_round']:.2f}%"
                                    for r in (tok, blk, seed)))
        else:
            parts += ["–", "–"]
        rows.append(parts)
    return "\n".join(lines + tables.markdown_table(
        ("G", "block eff. token", "block", "impr. %", "block-seed", "impr. %",
         "wall clock / AR token", "block", "Δ %", "block-seed", "Δ %",
         "tokens/s token / block / seed", "verify kernel share token / block / seed"), rows))
