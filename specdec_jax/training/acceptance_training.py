"""Training the acceptance head on the training core (SpecDec++, Huang et al., §4.2).

Loss, per example with soft label ``P`` (the acceptance probability) and
prediction ``P_hat = sigmoid(f(e))``::

    -w_acc * P log P_hat - w_rej * (1 - P) log(1 - P_hat)

``w_rej > 1`` makes predicted acceptances costlier to get wrong (a missed
rejection wastes a target call, an early stop only a draft), which is why the
seed recommends ``w_rej = 6``. The fit is reported as the unweighted binary
KL ``KL(Bern(P) || Bern(P_hat))`` on training and held-out examples, next to
the best constant predictor under the same loss, which a useful head must
beat (SpecDec++'s Table 3). Minimising the weighted loss over a constant gives
``c = w_acc m / (w_acc m + w_rej (1 - m))`` with ``m`` the training mean: for
``w_rej = 1`` that is ``m`` itself; for ``w_rej > 1`` the constant is as
pessimistic as the head is trained to be, so the comparison is like for like.
The plain mean's binary KL is reported too (``mean_constant_binary_kl``).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from specdec_jax.checkpoints.acceptance_head_io import load_head_for, save_head
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
from specdec_jax.training import acceptance_data as data_lib
from specdec_jax.training import train_loop
from specdec_jax.training.datasets import epoch_indices, padded_chunks
from specdec_jax.training.optimizers import OptimizerConfig

REPLICATED = ((r".*", PartitionSpec()),)  # the head is small: every device holds it


@flax.struct.dataclass
class FeatureBatch:
    features: jax.Array  # float32 [B, D]: the drafter's hidden state at a candidate token
    labels: jax.Array  # float32 [B]: P = min(1, p(Y) / q(Y))
    weights: jax.Array  # float32 [B]: 1 for real examples, 0 for padding


@dataclasses.dataclass(frozen=True, eq=False)
class FeatureDataset:
    """(feature, soft label) examples with the training core's data protocol
    (``batch(index, batch_size, seed)``: a pure function of its arguments)."""

    features: np.ndarray  # [N, D]
    labels: np.ndarray  # [N]

    def __post_init__(self):
        if len(self.features) == 0 or len(self.features) != len(self.labels):
            raise ValueError(f"{len(self.features)} features and {len(self.labels)} labels: "
                             "need the same, non-zero number.")
        if not np.all((self.labels >= 0) & (self.labels <= 1)):
            raise ValueError("acceptance labels must lie in [0, 1].")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, rows) -> FeatureDataset:
        return FeatureDataset(self.features[rows], self.labels[rows])

    def _batch(self, rows: np.ndarray, real: int) -> FeatureBatch:
        weights = (np.arange(len(rows)) < real).astype(np.float32)
        return FeatureBatch(features=self.features[rows].astype(np.float32),
                            labels=self.labels[rows].astype(np.float32), weights=weights)

    def batch(self, index: int, batch_size: int, seed: int) -> FeatureBatch:
        rows = epoch_indices(len(self), index, batch_size, seed)
        return self._batch(rows, batch_size)

    def batches(self, batch_size: int) -> list[FeatureBatch]:
        return [self._batch(rows, real) for rows, real in padded_chunks(len(self), batch_size)]


def binary_kl(label: jax.Array, logit: jax.Array) -> jax.Array:
    """KL(Bern(label) || Bern(sigmoid(logit))), with 0 log 0 = 0."""
    log_p, log_1p = jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit)
    entropy_terms = jnp.where(label > 0, label * jnp.log(jnp.maximum(label, 1e-30)), 0.0) + \
        jnp.where(label < 1, (1 - label) * jnp.log(jnp.maximum(1 - label, 1e-30)), 0.0)
    return entropy_terms - label * log_p - (1 - label) * log_1p


def make_head_loss(*, w_acc: float = 1.0, w_rej: float = 6.0):
    """A training-core ``LossFn`` for the head (``model`` is the AcceptanceHead)."""
    if w_acc <= 0 or w_rej <= 0:
        raise ValueError(f"w_acc and w_rej must be > 0, got {w_acc} and {w_rej}.")

    def loss_fn(model, params, batch: FeatureBatch, rng, extras=None):  # noqa: ARG001
        logit = model.logits(params, batch.features)
        bce = -(w_acc * batch.labels * jax.nn.log_sigmoid(logit)
                + w_rej * (1 - batch.labels) * jax.nn.log_sigmoid(-logit))
        weight_sum = batch.weights.sum()
        loss_sum = (bce * batch.weights).sum()
        predicted_accept = logit > 0
        return loss_sum / jnp.maximum(weight_sum, 1.0), {
            "loss_sum": loss_sum, "weight_sum": weight_sum,
            "binary_kl_sum": (binary_kl(batch.labels, logit) * batch.weights).sum(),
            "correct": ((predicted_accept == (batch.labels > 0.5)) * batch.weights).sum()}

    return loss_fn


def best_constant(train_labels: np.ndarray, *, w_acc: float = 1.0, w_rej: float = 1.0) -> float:
    """The constant ``P_hat`` that minimises the weighted loss on ``train_labels``."""
    mean = float(np.mean(train_labels))
    return w_acc * mean / (w_acc * mean + w_rej * (1 - mean))


def constant_binary_kl(train_labels: np.ndarray, labels: np.ndarray, *, w_acc: float = 1.0,
                       w_rej: float = 1.0) -> float:
    """Mean binary KL on ``labels`` of the best constant predictor under the
    ``(w_acc, w_rej)`` loss fitted on ``train_labels``."""
    constant = float(np.clip(best_constant(train_labels, w_acc=w_acc, w_rej=w_rej),
                             1e-6, 1 - 1e-6))
    logit = jnp.full(labels.shape, np.log(constant / (1 - constant)), jnp.float32)
    return float(jnp.mean(binary_kl(jnp.asarray(labels, jnp.float32), logit)))


def train_head(*, workdir: str, data_dir: str, pair: dict, depth: int = 3,
               w_acc: float = 1.0, w_rej: float = 6.0, learning_rate: float = 5e-5,
               epochs: float = 3.0, batch_size: int = 32, held_out_shards: int = 1,
               seed: int = 0, progress: bool = True) -> dict:
    """Trains a head on ``data_dir``'s shards (the last ``held_out_shards``
    held out: their prompts are unseen) with Adam and a cosine schedule, the
    drafter frozen (only its stored features are read). Saves the head to
    ``workdir/head`` and returns the fit: binary KL on train and held-out
    examples, and that of the best constant under the same loss."""
    if pathlib.Path(workdir, "head").exists():  # fail before training, not after it
        raise FileExistsError(f"{workdir}/head exists: this run is finished. Choose a new "
                              "workdir, or delete the old head to train it again.")
    train_set, held_out, manifest = split_shards(data_dir, pair, held_out_shards)
    head = AcceptanceHead(HeadConfig(hidden_size=train_set.features.shape[1], depth=depth))
    params = head.init_params(jax.random.PRNGKey(seed),
                              prior_acceptance=float(train_set.labels.mean()))
    num_steps = max(1, int(round(epochs * len(train_set) / batch_size)))
    optimizer = OptimizerConfig(name="adamw", learning_rate=learning_rate, schedule="cosine",
                                total_steps=num_steps, weight_decay=0.0)
    loss_fn = make_head_loss(w_acc=w_acc, w_rej=w_rej)
    result = train_loop.train(model=head, params=params, optimizer=optimizer, data=train_set,
                        num_steps=num_steps, batch_size=batch_size, workdir=workdir, seed=seed,
                        loss_fn=loss_fn, eval_data=held_out,
                        eval_every=max(num_steps // 10, 1), rules=REPLICATED,
                        checkpoint_every=max(num_steps // 10, 1), progress=progress,
                        fingerprint_extra={"data": str(data_dir), "w_acc": w_acc,
                                           "w_rej": w_rej, "pair": pair})
    fit = {name: mean_binary_kl(head, result.state.params, dataset)
           for name, dataset in (("train", train_set), ("held_out", held_out))}
    summary = {
        "depth": depth, "w_acc": w_acc, "w_rej": w_rej, "learning_rate": learning_rate,
        "epochs": epochs, "steps": num_steps, "batch_size": batch_size,
        "held_out_shards": held_out_shards,
        "train_examples": len(train_set), "held_out_examples": len(held_out),
        "binary_kl": fit,
        "constant": best_constant(train_set.labels, w_acc=w_acc, w_rej=w_rej),
        "constant_binary_kl": {
            name: constant_binary_kl(train_set.labels, dataset.labels, w_acc=w_acc, w_rej=w_rej)
            for name, dataset in (("train", train_set), ("held_out", held_out))},
        "mean_constant_binary_kl": {
            name: constant_binary_kl(train_set.labels, dataset.labels)
            for name, dataset in (("train", train_set), ("held_out", held_out))},
        "mean_label": {"train": float(train_set.labels.mean()),
                       "held_out": float(held_out.labels.mean())},
        "data": manifest["settings"], "seconds": result.seconds}
    save_head(f"{workdir}/head", head, result.state.params, drafter_name=pair["drafter"],
              fingerprint=pair["drafter_fingerprint"], extra={"training": summary})
    return summary


def split_shards(data_dir: str, pair: dict, held_out_shards: int
                 ) -> tuple[FeatureDataset, FeatureDataset, dict]:
    """(train, held-out, manifest): whole shards are held out, so held-out
    examples come from prompts the head never saw."""
    features, labels, manifest = data_lib.load_shards(data_dir, pair)
    names = sorted(manifest["shards"])
    if not 1 <= held_out_shards < len(names):
        raise ValueError(f"{data_dir} has {len(names)} shards; held_out_shards must be in "
                         f"1..{len(names) - 1}.")
    sizes = [manifest["shards"][n]["examples"] for n in names]
    cut = sum(sizes[:len(names) - held_out_shards])
    dataset = FeatureDataset(features, labels)
    return dataset.subset(slice(0, cut)), dataset.subset(slice(cut, None)), manifest


def mean_binary_kl(head, params, dataset: FeatureDataset, batch_size: int = 4096) -> float:
    total = 0.0
    for batch in dataset.batches(batch_size):
        kl = binary_kl(jnp.asarray(batch.labels), head.logits(params, jnp.asarray(batch.features)))
        total += float((kl * batch.weights).sum())
    return total / len(dataset)


def evaluate_head(head_dir: str, data_dir: str, held_out_shards: int) -> dict:
    """A trained head on another build's held-out shards (e.g. a head trained
    on corpus responses, scored on target responses): binary KL, the mean
    prediction against the mean label (calibration), and the best constant
    under the head's own training loss. The head must have been trained for
    the drafter whose features the data holds."""


    pair = json.loads(pathlib.Path(data_dir, data_lib.MANIFEST).read_text())["pair"]
    head, params, meta = load_head_for(head_dir, drafter_name=pair["drafter"],
                                       fingerprint=pair["drafter_fingerprint"])
    train_set, held_out, manifest = split_shards(data_dir, pair, held_out_shards)
    training = meta.get("training", {})
    _check_unseen(training, manifest["settings"], held_out_shards, head_dir)
    predictions = np.concatenate([
        np.asarray(jax.nn.sigmoid(head.logits(params, jnp.asarray(b.features))))[b.weights > 0]
        for b in held_out.batches(4096)])
    weights = {"w_acc": training.get("w_acc", 1.0), "w_rej": training.get("w_rej", 1.0)}
    return {"head": str(head_dir), "data": str(data_dir),
            "data_source": manifest["settings"]["source"],
            "held_out_examples": len(held_out),
            "binary_kl": mean_binary_kl(head, params, held_out),
            "constant_binary_kl": constant_binary_kl(train_set.labels, held_out.labels,
                                                     **weights),
            "mean_prediction": float(predictions.mean()),
            "mean_label": float(held_out.labels.mean()), **weights,
            "depth": meta["config"]["depth"]}


def _check_unseen(training: dict, settings: dict, held_out_shards: int, head_dir: str) -> None:
    """Refuses to score a head on shards it trained on. Builds from the same
    prompts in the same shard layout (either source) share prompts shard by
    shard, so the last ``held_out_shards`` are unseen only if the head held out
    at least as many; a head that does not record how many is refused there."""
    trained_on = training.get("data", {})
    layout = ("batch_size", "shard_batches", "sequences")
    same_prompts = (trained_on.get("prompts", {}).get("sha256")
                    == settings.get("prompts", {}).get("sha256")
                    and all(trained_on.get(k) == settings.get(k) for k in layout))
    if not same_prompts:
        return
    recorded = training.get("held_out_shards")
    if recorded is None:
        raise ValueError(
            f"{head_dir} does not record how many shards it held out, and this build shares "
            "its prompts, so its score might not be held out. Retrain it (heads record "
            "held_out_shards), or add the count it held out to head.json's training.")
    if recorded < held_out_shards:
        raise ValueError(
            f"{head_dir} trained on some of the last {held_out_shards} shards of this build's "
            f"prompts (it held out {recorded}); its score there would not be held out. Pass "
            "held_out_shards no larger than the head's.")
