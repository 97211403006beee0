"""A GGUF target kept in its file's blocks against its float32 copy.

For one registry model (default: the first command's 1.5B target), loaded both
ways (``weights="stored"``: the file's blocks through the CPU block kernel,
int8 activations; ``"f32"``: the file dequantised once):

- **agreement** on ``--prompts`` HumanEval prompts, teacher-forced: top-1
  agreement of the next-token argmax at every prompt position, the mean
  KL(f32 || stored) and the largest logit difference;
- **one function**: the largest logit difference between 9 tokens scored in
  one call and the same 9 fed one by one (the products are the same bits,
  tests/test_stored_blocks.py; attention over 1 or 9 queries may differ);
- **steps**: in-loop seconds of a 1-token step and a 9-token call for both
  storages, interleaved ``--rounds`` times (medians, and their ratios), and
  the bytes each stores.

    python benchmarks/scripts/stored_weights.py \\
        --out benchmarks/reports/stored_weights_1.5b_cpu.json

Time on 2 CPU cores: a few minutes (40 prompts, 3 rounds). Run it with
nothing else on the machine: the step times are bandwidth- and compute-bound.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import load
from specdec_jax.data import humaneval
from specdec_jax.jobs import tpu_compile
from specdec_jax.models import weight_storage
from specdec_jax.runtime import cpu_kernels, timing


def agreement(models: dict, prompts: list[list[int]], length: int = 256) -> dict:
    """Every prompt padded to ``length`` tokens (one compiled call per model;
    positions past a prompt's end are left out)."""
    fp, sp = models["f32"][1], models["stored"][1]
    logits = {name: jax.jit(lambda p, t, m=model: m.extend(p, t, m.init_cache(1, length)
                                                          ).logits[0])
              for name, (model, _) in models.items()}
    agree, kls, worst, positions = 0, [], 0.0, 0
    for ids in prompts:
        ids = ids[:length]
        tokens = jnp.asarray([ids + [0] * (length - len(ids))], jnp.int32)
        want = jax.nn.log_softmax(logits["f32"](fp, tokens))[:len(ids)]
        got = jax.nn.log_softmax(logits["stored"](sp, tokens))[:len(ids)]
        agree += int(jnp.sum(jnp.argmax(want, -1) == jnp.argmax(got, -1)))
        kls.append(np.asarray(jnp.sum(jnp.exp(want) * (want - got), -1)))
        worst = max(worst, float(jnp.max(jnp.abs(want - got))))
        positions += len(ids)
    return {"prompts": len(prompts), "positions": positions,
            "top1_agreement": round(agree / positions, 4),
            "mean_kl_f32_to_stored": float(np.concatenate(kls).mean()),
            "max_abs_logprob_difference": worst}


def one_function(model, params, ids: list[int]) -> float:
    """Largest |logit| difference: 9 tokens in one call vs one at a time."""
    prompt, fed = jnp.asarray([ids[:-9]], jnp.int32), jnp.asarray([ids[-9:]], jnp.int32)
    extend = jax.jit(model.extend)
    cache = extend(params, prompt, model.init_cache(1, len(ids) + 1)).cache
    together = extend(params, fed, cache).logits[0]
    rows = []
    for i in range(9):
        out = extend(params, fed[:, i:i + 1], cache)
        rows.append(out.logits[0, 0])
        cache = out.cache
    return float(jnp.max(jnp.abs(together - jnp.stack(rows))))


def steps(models: dict, rounds: int) -> dict:
    times: dict[str, list[float]] = {f"{name}_k{k}": [] for name in models for k in (1, 9)}
    for _ in range(rounds):  # interleaved: a drift hits both storages alike
        for name, (model, params) in models.items():
            for k in (1, 9):
                timed = timing.in_loop_step(model, params, k, steps=16, repeats=3)
                times[f"{name}_k{k}"].append(timed.median_s)
    med = {key: float(np.median(v)) for key, v in times.items()}
    return {"median_s": med, "runs_s": times,
            "stored_step_vs_f32": round(med["f32_k1"] / med["stored_k1"], 3),
            "k9_over_k1": {name: round(med[f"{name}_k9"] / med[f"{name}_k1"], 3)
                           for name in models},
            "bytes": {name: weight_storage.stored_bytes(params)
                      for name, (_, params) in models.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/reports/stored_weights_cpu.json")
    args = parser.parse_args(argv)
    if not cpu_kernels.enable():
        print("the CPU kernel could not be built: nothing to compare", file=sys.stderr)
        return 1
    stored = load.load_for_decoding(args.model, "float32", weights="stored")
    f32 = load.load_for_decoding(args.model, "float32")
    tok = stored[2]
    prompts = [tok.encode(text) for text in humaneval.load_prompts(args.prompts)]
    models = {"stored": stored[:2], "f32": f32[:2]}
    report = {"model": args.model, "commit": tpu_compile.source_commit(),
              "date": datetime.date.today().isoformat(), "environment": timing.environment(),
              "precision": "float32 activations; stored: int8 activations per 64/256 values"}
    report["agreement"] = agreement(models, prompts)
    timing.write_report(report, args.out)
    report["one_function_max_logit_difference"] = one_function(*models["stored"], prompts[0])
    timing.write_report(report, args.out)
    report["steps"] = steps(models, args.rounds)
    timing.write_report(report, args.out)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
