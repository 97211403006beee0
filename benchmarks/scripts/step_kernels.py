"""Kernels per decode step, fused against separate projections, from compiled HLO.

One ``extend`` of K tokens of a registered architecture (shapes only, no
weights), compiled for this machine's CPU or, with libtpu, for one chip of a
TPU topology; counted from the optimised HLO (``jobs.tpu.hlo_stats``): fusions
(kernels), dot products outside fusions, custom calls. The decode layout fuses
q/k/v and gate/up (``models.decoder.with_kernel_layout``); ``separate`` is the
same layout without that.

    python benchmarks/scripts/step_kernels.py --platform cpu --dtype float32
    python benchmarks/scripts/step_kernels.py --platform tpu:v5e:2x2 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import re

import jax
import jax.numpy as jnp

from specdec_jax import precision
from specdec_jax.jobs import tables
from specdec_jax.jobs.tpu import hlo_stats
from specdec_jax.jobs.tpu import programs as tpu_programs
from specdec_jax.runtime import devices


def counts(architecture: str, dtype: str, fused: bool, k: int, cache_length: int,
           device) -> dict:
    model, params = tpu_programs.abstract_model(architecture, dtype, fused=fused)
    cache = jax.eval_shape(lambda: model.init_cache(1, cache_length))
    tokens = jax.ShapeDtypeStruct((1, k), jnp.int32)

    def step(params, tokens, cache):
        out = model.extend(params, tokens, cache)
        return out.logits, out.cache

    placed = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                       sharding=jax.sharding.SingleDeviceSharding(device)),
        (params, tokens, cache))
    text = jax.jit(step, donate_argnums=(2,)).lower(*placed).compile().as_text()
    summary = hlo_stats.summarize(text)
    return {"fusions": summary["fusions"], "custom_calls": summary["custom_calls"],
            "dots": len(re.findall(r"\bdot\(", text)), "layers": model.config.num_layers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="cpu", help="cpu, or tpu:<topology>")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--models", nargs="+",
                        default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
    parser.add_argument("--ks", nargs="+", type=int, default=[1, 6])
    parser.add_argument("--cache-length", type=int, default=2048)
    parser.add_argument("--out", help="JSON of the counts")
    args = parser.parse_args()
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if args.platform == "cpu":
        device = jax.devices("cpu")[0]
    else:
        from specdec_jax.jobs.tpu import aot as tpu_aot  # noqa: PLC0415 - needs libtpu
        device = tpu_aot.topology_devices(args.platform.removeprefix("tpu:"))[0]
    dtype = precision.resolve_dtype(args.dtype)
    rows, found = [], []
    for architecture in args.models:
        for k in args.ks:
            by = {name: counts(architecture, dtype, name == "fused", k, args.cache_length,
                               device) for name in ("separate", "fused")}
            found.append({"model": architecture, "k": k, **by})
            rows.append((architecture, k, by["separate"]["fusions"], by["fused"]["fusions"],
                         by["separate"]["dots"], by["fused"]["dots"],
                         by["separate"]["custom_calls"], by["fused"]["custom_calls"]))
    print(f"{args.platform}, {dtype}, batch 1, cache {args.cache_length}, jax {jax.__version__}")
    print("\n".join(tables.markdown_table(
        ("model", "K", "fusions separate", "fusions fused", "dots separate", "dots fused",
         "custom calls separate", "custom calls fused"), rows)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"platform": args.platform, "dtype": dtype, "jax": jax.__version__,
                       "cache_length": args.cache_length, "counts": found}, f, indent=1)


if __name__ == "__main__":
    main()
