"""The lab's launcher: ``python -m benchmarks.main --gin_file=benchmarks/configs/<name>.gin``.

The package's gin launcher (``specdec_jax.jobs.launch``) with the benchmark
jobs added: the ``bench_*`` timing jobs and ``tpu_prices``. It runs the
package's own jobs too (``run_study``, ``tpu_compile`` ...), so every lab
config runs from here. Run from the repository root (``benchmarks`` is not
installed: ``pip install`` ships the library, not its lab). Example::

    python -m benchmarks.main --gin_file=benchmarks/configs/speculative.gin
"""

from __future__ import annotations

import sys

from specdec_jax.jobs import launch

# job name -> "module:function" (imported when the launcher starts).
BENCH_JOBS = {
    "bench_accelerator": "benchmarks.accelerator:run_bench_accelerator",
    "bench_scoring": "benchmarks.scoring:run_bench_scoring",
    "bench_models": "benchmarks.models:run_bench_models",
    "bench_specdecpp": "benchmarks.specdecpp:run_bench_specdecpp",
    "bench_specdecpp_device": "benchmarks.specdecpp:run_bench_specdecpp_device",
    "bench_specdecpp_heads": "benchmarks.specdecpp_heads:run_bench_specdecpp_heads",
    "bench_specdecpp_head_sources":
        "benchmarks.specdecpp_head_sources:run_bench_specdecpp_head_sources",
    "bench_drafting": "benchmarks.drafting:run_bench_drafting",
    "bench_drafter_variants": "benchmarks.drafter_variants:run_bench_drafter_variants",
    "bench_verifiers": "benchmarks.verifiers:run_bench_verifiers",
    "bench_trees": "benchmarks.trees:run_bench_trees",
    "bench_speculative": "benchmarks.speculative:run_bench_speculative",
    "bench_batch": "benchmarks.batch:run_bench_batch",
    "bench_feature_steps": "benchmarks.feature_steps:run_bench_feature_steps",
    "bench_feature_drafter": "benchmarks.feature_drafter:run_bench_feature_drafter",
    "tpu_prices": "benchmarks.tpu_prices:run_tpu_prices",
}


def main(argv=None) -> int:
    return launch.main(argv, default_job="bench_speculative",
                       description=__doc__.splitlines()[0], extra_jobs=BENCH_JOBS)


if __name__ == "__main__":
    sys.exit(main())
