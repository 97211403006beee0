"""Reads t5x checkpoints into our T5 v1.1 model, without depending on t5x.

A t5x checkpoint directory (``model_dir/checkpoint_<step>/``) holds a msgpack
file named ``checkpoint`` (written with ``flax.serialization``) and one
TensorStore array per partitioned parameter. In the msgpack tree a parameter
is either an inline array or a TensorStore spec whose kvstore path is relative
to the checkpoint directory (so checkpoints can be moved); t5x resolves it at
load time, and so do we. The tree is ``{"version": v, "optimizer": {"target":
params, "state": optimizer state}}`` (version 0 has no ``optimizer`` level).

``params`` uses t5x's T5 v1.1 names (``token_embedder``, ``encoder/layers_i/
attention/query/kernel``, ``decoder/logits_dense``, ``relpos_bias``), which are
exactly our ``T5EncoderDecoderLM`` tree, so no renaming happens; the
configuration is inferred from the shapes (heads from the relative-position
table, ``[H, num_buckets]``). Optimizer state is not read.

    model, params = load_t5x("gs-copy/t5_1_1_small")        # latest step
    model, params = load_t5x("model_dir", step=1_000_000)
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import numpy as np

from specdec_jax.checkpoints.tree_paths import check_shapes
from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM


def find_checkpoint_file(path: str | os.PathLike, step: int | None = None) -> pathlib.Path:
    """The msgpack file for ``path``: the file itself, a ``checkpoint_<step>``
    directory, or a model dir (``step`` given, else its latest step)."""
    path = pathlib.Path(path).expanduser()
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"t5x checkpoint {str(path)!r} does not exist; pass a model "
                                "dir, a checkpoint_<step> dir or its 'checkpoint' file.")
    if not (path / "checkpoint").is_file():
        steps = sorted(int(m.group(1)) for child in path.iterdir()
                       if (m := re.fullmatch(r"checkpoint_(\d+)", child.name))
                       and (child / "checkpoint").is_file())
        if not steps:
            raise FileNotFoundError(f"no t5x checkpoint in {str(path)!r}: expected a "
                                    "'checkpoint' file or checkpoint_<step>/checkpoint.")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise FileNotFoundError(f"step {step} is not in {str(path)!r}; it has steps "
                                    f"{steps}.")
        path = path / f"checkpoint_{step}"
    return path / "checkpoint"


def _is_tensorstore_spec(value: Any) -> bool:
    return isinstance(value, dict) and "driver" in value and (
        "kvstore" in value or "path" in value)


def _read_tensorstore(spec: dict, checkpoint_dir: pathlib.Path, name: str) -> np.ndarray:
    import tensorstore as ts  # noqa: PLC0415 (only t5x checkpoints need it)

    spec = dict(spec)
    if "kvstore" in spec:
        # t5x writes relative paths, and a gcs driver with a dummy bucket for
        # checkpoints made on GCS; a local copy reads them from files.
        location = str(checkpoint_dir / spec["kvstore"]["path"])
        spec["kvstore"] = {"driver": "file", "path": location}
    else:  # tensorstore < 0.1.14 specs keep the path at the top level
        location = spec["path"] = str(checkpoint_dir / spec["path"])
    if not os.path.isdir(location):
        raise FileNotFoundError(f"t5x parameter {name}: its array directory {location!r} is "
                                "missing; copy the whole checkpoint_<step> directory.")
    return np.asarray(ts.open(spec, open=True).result().read().result())


def read_t5x_params(path: str | os.PathLike, step: int | None = None) -> dict:
    """The parameter tree of a t5x checkpoint, every leaf a float32 numpy array."""
    from flax import serialization  # noqa: PLC0415

    file = find_checkpoint_file(path, step)
    try:
        contents = serialization.msgpack_restore(file.read_bytes())
    except Exception as err:  # msgpack raises several unrelated types
        raise ValueError(f"{str(file)!r} is not a t5x msgpack checkpoint ({err}); is the "
                         "file truncated?") from err
    optimizer = contents if contents.get("version", 0) == 0 else contents.get("optimizer", {})
    if "target" not in optimizer:
        raise ValueError(f"{str(file)!r} has no optimizer target (parameters); top-level keys "
                         f"are {sorted(contents)}. Is it a t5x training checkpoint?")

    def convert(tree, prefix):
        if _is_tensorstore_spec(tree):
            return _read_tensorstore(tree, file.parent, prefix).astype(np.float32)
        if isinstance(tree, dict):
            return {k: convert(v, f"{prefix}/{k}" if prefix else k) for k, v in tree.items()}
        return np.asarray(tree).astype(np.float32)

    return convert(optimizer["target"], "")


def config_from_params(params: dict, **overrides) -> T5Config:
    """T5 v1.1 hyperparameters implied by a t5x parameter tree's shapes."""
    try:
        vocab, d_model = params["token_embedder"]["embedding"].shape
        heads, buckets = params["encoder"]["relpos_bias"]["rel_embedding"].shape
        layer = params["encoder"]["layers_0"]
        d_ff = layer["mlp"]["wi_0"]["kernel"].shape[1]
        inner = layer["attention"]["query"]["kernel"].shape[1]
    except KeyError as err:
        raise ValueError(f"not a T5 v1.1 parameter tree: missing {err}. Only t5x's "
                         "T5 v1.1 network (gated-GELU, untied logits) is supported.") from None

    def count(stack):
        return sum(1 for k in params[stack] if re.fullmatch(r"layers_\d+", k))

    fields = dict(vocab_size=vocab, d_model=d_model, d_kv=inner // heads, d_ff=d_ff,
                  num_heads=heads, num_encoder_layers=count("encoder"),
                  num_decoder_layers=count("decoder"), relative_attention_num_buckets=buckets)
    return T5Config(**{**fields, **overrides})


def load_t5x(path: str | os.PathLike, step: int | None = None, **config_overrides
             ) -> tuple[T5EncoderDecoderLM, dict]:
    """(model, params) from a t5x checkpoint; ``config_overrides`` set fields
    the shapes cannot tell (e.g. ``relative_attention_max_distance``, dtype)."""
    params = read_t5x_params(path, step)
    model = T5EncoderDecoderLM(config_from_params(params, **config_overrides))
    check_shapes(params, model.init_params)  # also rejects tensors T5 v1.1 does not use
    return model, params
