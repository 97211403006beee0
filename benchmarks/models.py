"""Per-model costs on CPU float32, ours vs Hugging Face ``transformers`` (same GGUF).

For each model, in one run: load time (GGUF read + dequantise + device put),
resident memory added by the load (each side measured in a fresh process,
``benchmarks.child``, so memory freed by one load cannot hide the next), decode
latency of one token (K = 1) and scoring latency of K = 6 tokens at a fixed
cache fill, with the ratio theirs / ours (> 1 means we are faster). Compile
time is excluded (``benchmarks/configs/models.gin``)::

    python -m benchmarks.main --gin_file=benchmarks/configs/models.gin \\
        --gin_bindings="bench_models.models = ['smollm2-135m', 'qwen2.5-coder-0.5b']"
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from benchmarks import child, peers, shared
from benchmarks.peers import FILL, REPEATS
from specdec_jax import api
from specdec_jax.checkpoints import registry
from specdec_jax.jobs import resolver
from specdec_jax.models.layers import IN_OUT
from specdec_jax.runtime import timing

# Each side's function, run in a fresh process.
SIDES = {"ours": "benchmarks.models:ours",
         "transformers": "benchmarks.peers:step_latency"}


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
        report["models"][name] = {side: child.run_in_child(function, {"name": name})
                                  for side, function in SIDES.items()}
        shared.write_report(report, out)
        if name != models[-1]:
            print(peers.models_markdown(report), flush=True)
    timing.print_markdown(peers.models_markdown(report), markdown_path)
    return report


def ours(*, name: str) -> dict:
    """Our side: load time, resident memory added by the load and the median
    of one call of K = 1 and K = 6 tokens after ``FILL`` cached ones."""
    gc.collect()
    before, start = child.rss(), time.perf_counter()
    model, params, _ = resolver.resolve(name, kernel_layout=IN_OUT)  # the tree as loaded
    jax.block_until_ready(params)
    load_s, mem = time.perf_counter() - start, child.rss() - before
    row = {"load_s": load_s, "rss_gb": mem / 2**30}
    model, params = api.decode_layout(model, params)  # as the decoders run it (after the load)
    fn = jax.jit(lambda p, t, c: model.extend(p, t, c).logits)
    for k in (1, 6):
        cache = model.init_cache(1, FILL + 8).replace(lengths=jnp.array([FILL], jnp.int32))
        tokens = jnp.ones((1, k), jnp.int32)
        compiled = timing.Compiled(fn, params, tokens, cache)
        row[f"k{k}_s"] = compiled.time(params, tokens, cache, repeats=REPEATS).median_s
    return row
