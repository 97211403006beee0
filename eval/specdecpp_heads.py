"""Acceptance heads scored on each data build's held-out shards: how a head
trained on corpus responses differs from one trained on the target's own
responses (SpecDec++ builds from the target; the corpus is the cheaper option).

    python eval/specdecpp_heads.py --data /runs/data-corpus /runs/data-target \\
        --heads /runs/head-corpus-d3-w1/head /runs/head-target-d3-w1/head

Both builds use the same prompts in the same shards, so the last
``--held-out-shards`` shards are prompts no head saw in training.
"""

from __future__ import annotations

import argparse
import json

from specdec_jax.training.specdecpp.train import evaluate_head


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", nargs="+", required=True, help="data build directories")
    p.add_argument("--heads", nargs="+", required=True, help="head directories")
    p.add_argument("--held-out-shards", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    rows = [evaluate_head(head, data, args.held_out_shards)
            for data in args.data for head in args.heads]
    print("| head | D | w_rej | scored on | binary KL | best constant | mean prediction | "
          "mean label |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['head']} | {r['depth']} | {r['w_rej']:g} | {r['data_source']} | "
              f"{r['binary_kl']:.4f} | {r['constant_binary_kl']:.4f} | "
              f"{r['mean_prediction']:.3f} | {r['mean_label']:.3f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
