"""Jobs: the top layer. Everything a gin config or the command line launches.

The launcher (``launch``), the ``specdec-jax`` command line (``cli``,
``generate``), quality-vs-latency studies (``study``, ``sweep``, ``report``),
the one cost model (``cost``), the T5 pair (``t5_pair``), the SpecDec++ data and
training jobs (``specdecpp``) and the benchmarks. Jobs import the library below
them (the decoding core, and the I/O and training layer); nothing below imports
a job.
"""
