"""specdec_jax: speculative decoding, speculative cascades and drafter training in JAX."""

from setuptools import find_packages, setup

# Bounds are what was tested, not guesses: CI installs jax/jaxlib 0.10.2, flax
# 0.12.8, optax 0.2.8 and orbax-checkpoint 0.12.8 (CPU); the GPU sessions ran the
# suite and the benchmarks on jax/jaxlib 0.11.2, flax 0.12.10 and orbax-checkpoint
# 0.12.4. jax moves its API between 0.x minors, and the code leans on parts that
# move: the coordination service's barrier (runtime/distributed.py reads
# jax._src.distributed), jax.make_array_from_callback and jax.tree.* (sharding.py).
# So each 0.x package is bounded to the minors that ran, from the tested release.
CORE = [
    "jax>=0.10.2,<0.12",
    "jaxlib>=0.10.2,<0.12",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.4,<0.13",
    "gin-config>=0.5",
    "numpy>=2.0",  # jax 0.10 needs it
    "safetensors>=0.4",
    "gguf>=0.10",
    "tokenizers>=0.19",
    "sentencepiece>=0.2",
    "tqdm>=4.66",
    "jinja2>=3.1",  # chat templates carried by checkpoints
]

# The reference peer (torch, transformers) lives only here: the library never
# imports it. torch is pinned to the release CI tests; CI installs its CPU wheel
# (README, "Install": pip's --index-url https://download.pytorch.org/whl/cpu).
# transformers 5 is what the parity tests ran against (5.24.0); 4.x is untested.
DEV = [
    "pytest>=8",
    "pytest-xdist>=3.5",  # pytest.ini runs the suite in two worker processes
    "torch==2.13.0",
    "transformers>=5.24,<6",
    "accelerate>=1.0",
    "ruff>=0.17,<0.18",  # the lint test (tests/test_lint.py) checks with the tested rules
    "scipy>=1.14",
    "psutil>=5.9",
    "import-linter>=2.17,<3",  # the layer contracts (.importlinter; tests/test_layers.py)
]

# Quality metrics and plots of the evaluation sweep (imported lazily by specdec_jax.data.metrics).
EVAL = ["sacrebleu>=2.4", "rouge-score>=0.1.2", "matplotlib>=3.8"]

# Training runs: TensorBoard event files beside metrics.jsonl (specdec_jax.training.run_io).
TRAIN = ["tensorboard>=2.15"]

# seqio Tasks (specdec_jax.data.seqio_tasks): seqio pulls TensorFlow (~2.5 GB installed).
SEQIO = ["seqio>=0.0.20", "tensorflow>=2.21"]  # tested: seqio 0.0.20, tensorflow 2.21.0

# libtpu (~700 MB), matched to jax: runs on a TPU VM, and compiles for TPU topologies on any
# machine (the tpu_compile job, tests/test_tpu_compile.py; tested with libtpu 0.0.42.1).
TPU = ["jax[tpu]>=0.10.2,<0.12"]

setup(
    name="specdec_jax",
    version="0.1.0",
    description=__doc__,
    license="Apache-2.0",
    # The user's gin configs (configs/) ship inside the package as specdec_jax/configs,
    # where the launcher finds them by name from any directory (jobs.launch.CONFIGS_PARENT).
    # The lab (benchmarks/) is not installed.
    packages=find_packages(include=["specdec_jax", "specdec_jax.*"]) + ["specdec_jax.configs"],
    package_dir={"specdec_jax.configs": "configs"},
    package_data={"specdec_jax.data": ["packaged/*.npz", "packaged/*.json"],
                  "specdec_jax.native": ["*.cc", "*.h"],
                  "specdec_jax.configs": ["models/*.gin", "runs/*.gin"]},
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require={"dev": DEV + EVAL + TRAIN, "eval": EVAL, "train": TRAIN, "seqio": SEQIO,
                    "tpu": TPU},
    entry_points={"console_scripts": ["specdec-jax=specdec_jax.jobs.cli:main"]},
)
