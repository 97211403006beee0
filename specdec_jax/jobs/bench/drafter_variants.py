"""What each drafter saving buys on the README's first command, timed interleaved.

The first command (``specdec-jax generate``: Qwen2.5-Coder 0.5B drafting for
1.5B, G = 5, greedy, three code prompts, 64 new tokens) under drafter
variants, each compiled once, then every prompt timed under every variant in
turn (``repeats`` passes), so the ratios come from one run on one machine
state:

* the full output head (the catch-up call's head at one row, ``logits_at``);
* the head cut to ``head_vocab`` tokens (``drafting.head_vocab``);
* the cut head with the lagging draft fed by 1-token calls
  (``ModelDrafter(catch_up_widths=(1,))``, the CPU default) instead of one
  2-token call (``(1, 2)``, the accelerator default).

The outputs must be equal token for token (checked: every variant is exact;
the job fails after writing its report if one is not).

    python -m eval.main --gin_file=configs/bench/drafter_variants.gin \\
        --gin_bindings="bench_drafter_variants.out = 'results/variants.json'"
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from specdec_jax import api, batching, precision
from specdec_jax.data import bigram
from specdec_jax.drafting import ModelDrafter
from specdec_jax.jobs import tables
from specdec_jax.jobs.bench import shared
from specdec_jax.jobs.generate import DEFAULT_DRAFTER, DEFAULT_PROMPTS, DEFAULT_TARGET
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.runtime import timing


def run_bench_drafter_variants(*, target: str = DEFAULT_TARGET, drafter: str = DEFAULT_DRAFTER,
                               gamma: int = 5, head_vocab: int = 32768,
                               max_new_tokens: int = 64, repeats: int = 2,
                               out: str | None = None, markdown_path: str | None = None,
                               bigram_table: str = "qwen2.5-coder") -> dict:
    """Seconds, speedup over the target and tokens per target call of each
    drafter variant (module docstring); JSON at ``out`` if given, the Markdown
    printed (and written to ``markdown_path`` if given). ``bigram_table``
    ranks the tokens the cut head keeps (``bigram.restrict_head``). Raises
    after writing the report if a variant's tokens differ from the target's."""
    settings = {"target": target, "drafter": drafter, "gamma": gamma, "head_vocab": head_vocab,
                "max_new_tokens": max_new_tokens, "repeats": repeats, "out": out}
    shared.check_at_least(1, gamma=gamma, head_vocab=head_vocab, max_new_tokens=max_new_tokens,
                          repeats=repeats)
    if bigram_table != "qwen2.5-coder":
        settings["bigram_table"] = bigram_table
    pair = load_pair(target=target, drafter=drafter)
    cut, cut_params = bigram.restrict_head(pair.drafter, pair.drafter_params, head_vocab,
                                           eos_ids=pair.eos_ids, table=bigram_table)
    common = dict(target=pair.target, max_new_tokens=max_new_tokens, eos_ids=pair.eos_ids)

    def speculative(model, widths):
        return api.make_generate_fn(drafter=ModelDrafter(model, catch_up_widths=widths),
                                    method="specdecode", gamma=gamma, **common)

    variants = {
        "autoregressive target": (api.make_generate_fn(method="autoregressive", **common),
                                  pair.drafter_params),
        "full head, 2-token catch-up": (speculative(pair.drafter, (1, 2)), pair.drafter_params),
        f"head cut to {head_vocab}, 2-token catch-up": (speculative(cut, (1, 2)), cut_params),
        f"head cut to {head_vocab}, 1-token catch-ups": (speculative(cut, (1,)), cut_params),
    }
    sp = api.sampling_params(temperature=0.0)
    prompts = [p for _, p, _ in batching.fixed_shape_batches(
        [pair.encode(text) for text in DEFAULT_PROMPTS], 1)]
    key = jax.random.PRNGKey(0)
    target_params = pair.target_params
    compiled = {name: timing.Compiled(fn, target_params, params, prompts[0], key, sp)
                for name, (fn, params) in variants.items()}
    seconds = {name: 0.0 for name in variants}
    tokens = {name: 0 for name in variants}
    calls = {name: 0 for name in variants}
    outputs: dict[str, list] = {name: [] for name in variants}
    for _ in range(repeats):
        for prompt in prompts:
            for name, executable in compiled.items():
                run = executable.time(target_params, variants[name][1], prompt, key, sp)
                seconds[name] += run.median_s
                tokens[name] += int(np.asarray(run.output.lengths).sum())
                calls[name] += int(np.asarray(run.output.stats.target_calls).sum())
                outputs[name].append(np.asarray(run.output.tokens).tolist())
    reference = outputs["autoregressive target"]
    same = {name: out == reference for name, out in outputs.items()}
    base = seconds["autoregressive target"]
    env = timing.environment()
    lines = [f"{target} / {drafter}, G = {gamma}, greedy, {len(prompts)} prompts x {repeats}, "
             f"{env['machine']}, {precision.resolve_dtype('auto')}, jax {env['jax']}"]
    lines += tables.markdown_table(
        ("variant", "seconds", "speedup vs target", "tokens per target call", "same tokens"),
        [(name, f"{seconds[name]:.1f}", f"{base / seconds[name]:.2f}x",
          f"{tokens[name] / max(calls[name], 1):.2f}", same[name]) for name in variants])
    timing.print_markdown("\n".join(lines), markdown_path)
    report = {"settings": settings, "environment": env, "seconds": seconds, "tokens": tokens,
              "target_calls": calls, "same_tokens_as_target": same}
    if out:
        pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(out).write_text(json.dumps(report, indent=1))
    if not all(same.values()):
        raise RuntimeError(f"drafter variants {[n for n, s in same.items() if not s]} wrote "
                           "other tokens than the autoregressive target (every variant must be "
                           f"exact){'; report in ' + out if out else ''}.")
    return report
