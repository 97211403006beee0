"""Jobs: the top layer. Everything a gin config or the command line launches,
by concern:

- ``cli/``: the ``specdec-jax`` command line (``main``) and its ``generate``
  command (real models, the speedup measured in the same run);
- ``studies/``: quality-vs-latency studies on real tasks (``runs``: the gin
  jobs ``run_study``, ``run_generate``, ``run_benchmark``; ``sweep``,
  ``report``) and the T5 pair's quality (``t5_quality``);
- ``tpu/``: the TPU compile job (``compile_job``, over ``aot``,
  ``programs``, ``training_steps`` and ``hlo_stats``);
- here: the gin launcher (``launch``), the one model resolver (``resolver``),
  the draft-head data and training jobs (``head_training``) and the report
  tables every job and benchmark prints (``tables``).

Jobs call the API, the cost model (``decode.cost``) and the timing beneath it
(``runtime.calibration``); they never re-check a request (``api.decoder_spec``)
or re-price one. Nothing below imports a job.
"""
