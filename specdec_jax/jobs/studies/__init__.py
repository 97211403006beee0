"""Quality-vs-latency studies on real tasks (SpecCascade §6): ``gin_jobs`` holds the
gin jobs (``run_study``, ``run_generate``, ``run_benchmark``), ``sweep`` the
grid of points and their counted calls, ``report`` the tables and plots, and
``t5_quality`` the T5 pair's held-out quality."""
