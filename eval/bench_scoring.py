"""What one scoring call of K tokens costs against this machine's limits.

A decoder step reads every weight once, whatever K is, and does about
``2 x (matmul parameters) x K`` FLOPs; so the call of K tokens should cost
about ``max(weight-read time, FLOP time)``, and scoring K = G + 1 drafts
should cost little more than decoding one token until the FLOP time takes
over. This measures both limits here (a large reduction for the read rate,
a large copy, a large matmul for the FLOP rate), then the jitted ``extend``
of K tokens at a fixed cache fill, and reports each K against them.

Each XLA flag set given with ``--variant`` runs in its own fresh process
(XLA reads its flags once), after the defaults, so the figures of one
invocation compare settings in one run:

    python eval/bench_scoring.py --model qwen2.5-coder-1.5b --ks 1 2 4 6 8 \\
        --variant=--xla_cpu_use_xnnpack=true
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os

FILL = 128  # tokens already in the cache when the K tokens are fed
REPEATS = 10


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 6, 8])
    # One flag set per --variant (written --variant=--flag=value: argparse
    # would take a bare "--flag" for an option of this script).
    p.add_argument("--variant", dest="variants", action="append", default=[],
                   help="XLA_FLAGS additions measured in a process of their "
                        "own, after the defaults; repeatable")
    p.add_argument("--kernel-layouts", nargs="+", default=["in_out", "out_in"],
                   choices=["in_out", "out_in"],
                   help="dense kernel layouts timed in the same process (out_in is the one "
                        "the library decodes with: sj.decode_layout)")
    p.add_argument("--random-weights", action="store_true",
                   help="random weights of the model's exact shapes (no download; a step's "
                        "cost depends on shapes, not values)")
    p.add_argument("--out", default="results/bench_scoring.json")
    p.add_argument("--markdown", default=None)
    args = p.parse_args(argv)
    if min(args.ks) < 1:
        p.error("--ks must all be >= 1.")
    args.variants = [""] + args.variants  # the defaults come first, always
    return args


def measure(model_name: str, ks: list[int], flags: str, layouts: list[str],
            random_weights: bool) -> dict:
    """Runs in a fresh process with ``flags`` added to XLA_FLAGS; each kernel
    layout's steps are timed one after another on the same weights."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from specdec_jax.checkpoints import load  # noqa: PLC0415
    from specdec_jax.models.decoder import with_kernel_layout  # noqa: PLC0415
    from specdec_jax.runtime import timing  # noqa: PLC0415

    limits = timing.device_limits()
    model, params = (load.random_model(model_name, "float32") if random_weights
                     else load.load_model(model_name)[:2])
    leaves = jax.tree_util.tree_leaves(params)
    weight_bytes = sum(x.nbytes for x in leaves)
    # Matmul parameters: every 2-D weight except the embedding table, which a
    # step gathers rows from (counted again when tied, as the output head).
    embed = model.config.vocab_size * model.config.hidden_size
    matmul_params = sum(int(np.prod(x.shape)) for x in leaves if x.ndim == 2) - embed
    if model.config.tie_embeddings:
        matmul_params += embed
    read_s = weight_bytes / (limits["read_gb_s"] * 1e9)
    rows = {}
    for layout in layouts:
        model, params = with_kernel_layout(model, params, layout)
        fn = jax.jit(lambda p, t, c, model=model: model.extend(p, t, c).logits)
        steps = {}
        for k in ks:
            cache = model.init_cache(1, FILL + max(ks)).replace(
                lengths=jnp.array([FILL], jnp.int32))
            tokens = jnp.ones((1, k), jnp.int32)
            compiled = timing.Compiled(fn, params, tokens, cache)
            steps[k] = compiled.time(params, tokens, cache, repeats=REPEATS).median_s
        for k, seconds in steps.items():
            flop_s = 2 * matmul_params * k / (limits["matmul_gflop_s"] * 1e9)
            rows[f"{layout} K={k}"] = {
                "layout": layout, "k": k, "step_s": seconds, "weight_read_s": read_s,
                "flop_s": flop_s, "over_limit": seconds / max(read_s, flop_s),
                "over_k1": seconds / steps[ks[0]]}
    return {"flags": flags, "limits": limits, "weight_bytes": weight_bytes,
            "matmul_params": matmul_params, "steps": rows, "random_weights": random_weights,
            "environment": timing.environment()}


def markdown(report: dict) -> str:
    weights = "random weights of its shapes" if report["variants"][0].get(
        "random_weights") else "real weights"
    lines = [f"{report['model']} ({weights}), float32, cache fill {FILL}, median of {REPEATS} "
             "calls; "
             f"{report['variants'][0]['environment']['machine']}, jax "
             f"{report['variants'][0]['environment']['jax']}.", ""]
    for variant in report["variants"]:
        lim = variant["limits"]
        lines += [f"XLA flags `{variant['flags'] or '(defaults)'}`: read {lim['read_gb_s']:.1f} "
                  f"GB/s, copy {lim['copy_gb_s']:.1f} GB/s, matmul "
                  f"{lim['matmul_gflop_s']:.0f} GFLOP/s; weights "
                  f"{variant['weight_bytes'] / 1e9:.2f} GB", "",
                  "| kernel layout | K | step ms | weight-read limit ms | FLOP limit ms | "
                  "step / max(limits) | step / step(K=1) |", "|---|---|---|---|---|---|---|"]
        for row in variant["steps"].values():
            lines.append(f"| {row['layout']} | {row['k']} | {1e3 * row['step_s']:.0f} | "
                         f"{1e3 * row['weight_read_s']:.0f} "
                         f"| {1e3 * row['flop_s']:.0f} | {row['over_limit']:.2f} | "
                         f"{row['over_k1']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    spawn = multiprocessing.get_context("spawn")
    report = {"model": args.model, "ks": args.ks, "variants": []}
    for flags in args.variants:
        with spawn.Pool(1) as pool:  # XLA reads its flags once per process
            report["variants"].append(pool.apply(measure, (
                args.model, args.ks, flags, args.kernel_layouts, args.random_weights)))
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    text = markdown(json.loads(json.dumps(report)))  # keys as the JSON has them
    from specdec_jax.runtime import timing  # noqa: PLC0415 (jax stays out of this parent process)

    timing.print_markdown(text, args.markdown)


if __name__ == "__main__":
    main()
