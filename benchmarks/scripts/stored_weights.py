"""A GGUF target kept in its file's blocks against its float32 copy.

For one registry model (default: the first command's 1.5B target), loaded both
ways (``weights="stored"``: the file's blocks through the CPU block kernel,
int8 activations; ``"f32"``: the file dequantised once):

- **agreement** on ``--prompts`` HumanEval prompts, teacher-forced: top-1
  agreement of the next-token argmax at every prompt position, the mean
  KL(f32 || stored) and the largest logit difference;
- **one function**: the largest logit difference between 9 tokens scored in
  one call and the same 9 fed one by one (0 when the target is one function
  of each row: row-independent block products, attention and norms computed
  row by row, ``DecoderConfig.row_independent``; tests/test_stored_blocks.py);
- **greedy identity** (``--greedy`` prompts, ``--greedy-tokens`` each):
  greedy speculative decoding (the 0.5B drafter, stored, G = 3, and a
  ``dynamic:4,2,2`` token tree) against the stored target's own
  autoregressive output, token for token;
- **steps**: in-loop seconds of a 1-token step and a 9-token call for both
  storages and for the stored target with its reductions over K rows at once
  (``row_independent=False``: what scoring rows one by one costs),
  interleaved ``--rounds`` times (medians, and their ratios), and the bytes
  each stores.

    python benchmarks/scripts/stored_weights.py \\
        --out benchmarks/reports/stored_weights_1.5b_cpu.json

Time on 2 CPU cores: a few minutes (40 prompts, 3 rounds). Run it with
nothing else on the machine: the step times are bandwidth- and compute-bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import load
from specdec_jax.data import humaneval
from specdec_jax.models import weight_storage
from specdec_jax.models.decoder_only import DecoderOnlyLM
from specdec_jax.runtime import cpu_kernels, devices, timing


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


def greedy_identity(target, target_params, prompts: list[list[int]], max_new_tokens: int
                    ) -> dict:
    """Prompts on which greedy speculative output (chain and tree) equals the
    stored target's autoregressive output, and where the first difference is.
    All prompts in one batch (one compile per decoder; rows are independent)."""
    import specdec_jax as sj  # noqa: PLC0415 - the public API, as a user calls it

    drafter, drafter_params, _ = load.load_for_decoding("qwen2.5-coder-0.5b", "float32",
                                                        weights="stored")
    common = dict(target=target, target_params=target_params, prompts=prompts,
                  max_new_tokens=max_new_tokens, temperature=0.0)
    alone = np.asarray(sj.generate(method="autoregressive", **common).tokens)
    out = {"prompts": len(prompts), "max_new_tokens": max_new_tokens}
    for label, how in (("chain_g3", dict(gamma=3)), ("tree_dynamic_4_2_2",
                                                     dict(tree="dynamic:4,2,2"))):
        ours = np.asarray(sj.generate(drafter=drafter, drafter_params=drafter_params,
                                      **common, **how).tokens)
        differ = [np.flatnonzero(a != b) for a, b in zip(alone, ours)]
        equal = sum(d.size == 0 for d in differ)
        out[label] = {"equal": int(equal), "first_differences": [int(d[0]) for d in differ
                                                                 if d.size]}
        print(f"greedy {label}: {equal} of {len(prompts)} prompts equal", flush=True)
    return out


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
    parser.add_argument("--greedy", type=int, default=12, help="prompts for greedy identity")
    parser.add_argument("--greedy-tokens", type=int, default=48)
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["agreement", "one_function", "greedy", "steps"],
                        help="sections to leave out")
    parser.add_argument("--out", default="benchmarks/reports/stored_weights_cpu.json")
    args = parser.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if not cpu_kernels.enable():
        print("the CPU kernel could not be built: nothing to compare", file=sys.stderr)
        return 1
    stored = load.load_for_decoding(args.model, "float32", weights="stored")
    tok = stored[2]
    prompts = [tok.encode(text) for text in humaneval.load_prompts(args.prompts)]
    models = {"stored": stored[:2]}
    if {"agreement", "steps"} - set(args.skip):  # the float32 copy: 6 GB for the 1.5B
        models["f32"] = load.load_for_decoding(args.model, "float32")[:2]
    report = {"model": args.model, "commit": timing.checkout_commit(),
              "date": datetime.date.today().isoformat(), "environment": timing.environment(),
              "precision": "float32 activations; stored: int8 activations per 64/256 values"}
    # --skip name -> (report key, what computes it)
    sections = {
        "agreement": ("agreement", lambda: agreement(models, prompts)),
        "one_function": ("one_function_max_logit_difference",
                         lambda: one_function(*models["stored"], prompts[0])),
        "greedy": ("greedy", lambda: greedy_identity(*models["stored"], prompts[:args.greedy],
                                                     args.greedy_tokens)),
        # What scoring rows one by one costs: the same blocks, reductions over K rows.
        "steps": ("steps", lambda: steps({**models, "stored_rows_together": (
            DecoderOnlyLM(dataclasses.replace(models["stored"][0].config,
                                              row_independent=False)),
            models["stored"][1])}, args.rounds))}
    for name, (key, run) in sections.items():
        if name not in args.skip:
            report[key] = run()
            timing.write_report(report, args.out)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
