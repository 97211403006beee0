"""Tokens per target call of Max-Gram trees at T = 0, without the target.

Replays greedy tree decoding (``benchmarks.tree_replay``) against
the target's greedy output stored by the trees benchmark (``bench_trees.replay``),
for drafters given on the command line; no model is loaded, so a tree costs
seconds. Exact at T = 0 (the benchmark's ``replay_check`` confirms it against
the real loop). Best-first trees (``trie:``) read ``--bigram-columns``
continuations per token (default ``bigram.TOP_K``, stored in the packaged
table; 1: its one-column table), chains and static trees one. Example (the
protocol of benchmarks/configs/trees_maxgram.gin)::

    python benchmarks/scripts/maxgram_replay.py \\
        --reference benchmarks/reports/greedy_humaneval_qwen2.5-coder-1.5b.json \\
        --num-prompts 40 --max-new-tokens 128 --tree chain:6 --tree trie:32,8 \\
        --set run_power=2 --set unseen_mass=1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax.numpy as jnp

from benchmarks import tree_replay, trees
from specdec_jax.data import bigram, metrics
from specdec_jax.runtime import devices


def per_call(items) -> float:
    rounds = sum(r for _, r in items)
    return (sum(a for a, _ in items) + rounds) / max(rounds, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", required=True, help="greedy reference JSON")
    parser.add_argument("--table", default="qwen2.5-coder",
                        help="bigram table (name or path; a .npy [V, K] from "
                             "tools/bigram_topk.py too): chains and static trees read its "
                             "first column, best-first trees --bigram-columns")
    parser.add_argument("--bigram-columns", type=int, default=bigram.TOP_K,
                        help="continuations per token a best-first tree reads")
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--tree", action="append", required=True,
                        help="chain:G, static widths '4,1,1', or trie:NODES,DEPTH (repeatable)")
    parser.add_argument("--set", action="append", default=[],
                        help="MaxGramTrieDrafter field=value for every trie (repeatable)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", help="write the per-tree figures here")
    args = parser.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise

    ref = tree_replay.load_reference(args.reference)
    prompts = ref["prompts"][:args.num_prompts]
    continuations = ref["continuations"][:args.num_prompts]
    if len(prompts) < args.num_prompts:
        raise SystemExit(f"{args.reference} holds {len(prompts)} prompts.")
    eos_ids = tuple(ref["protocol"].get("eos_ids", ()))
    overrides = {}
    for item in args.set:
        field, value = item.split("=", 1)
        overrides[field] = int(value) if value.isdigit() else float(value)
    results = {}
    for tree in args.tree:
        config = trees.check_configs([{"drafter": "mag", "tree": tree, "temperature": 0.0,
                                       "verifiers": ["token" if tree.startswith("chain:")
                                                     else "greedy"]}])[0]
        drafter = trees.max_gram_tree_drafter(config, 0)
        columns = args.bigram_columns if config.is_trie else 1
        table = jnp.asarray(bigram.load_table(args.table, columns=columns))
        drafter = dataclasses.replace(drafter, vocab_size=int(table.shape[0]),
                                      **(overrides if config.is_trie else {}))
        rows = tree_replay.replay_rows(drafter, table, prompts, continuations,
                                       max_new_tokens=args.max_new_tokens, eos_ids=eos_ids,
                                       batch_size=args.batch_size)
        ci = metrics.bootstrap_ci([(r["accepted"], r["rounds"]) for r in rows], per_call)
        results[tree] = {"tokens_per_target_call_ci95": ci, "drafter": repr(drafter),
                         "histogram": [sum(h) for h in zip(*(r["histogram"] for r in rows))]}
        print(f"{tree:>14}  {ci[0]:.3f} [{ci[1]:.3f}, {ci[2]:.3f}]  {repr(drafter)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
