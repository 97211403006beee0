"""Native CPU kernels behind pure-JAX fallbacks.

``native.matmul`` routes the few-row products of decoding (a step, a scoring
call) to a C++ kernel registered through ``jax.ffi`` when one has been built
and loaded (``specdec_jax.runtime.cpu_kernels.enable``), and to XLA's dot
everywhere else: other backends, more rows, several devices, or no compiler.
"""
