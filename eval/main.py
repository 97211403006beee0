"""Evaluation jobs: ``python -m eval.main --gin_file=... --gin_bindings=...``
(the same as ``specdec-jax eval ...``).

The jobs are ``run_study`` (the default: a quality-vs-latency sweep),
``run_generate`` (one method, outputs printed), ``run_benchmark`` (wall-clock
speed ratios at batch 1), the training and data jobs and ``tpu_compile``; a
config picks one with ``run.job`` (``specdec_jax.jobs.launch.JOBS`` lists
them). The lab's benchmarks run from ``python -m benchmarks.main``. Example::

    python -m eval.main --gin_file=configs/runs/cascades_humaneval.gin \\
        --gin_bindings="run_study.num_examples = 5"
"""

from __future__ import annotations

import sys

from specdec_jax.jobs import launch


def main(argv=None) -> int:
    return launch.main(argv, default_job="run_study", description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
