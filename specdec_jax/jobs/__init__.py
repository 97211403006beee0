"""Jobs: the top layer. Everything a gin config or the command line launches.

The launcher (``launch``), the ``specdec-jax`` command line (``cli``,
``generate``), quality-vs-latency studies (``study``, ``sweep``, ``report``),
the one cost model (``cost``), the T5 pair's quality (``t5_quality``), the
draft-head data and training jobs (``head_training``) and the TPU compile job
(``tpu_compile``, over ``tpu_aot``, ``tpu_programs``, ``tpu_training`` and
``hlo_stats``). Jobs import the library below them (the decoding core, and
the I/O and training layer); nothing below imports a job.
"""
