"""Per-model costs on CPU float32, ours vs Hugging Face ``transformers`` (same GGUF).

For each model, in one run: load time (GGUF read + dequantise + device put),
resident memory added by the load (each side measured in a fresh process,
``jobs.bench.child``, so memory freed by one load cannot hide the next), decode
latency of one token (K = 1) and scoring latency of K = 6 tokens at a fixed
cache fill, with the ratio theirs / ours (> 1 means we are faster). Compile
time is excluded (``configs/bench/models.gin``)::

    python -m eval.main --gin_file=configs/bench/models.gin \\
        --gin_bindings="bench_models.models = ['smollm2-135m', 'qwen2.5-coder-0.5b']"
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from specdec_jax import api
from specdec_jax.checkpoints import registry
from specdec_jax.jobs import resolver
from specdec_jax.jobs.bench import child, shared
from specdec_jax.models.layers import IN_OUT
from specdec_jax.runtime import timing

FILL = 128  # tokens already in the cache when K tokens are fed
REPEATS = 10
SIDES = ("ours", "transformers")


def run_bench_models(*, models: Sequence[str] = tuple(registry.MODELS),
                     out: str = "results/bench_models.json",
                     markdown_path: str | None = None) -> dict:
    """Both sides of every model (registry names: the peer loads the same GGUF
    file), each side in a fresh process. Writes the JSON report to ``out`` after
    every model and prints the Markdown table as it grows (the last one also to
    ``markdown_path`` if given)."""
    models = list(models)
    # Registry names only: the peer loads the same GGUF file.
    shared.check_choices("models", models, registry.MODELS)
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    report = {"environment": timing.environment(), "precision": "float32",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "torch_threads": torch.get_num_threads(), "cache_fill": FILL, "models": {}}
    for name in models:
        registry.local_path(name)  # fetch outside the timed region
        # A fresh process per side: clean RSS and caches.
        report["models"][name] = {side: child.run_in_child(
            f"specdec_jax.jobs.bench.models:{function}", {"name": name})
            for side, function in zip(SIDES, ("ours", "theirs"), strict=True)}
        shared.write_report(report, out)
        if name != models[-1]:
            print(markdown(report), flush=True)
    timing.print_markdown(markdown(report), markdown_path)
    return report


def rss() -> int:
    import psutil  # noqa: PLC0415 (a dev dependency; the launcher imports every job)

    return psutil.Process().memory_info().rss


def ours(*, name: str) -> dict:
    gc.collect()
    before, start = rss(), time.perf_counter()
    model, params, _ = resolver.resolve(name, kernel_layout=IN_OUT)  # the tree as loaded
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
    return row


def theirs(*, name: str) -> dict:
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
