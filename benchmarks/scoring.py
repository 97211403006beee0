"""What one scoring call of K tokens costs against this machine's limits.

A decoder step reads every weight once, whatever K is, and does about
``2 x (matmul parameters) x K`` FLOPs; so the call of K tokens should cost
about ``max(weight-read time, FLOP time)``, and scoring K = G + 1 drafts
should cost little more than decoding one token until the FLOP time takes
over. This measures both limits here (a large reduction for the read rate,
a large copy, a large matmul for the FLOP rate), then the jitted ``extend``
of K tokens at a fixed cache fill, and reports each K against them.

Each XLA flag set in ``variants`` runs in its own fresh process (XLA reads its
flags once; ``benchmarks.child``), after the defaults, so the figures of one
invocation compare settings in one run (``benchmarks/configs/scoring.gin``)::

    python -m benchmarks.main --gin_file=benchmarks/configs/scoring.gin \\
        --gin_bindings="bench_scoring.variants = ['--xla_cpu_use_xnnpack=true']"

``model`` is any resolver name: ``random:<architecture>`` times random weights
of the exact shapes (no download; a step's cost depends on shapes, not values).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import child, shared
from specdec_jax.jobs import resolver, tables
from specdec_jax.models import weight_storage
from specdec_jax.models.decoder_only import with_kernel_layout
from specdec_jax.models.layers import IN_OUT, KERNEL_LAYOUTS, OUT_IN
from specdec_jax.native import matmul as native_matmul
from specdec_jax.runtime import cpu_kernels, timing

PRODUCTS = ("xla", "kernel")  # XLA's dot; the CPU kernel (native.matmul)
FILL = 128  # tokens already in the cache when the K tokens are fed
REPEATS = 10


def run_bench_scoring(*, model: str = "qwen2.5-coder-1.5b", ks: Sequence[int] = (1, 2, 4, 6, 8),
                      variants: Sequence[str] = (),
                      kernel_layouts: Sequence[str] = KERNEL_LAYOUTS,
                      products: Sequence[str] = PRODUCTS,
                      weight_formats: Sequence[str] = ("f32",),
                      out: str = "results/bench_scoring.json",
                      markdown_path: str | None = None) -> dict:
    """Times ``extend`` of each K in each kernel layout (``out_in`` is the one the
    library decodes with: ``api.decode_layout``) under the default XLA flags,
    then under each of ``variants`` (``XLA_FLAGS`` additions, e.g.
    ``'--xla_cpu_use_xnnpack=true'``), each in a process of its own. Writes the
    JSON report to ``out`` after every variant and prints the Markdown summary
    (also to ``markdown_path`` if given). ``products``: ``xla`` (XLA's dot)
    and/or ``kernel`` (the CPU kernel, ``native.matmul``; ``out_in`` only);
    ``weight_formats``: how the weights are stored (``models.weight_storage``)."""
    ks, variants, kernel_layouts = list(ks), list(variants), list(kernel_layouts)
    products, weight_formats = list(products), list(weight_formats)
    _check_arguments(model=model, ks=ks, variants=variants, kernel_layouts=kernel_layouts)
    shared.check_choices("products", products, PRODUCTS)
    shared.check_choices("weight_formats", weight_formats, weight_storage.WEIGHT_FORMATS)
    report = {"model": model, "ks": ks, "variants": []}
    for flags in ["", *variants]:  # the defaults come first, always
        env = {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()}
        report["variants"].append(child.run_in_child(
            "benchmarks.scoring:measure",
            {"model": model, "ks": ks, "flags": flags, "kernel_layouts": kernel_layouts,
             "products": products, "weight_formats": weight_formats},
            env=env))
        shared.write_report(report, out)
    text = markdown(json.loads(json.dumps(report)))  # keys as the JSON has them
    timing.print_markdown(text, markdown_path)
    return report


def _check_arguments(*, model: str, ks: list[int], variants: list[str],
                     kernel_layouts: list[str]) -> None:
    """What the job refuses before it starts a process or loads a model."""
    shared.check_at_least(1, ks=ks)
    shared.check_choices("kernel_layouts", kernel_layouts, KERNEL_LAYOUTS)
    if any(not isinstance(v, str) or not v.strip() for v in variants):
        raise ValueError(f"variants takes XLA_FLAGS additions, one string per variant (e.g. "
                         f"['--xla_cpu_use_xnnpack=true']); got {variants!r}.")
    resolver.family_of(model)  # an unknown name fails here, listing the known ones
    if model.startswith(resolver.RANDOM_PREFIX):
        resolver.parse_random(model)


def settings(kernel_layouts, products, weight_formats) -> list[tuple[str, str, str, str]]:
    """``(label, layout, product, weight format)`` of every combination that
    exists: the kernel reads only the ``out_in`` layout, and int8 weights need
    it too. Labels: ``out_in``, ``out_in+kernel``, ``out_in+kernel+bf16``..."""
    rows = []
    for layout in kernel_layouts:
        for product in products:
            for fmt in weight_formats:
                if layout != OUT_IN and (product == "kernel" or fmt == "int8"):
                    continue
                label = layout + ("+kernel" if product == "kernel" else "") + (
                    "" if fmt == "f32" else f"+{fmt}")
                rows.append((label, layout, product, fmt))
    return rows


def measure(*, model: str, ks: Sequence[int], flags: str,
            kernel_layouts: Sequence[str], products: Sequence[str] = ("xla",),
            weight_formats: Sequence[str] = ("f32",)) -> dict:
    """One process's figures under ``flags`` (which must already be in its
    ``XLA_FLAGS``: ``run_bench_scoring`` starts the process with them); each
    kernel layout's steps are timed one after another on the same weights."""
    if flags and flags not in os.environ.get("XLA_FLAGS", ""):
        raise ValueError(f"XLA flags {flags!r} are not in this process's XLA_FLAGS; XLA reads "
                         "them once, at start: run it through run_bench_scoring.")
    ks = list(ks)
    limits = timing.device_limits()
    lm, params, _ = resolver.resolve(model, dtype="float32", kernel_layout=IN_OUT)
    leaves = jax.tree_util.tree_leaves(params)
    weight_bytes = sum(x.nbytes for x in leaves)
    # Matmul parameters: every 2-D weight except the embedding table, which a
    # step gathers rows from (counted again when tied, as the output head).
    embed = lm.config.vocab_size * lm.config.hidden_size
    matmul_params = sum(int(np.prod(x.shape)) for x in leaves if x.ndim == 2) - embed
    if lm.config.tie_embeddings:
        matmul_params += embed
    read_s = weight_bytes / (limits["read_gb_s"] * 1e9)
    rows = {}
    kernel = "kernel" in products and cpu_kernels.enable()
    for label, layout, product, fmt in settings(kernel_layouts, products, weight_formats):
        if product == "kernel" and not kernel:
            raise RuntimeError("products lists 'kernel' but the CPU kernel could not be built "
                               "here (see the warning above); drop it from products.")
        lm, params = with_kernel_layout(lm, params, layout)
        stored = weight_storage.store_weights(params, fmt, kernel_layout=layout)
        native_matmul.set_enabled(product == "kernel")
        fn = jax.jit(lambda p, t, c, lm=lm: lm.extend(p, t, c).logits)
        steps = {}
        for k in ks:
            cache = lm.init_cache(1, FILL + max(ks)).replace(
                lengths=jnp.array([FILL], jnp.int32))
            tokens = jnp.ones((1, k), jnp.int32)
            compiled = timing.Compiled(fn, stored, tokens, cache)
            steps[k] = compiled.time(stored, tokens, cache, repeats=REPEATS).median_s
        del stored
        for k, seconds in steps.items():
            flop_s = 2 * matmul_params * k / (limits["matmul_gflop_s"] * 1e9)
            rows[f"{label} K={k}"] = {
                "layout": label, "k": k, "step_s": seconds, "weight_read_s": read_s,
                "flop_s": flop_s, "over_limit": seconds / max(read_s, flop_s),
                "over_k1": seconds / steps[ks[0]]}
    native_matmul.set_enabled(True)
    return {"flags": flags, "limits": limits, "weight_bytes": weight_bytes,
            "matmul_params": matmul_params, "steps": rows,
            "random_weights": model.startswith(resolver.RANDOM_PREFIX),
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
                  f"{variant['weight_bytes'] / 1e9:.2f} GB", ""]
        lines += tables.markdown_table(
            ("layout / product", "K", "step ms", "weight-read limit ms", "FLOP limit ms",
             "step / max(limits)", "step / step(K=1)"),
            [(row["layout"], row["k"], f"{1e3 * row['step_s']:.0f}",
              f"{1e3 * row['weight_read_s']:.0f}", f"{1e3 * row['flop_s']:.0f}",
              f"{row['over_limit']:.2f}", f"{row['over_k1']:.2f}")
             for row in variant["steps"].values()])
        lines.append("")
    return "\n".join(lines)
