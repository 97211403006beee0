"""Prefill time of a drafter stored in bfloat16 / int8: XLA's dot (weights
widened to a float32 copy on every call) against the CPU kernel (weights read
as stored), at several prompt widths.

``native.matmul`` sends narrow weights to the kernel up to ``MAX_ROWS_NARROW``
rows; this script times both sides of that rule by moving the limit (32 rows:
every prefill here takes XLA's dot; a large limit: the kernel). Prompts are
the first HumanEval prompts' tokens joined, cut to each width; the drafter's
head is cut to 32,768 tokens as the first command does. Example::

    python benchmarks/scripts/bench_prefill_storage.py --widths 96 166 512
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from specdec_jax.data import batching, bigram, tasks
from specdec_jax.drafting.model_drafter import start_token_and_prefill
from specdec_jax.jobs.resolver import resolve
from specdec_jax.models import weight_storage
from specdec_jax.native import matmul as native_matmul
from specdec_jax.runtime import cpu_kernels, devices, timing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--widths", type=int, nargs="+", default=[96, 166, 512])
    parser.add_argument("--formats", nargs="+", default=["int8", "bf16"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if not cpu_kernels.enable():
        raise SystemExit("the CPU kernel could not be built here; nothing to compare.")
    model, params, tok = resolve(args.model)
    ids = sum((tok.encode(ex.prompt) for ex in tasks.get_task("humaneval").load("test", 40)), [])
    if max(args.widths) > len(ids):
        raise SystemExit(f"--widths up to {len(ids)} tokens (the prompts joined).")
    stored = {}
    for fmt in args.formats:
        narrow = weight_storage.store_weights(params, fmt, kernel_layout=model.config.kernel_layout)
        stored[fmt] = bigram.restrict_head(model, narrow, 32768, eos_ids=tok.eos_token_ids,
                                           table=bigram.table_for(bigram.AUTO, tok,
                                                                  model.vocab_size))
    print(f"{args.model}, prefill ms (median of {args.repeats}), {timing.environment()}")
    print("| width | weights | XLA's dot (widened) | kernel | widened / kernel |")
    print("|---|---|---|---|---|")
    limit = native_matmul.MAX_ROWS_NARROW
    try:
        for width in args.widths:
            prompt = batching.make_prompt([ids[:width]], pad_to=width)
            for fmt, (cut_model, cut_params) in stored.items():
                ms = {}
                for name, rows in (("xla", native_matmul.MAX_ROWS), ("kernel", width)):
                    native_matmul.MAX_ROWS_NARROW = rows  # read while tracing
                    fn = jax.jit(lambda p, prompt, m=cut_model, room=width + 80:
                                 start_token_and_prefill(m, p, prompt, room))
                    run = timing.Compiled(fn, cut_params, prompt).time(
                        cut_params, prompt, repeats=args.repeats)
                    ms[name] = 1e3 * float(np.median(run.run_s))
                print(f"| {width} | {fmt} | {ms['xla']:.0f} | {ms['kernel']:.0f} | "
                      f"{ms['xla'] / ms['kernel']:.2f} |", flush=True)
    finally:
        native_matmul.MAX_ROWS_NARROW = limit
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
