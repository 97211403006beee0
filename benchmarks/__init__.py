"""The lab beside the library: benchmarks, peers, pricing and replays.

Not installed (``pip install`` ships ``specdec_jax`` only); run from the
repository root. It imports ``specdec_jax``, never the reverse (an
import-linter contract, ``.importlinter``).

- Each module holds one benchmark as a gin job: a keyword-only
  ``run_bench_<name>`` function that loads models through
  ``specdec_jax.jobs.resolver``, prices latency with ``specdec_jax.decode.cost``
  and writes JSON plus Markdown, registered in ``benchmarks.main.BENCH_JOBS``:
  ``python -m benchmarks.main --gin_file=benchmarks/configs/<name>.gin``.
- ``tpu_prices``: speedups priced from TPU compile reports (compiler estimates).
- ``scripts/``: one-off studies and replays (``python benchmarks/scripts/<name>.py``).
- ``reports/``: what they measured, cited by ``docs/results.md``.

Every figure is a ratio measured in one run, with the machine, precision and
versions recorded (``specdec_jax.runtime.timing.environment``).
"""
