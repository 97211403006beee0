"""Per-model costs on CPU float32, ours vs Hugging Face ``transformers`` (same GGUF).

For each model, in one run: load time (GGUF read + dequantise + device put),
resident memory added by the load (each side measured in a fresh subprocess, so
memory freed by one load cannot hide the next), decode latency of one token (K = 1) and
scoring latency of K = 6 tokens at a fixed cache fill, with the ratio
theirs / ours (> 1 means we are faster). Compile time is excluded.

    python eval/bench_models.py --models smollm2-135m qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import time

import jax
import jax.numpy as jnp
import psutil

from specdec_jax import api
from specdec_jax.checkpoints import registry
from specdec_jax.checkpoints.load import load_model
from specdec_jax.runtime import timing

FILL = 128  # tokens already in the cache when K tokens are fed
REPEATS = 10


def rss() -> int:
    return psutil.Process().memory_info().rss


def ours(name):
    gc.collect()
    before, start = rss(), time.perf_counter()
    model, params, _ = load_model(name)
    jax.block_until_ready(params)
    load_s, mem = time.perf_counter() - start, rss() - before
    row = {"load_s": load_s, "rss_gb": mem / 2**30}
    model, params = api.decode_layout(model, params)  # as the decoders run it (after the load)
    fn = jax.jit(lambda p, t, c: model.extend(p, t, c).logits)
    for k in (1, 6):
        cache = model.init_cache(1, FILL + 8).replace(lengths=jnp.array([FILL], jnp.int32))
        tokens = jnp.ones((1, k), jnp.int32)
        compiled = timing.Compiled(fn, params, tokens, cache)
        row[f"k{k}_s"] = compiled.time(params, tokens, cache, repeats=REPEATS).median_s
    return row  # model and params are freed on return, before the peer loads


def theirs(name):
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    path = registry.local_path(name)
    gc.collect()
    before, start = rss(), time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    load_s, mem = time.perf_counter() - start, rss() - before
    row = {"load_s": load_s, "rss_gb": mem / 2**30}
    with torch.no_grad():
        prefix = torch.ones((1, FILL), dtype=torch.long)
        for k in (1, 6):
            runs = []
            for _ in range(REPEATS + 1):
                cache = transformers.DynamicCache()
                model(prefix, past_key_values=cache, use_cache=True)
                start = time.perf_counter()
                model(torch.ones((1, k), dtype=torch.long), past_key_values=cache,
                      use_cache=True)
                runs.append(time.perf_counter() - start)
            row[f"k{k}_s"] = statistics.median(runs[1:])  # first call warms up
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(registry.MODELS))
    p.add_argument("--out", default="results/bench_models.json")
    args = p.parse_args(argv)
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    report = {"environment": timing.environment(), "precision": "float32",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "torch_threads": torch.get_num_threads(), "cache_fill": FILL, "models": {}}
    spawn = multiprocessing.get_context("spawn")
    for name in args.models:
        registry.local_path(name)  # fetch outside the timed region
        row = {}
        for side, fn in (("ours", ours), ("transformers", theirs)):
            with spawn.Pool(1) as pool:  # a fresh process per side: clean RSS and caches
                row[side] = pool.apply(fn, (name,))
        report["models"][name] = row
        print(markdown(report), flush=True)
    timing.write_report(report, args.out)


def markdown(report) -> str:
    env = report["environment"]
    lines = [f"CPU float32, {env['machine']}, {env['cpu_count']} cores; jax {env['jax']}, "
             f"torch {report['torch']}, transformers {report['transformers']}; cache fill "
             f"{report['cache_fill']}", "",
             "| model | load s (ours / HF) | RSS GB (ours / HF) | decode K=1 ms (ours / HF, "
             "HF/ours) | score K=6 ms (ours / HF, HF/ours) |", "|---|---|---|---|---|"]
    for name, row in report["models"].items():
        o, t = row["ours"], row["transformers"]
        lines.append(
            f"| {name} | {o['load_s']:.1f} / {t['load_s']:.1f} | {o['rss_gb']:.2f} / "
            f"{t['rss_gb']:.2f} | {1e3 * o['k1_s']:.0f} / {1e3 * t['k1_s']:.0f}, "
            f"{t['k1_s'] / o['k1_s']:.2f}x | {1e3 * o['k6_s']:.0f} / {1e3 * t['k6_s']:.0f}, "
            f"{t['k6_s'] / o['k6_s']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
