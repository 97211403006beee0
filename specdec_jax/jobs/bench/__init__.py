"""Benchmarks as gin jobs (``python -m eval.main --gin_file=configs/bench/<name>.gin``).

Each module holds one benchmark: a keyword-only ``run_bench_<name>`` function
that loads models through ``jobs.resolver``, prices latency with
``jobs.cost`` and writes JSON plus Markdown, registered in ``jobs.launch.JOBS``.
Every figure is a ratio measured in one run, with the machine, precision and
versions recorded (``runtime.timing.environment``).
"""
