"""Training: train state, pure train/eval steps, losses, optimizers, orbax runs."""

from specdec_jax.training.datasets import (
    ArrayDataset,
    MixtureDataset,
    bucket_by_length,
    lm_dataset,
    seq2seq_dataset,
)
from specdec_jax.training.forward import Batch, cross_entropy, lm_loss, teacher_forced
from specdec_jax.training.optimizers import OptimizerConfig, make_optimizer
from specdec_jax.training.steps import TrainState, init_state, make_eval_step, make_train_step
from specdec_jax.training.train_loop import TrainResult, train

__all__ = ["ArrayDataset", "Batch", "MixtureDataset", "OptimizerConfig", "TrainResult",
           "TrainState", "bucket_by_length", "cross_entropy", "init_state", "lm_dataset",
           "lm_loss", "make_eval_step", "make_optimizer", "make_train_step", "seq2seq_dataset",
           "teacher_forced", "train"]
