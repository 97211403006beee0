"""The TPU compile job (docs/tpu.md): ``compile_job`` compiles the library's
programs for a TPU topology from any machine (``aot``), built from shapes alone
(``programs``: decoding; ``training_steps``: the training recipes), and reports
what the compiler says, read from the optimised HLO where XLA's API is silent
(``hlo_stats``). Its figures are compiler estimates: nothing runs on a TPU."""
