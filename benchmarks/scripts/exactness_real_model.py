"""Every verifier/drafter pairing the API accepts, at T = 1 on a real model.

The protocol of the issue that found ``rrs-replacement`` inexact on the
library's trees: the target is SmolLM2-135M (real weights, fetched from the
package index); the drafter is the same network with perturbed weights and
sharpened logits (its first-token law far from the target's in total
variation); each pairing decodes ``--rows`` continuations of 2 tokens of one
prompt through ``specdec_jax.generate`` at temperature 1, and the tokens are
tested against the target's exact law computed from the model:

- first token: a chi-square over the tokens with expected count >= 5 (the
  rest pooled in one cell);
- first two tokens: the same over pairs, the conditional law of the second
  token computed for every first token whose expected count reaches 5 (no
  pair with another first token can: the cells come from the law alone,
  never from the data).

Controls: the target alone (autoregressive) must pass, the drafter alone must
fail (the test has the power to see the drafter's law), and so must the old
``rrs-replacement`` hole (children drawn without replacement, verified as if
drawn with it: ``Mislabelled``). Prints a table and
writes JSON (p-values, acceptance, seconds; machine and versions).

    python benchmarks/scripts/exactness_real_model.py \\
        --out benchmarks/reports/exactness_real_model_cpu.json

2 CPU cores: about 30 s a pairing at 1,024 rows (one compile, 8 batches of 128).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

import specdec_jax as sj
from specdec_jax.drafting.tree import StaticTreeDrafter, TreeShape
from specdec_jax.jobs import resolver
from specdec_jax.runtime import devices, timing
from specdec_jax.sampling import WITH_REPLACEMENT

PROMPT = "def fibonacci(n):\n    "
CHAINS = [("token", None), ("block", None), ("block-seed", None)]
TREES = [(v, t) for t in ("3,2", "dynamic:2,2,3")
         for v in ("traversal", "rrs", "rrs-replacement")]
MIN_EXPECTED = 5.0


@dataclasses.dataclass(frozen=True)
class Sharpened:
    """A model whose logits are multiplied by ``scale`` (a drafter far from the
    target: sharper, so it over-proposes its favourites). Everything else is
    the wrapped model's."""

    model: Any
    scale: float

    def __getattr__(self, name):
        return getattr(self.model, name)

    def _sharpen(self, out):
        return out.replace(logits=out.logits * self.scale)

    def prefill(self, *args, **kwargs):
        return self._sharpen(self.model.prefill(*args, **kwargs))

    def extend(self, *args, **kwargs):
        return self._sharpen(self.model.extend(*args, **kwargs))

    def score_tree(self, *args, **kwargs):
        return self._sharpen(self.model.score_tree(*args, **kwargs))


class Mislabelled(StaticTreeDrafter):
    """Known-wrong: draws without replacement, says it drew with replacement
    (what ``rrs-replacement`` did with the library's trees before trees
    stated their drawing)."""

    @property
    def draws(self) -> str:
        return WITH_REPLACEMENT


def perturbed(params, scale: float, seed: int):
    """Each float array plus Gaussian noise of ``scale`` times its own std."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
           if jnp.issubdtype(x.dtype, jnp.floating) else x for x, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, out)


def next_probs(model, params, prompts: list[list[int]]) -> np.ndarray:
    """float64 [B, V]: the model's next-token law after each prompt (T = 1)."""
    prompt = sj.make_prompt(prompts)
    cache = model.init_cache(len(prompts), prompt.tokens.shape[1] + 1)
    logits = jax.jit(model.prefill)(params, prompt, cache).logits[:, -1]
    return np.asarray(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), np.float64)


def chi_square(counts: dict, law: dict, total: int) -> float:
    """p-value of observed ``counts`` against ``law`` over the cells with
    expected count >= MIN_EXPECTED, the rest pooled into one cell."""
    cells = [c for c, p in law.items() if p * total >= MIN_EXPECTED]
    observed = [counts.get(c, 0) for c in cells]
    expected = [law[c] * total for c in cells]
    rest_obs, rest_exp = total - sum(observed), total - sum(expected)
    if rest_exp >= MIN_EXPECTED:
        observed.append(rest_obs)
        expected.append(rest_exp)
    else:  # fold a thin rest into the cells' scale
        expected = list(np.asarray(expected) * total / sum(expected))
    return float(stats.chisquare(observed, expected).pvalue)


def sequence_law(target, params, prompt: list[int], first_tokens) -> tuple[dict, dict]:
    """(law of the first token {(x1,): p}, law of the pairs {(x1, x2): p} whose
    first token is one of ``first_tokens``; the others fall in the pooled cell)."""
    p1 = next_probs(target, params, [prompt])[0]
    firsts = sorted(set(int(t) for t in first_tokens))
    p2 = next_probs(target, params, [prompt + [t] for t in firsts])
    first = {(t,): float(p1[t]) for t in range(len(p1))}
    pairs = {}
    for row, t in enumerate(firsts):
        for u in np.nonzero(p1[t] * p2[row] > 1e-9)[0]:
            pairs[(t, int(u))] = float(p1[t] * p2[row, u])
    return first, pairs


def run(args) -> dict:
    target, params, tokenizer = resolver.resolve(args.target)
    drafter = Sharpened(target, args.sharpen)
    drafter_params = perturbed(params, args.noise, seed=1)
    prompt = tokenizer.encode(PROMPT)
    p1_target = next_probs(target, params, [prompt])[0]
    p1_drafter = next_probs(drafter, drafter_params, [prompt])[0]
    tv = 0.5 * float(np.abs(p1_target - p1_drafter).sum())
    print(f"{args.target}: prompt {len(prompt)} tokens; drafter's first-token law is {tv:.2f} "
          "from the target's in total variation", flush=True)
    # Every first token that can head a cell of expected count >= 5.
    heads = np.nonzero(p1_target * args.rows >= MIN_EXPECTED)[0]

    pairings = [("control: target alone", "autoregressive", None, None, "target"),
                ("control: drafter alone", "autoregressive", None, None, "drafter"),
                ("control: the old rrs-replacement, 3,2", "specdecode", "rrs", None,
                 "mislabelled")]
    pairings += [(f"chain G=3, {v}", "specdecode", v, None, "pair") for v, _ in CHAINS]
    pairings += [(f"tree {t}, {v}", "specdecode", v, t, "pair") for v, t in TREES]
    if args.only:
        pairings = [p for p in pairings if any(o in p[0] for o in args.only)]
    rows = []
    for label, method, verifier, tree, who in pairings:
        start = time.perf_counter()
        tokens, accepted = [], []
        for batch in range(args.rows // args.batch):
            kwargs = dict(prompts=[prompt] * args.batch, temperature=1.0, max_new_tokens=2,
                          seed=1000 * batch + 7)
            if who == "drafter":
                out = sj.generate(target=drafter, target_params=drafter_params,
                                  method=method, **kwargs)
            elif who == "mislabelled":
                out = sj.generate(target=target, target_params=params,
                                  drafter=Mislabelled(drafter, TreeShape.from_widths((3, 2))),
                                  drafter_params=drafter_params, verifier=verifier, **kwargs)
            elif who == "target":
                out = sj.generate(target=target, target_params=params, method=method, **kwargs)
            else:
                out = sj.generate(target=target, target_params=params, drafter=drafter,
                                  drafter_params=drafter_params, method=method,
                                  verifier=verifier, tree=tree,
                                  gamma=None if tree else 3, **kwargs)
            tokens.append(np.asarray(out.tokens)[:, :2])
            accepted.append(np.asarray(out.stats.accepted()))
        tokens = np.concatenate(tokens)
        first, pairs = sequence_law(target, params, prompt, heads)
        count1, count2 = {}, {}
        for a, b in tokens.tolist():
            count1[(a,)] = count1.get((a,), 0) + 1
            count2[(a, b)] = count2.get((a, b), 0) + 1
        row = {"pairing": label, "method": method, "verifier": verifier, "tree": tree,
               "rows": len(tokens), "p_first": chi_square(count1, first, len(tokens)),
               "p_two": chi_square(count2, pairs, len(tokens)),
               "accepted_per_row": float(np.concatenate(accepted).mean()),
               "seconds": time.perf_counter() - start}
        rows.append(row)
        print(f"{label:34s} p(first) {row['p_first']:9.3g}  p(two) {row['p_two']:9.3g}  "
              f"accepted/row {row['accepted_per_row']:.2f}  ({row['seconds']:.0f} s)",
              flush=True)
    return {"target": args.target, "prompt": PROMPT, "rows": args.rows,
            "drafter": {"noise": args.noise, "sharpen": args.sharpen,
                        "first_token_tv": tv},
            "results": rows, "environment": timing.environment(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--noise", type=float, default=0.04,
                   help="drafter weights: + noise x each array's std")
    p.add_argument("--sharpen", type=float, default=1.5, help="drafter logits x this")
    p.add_argument("--only", nargs="*", help="run the pairings whose label holds one of these")
    p.add_argument("--out", default=None, help="JSON report path")
    args = p.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if args.rows % args.batch:
        p.error("--rows must be a multiple of --batch")
    report = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
