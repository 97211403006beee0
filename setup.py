"""specdec_jax: speculative decoding, speculative cascades and drafter training in JAX."""

from setuptools import find_packages, setup

CORE = [
    "jax>=0.4.30",
    "jaxlib>=0.4.30",
    "flax>=0.10",
    "optax>=0.2",
    "orbax-checkpoint>=0.6",
    "gin-config>=0.5",
    "numpy>=1.26",
    "safetensors>=0.4",
    "gguf>=0.10",
    "tokenizers>=0.19",
    "sentencepiece>=0.2",
    "tqdm>=4.66",
    "jinja2>=3.1",  # chat templates carried by checkpoints
]

# The reference peer (torch, transformers) lives only here: the library never
# imports it. torch is pinned to the CPU build that CI machines carry.
DEV = [
    "pytest>=8",
    "torch==2.13.0",
    "transformers>=4.45",
    "accelerate>=0.30",
    "ruff>=0.5",
    "scipy>=1.11",
    "psutil>=5.9",
    "import-linter>=2.1",  # the layer contracts (.importlinter; tests/test_layers.py)
]

# Quality metrics and plots of the evaluation sweep (imported lazily by specdec_jax.data.metrics).
EVAL = ["sacrebleu>=2.4", "rouge-score>=0.1.2", "matplotlib>=3.8"]

# Training runs: TensorBoard event files beside metrics.jsonl (specdec_jax.training.checkpointing).
TRAIN = ["tensorboard>=2.15"]

# seqio Tasks (specdec_jax.data.seqio_tasks): seqio pulls TensorFlow (~2.5 GB installed).
SEQIO = ["seqio>=0.0.19", "tensorflow>=2.16"]

setup(
    name="specdec_jax",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["specdec_jax", "specdec_jax.*"]),
    package_data={"specdec_jax.data": ["tables/*.npz"]},
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require={"dev": DEV + EVAL + TRAIN, "eval": EVAL, "train": TRAIN, "seqio": SEQIO},
    entry_points={"console_scripts": ["specdec-jax=specdec_jax.jobs.cli:main"]},
)
