"""What each drafter saving buys on the README's first command, timed interleaved.

The first command (``specdec-jax generate``: Qwen2.5-Coder 0.5B drafting for
1.5B, G = 5, greedy, three code prompts, 64 new tokens) under drafter
variants, each compiled once, then every prompt timed under every variant in
turn (``--repeats`` passes), so the ratios come from one run on one machine
state:

* the full output head (the catch-up call's head at one row, ``logits_at``);
* the head cut to ``--head-vocab`` tokens (``drafting.head_vocab``);
* the cut head with the lagging draft fed by 1-token calls
  (``ModelDrafter(catch_up_widths=(1,))``, the CPU default) instead of one
  2-token call (``(1, 2)``, the accelerator default).

The outputs must be equal token for token (checked: every variant is exact).

    python eval/bench_drafter_variants.py --repeats 2 --out /tmp/variants.json
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import numpy as np

from specdec_jax import api, batching
from specdec_jax.checkpoints.load import load_for_decoding
from specdec_jax.data import bigram
from specdec_jax.drafting import ModelDrafter
from specdec_jax.jobs.generate import DEFAULT_DRAFTER, DEFAULT_PROMPTS, DEFAULT_TARGET
from specdec_jax.runtime import timing


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--drafter", default=DEFAULT_DRAFTER)
    p.add_argument("--gamma", type=int, default=5)
    p.add_argument("--head-vocab", type=int, default=32768)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="passes over the prompts")
    p.add_argument("--out", default=None, help="JSON report path")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.repeats < 1 or args.head_vocab < 1:
        raise SystemExit("error: --repeats and --head-vocab must be >= 1.")
    target, target_params, tok = load_for_decoding(args.target)
    drafter, drafter_params, _ = load_for_decoding(args.drafter)
    cut, cut_params = bigram.restrict_head(drafter, drafter_params, args.head_vocab,
                                           eos_ids=tok.eos_token_ids)
    common = dict(target=target, max_new_tokens=args.max_new_tokens,
                  eos_ids=tuple(tok.eos_token_ids))

    def speculative(model, widths):
        return api.make_generate_fn(drafter=ModelDrafter(model, catch_up_widths=widths),
                                    method="specdecode", gamma=args.gamma, **common)

    variants = {
        "autoregressive target": (api.make_generate_fn(method="autoregressive", **common),
                                  drafter_params),
        "full head, 2-token catch-up": (speculative(drafter, (1, 2)), drafter_params),
        f"head cut to {args.head_vocab}, 2-token catch-up": (speculative(cut, (1, 2)),
                                                              cut_params),
        f"head cut to {args.head_vocab}, 1-token catch-ups": (speculative(cut, (1,)),
                                                               cut_params),
    }
    sp = api.sampling_params(temperature=0.0)
    prompts = [p for _, p, _ in batching.fixed_shape_batches(
        [tok.encode(text) for text in DEFAULT_PROMPTS], 1)]
    key = jax.random.PRNGKey(0)
    compiled = {name: timing.Compiled(fn, target_params, params, prompts[0], key, sp)
                for name, (fn, params) in variants.items()}
    seconds = {name: 0.0 for name in variants}
    tokens = {name: 0 for name in variants}
    calls = {name: 0 for name in variants}
    outputs: dict[str, list] = {name: [] for name in variants}
    for _ in range(args.repeats):
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
    print(f"{args.target} / {args.drafter}, G = {args.gamma}, greedy, {len(prompts)} prompts x "
          f"{args.repeats}, {env['machine']}, float32, jax {env['jax']}")
    print("| variant | seconds | speedup vs target | tokens per target call | same tokens |")
    print("|---|---|---|---|---|")
    for name in variants:
        print(f"| {name} | {seconds[name]:.1f} | {base / seconds[name]:.2f}x | "
              f"{tokens[name] / max(calls[name], 1):.2f} | {same[name]} |")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(
            {"settings": vars(args), "environment": env, "seconds": seconds, "tokens": tokens,
             "target_calls": calls, "same_tokens_as_target": same}, indent=1))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
