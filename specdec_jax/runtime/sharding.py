"""Sharding: a ``Mesh`` with ``data`` and ``model`` axes, partition rules per
model family, batches sharded along ``data``.

The decoding loops are sharding-agnostic: place the parameters and the prompt
with these helpers and ``jit`` propagates the layout (GSPMD) through the
while loop. Rules shard the large matrices along ``model`` (attention heads
and MLP width, Megatron style) and replicate norms; the vocabulary axis of
the embedding is sharded too, since it is the largest tensor of small models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_jax.models.interface import Prompt, is_encoder_decoder
from specdec_jax.models.layers import OUT_IN

DATA, MODEL = "data", "model"

# (regex on the "/"-joined parameter path, spec). First match wins.
DECODER_RULES: tuple[tuple[str, PartitionSpec], ...] = (
    (r"embedder/embedding$", PartitionSpec(MODEL, None)),
    (r"attention/(query|key|value)/kernel$", PartitionSpec(None, MODEL)),
    (r"attention/(query|key|value)/bias$", PartitionSpec(MODEL)),
    (r"attention/out/kernel$", PartitionSpec(MODEL, None)),
    (r"mlp/wi_[01]/kernel$", PartitionSpec(None, MODEL)),
    (r"mlp/wo/kernel$", PartitionSpec(MODEL, None)),
    (r"logits_dense/kernel$", PartitionSpec(None, MODEL)),
    (r".*", PartitionSpec()),
)
# The same rules for decoder kernels stored [out, in] (the decode layout,
# ``models.decoder.with_kernel_layout``): each kernel's spec transposed with it,
# and the fused projections ([H_kv, G + 2, D_head, D] q/k/v, [2, I, D] gate/up)
# sharded along their unit axis: whole kv groups with their query heads, and the
# gate and up rows of the same units, so a shard never holds part of a head (where
# the model axis does not divide H_kv the kernel is replicated, ``_spec_fits``, and
# so is the layer's attention output kernel, ``param_specs``).
DECODER_RULES_OUT_IN: tuple[tuple[str, PartitionSpec], ...] = (
    (r"attention/qkv/kernel$", PartitionSpec(MODEL, None, None, None)),
    (r"attention/qkv/bias$", PartitionSpec(MODEL, None, None)),
    (r"mlp/wi/kernel$", PartitionSpec(None, MODEL, None)),
) + tuple(
    (pattern, PartitionSpec(*reversed(spec)) if pattern.endswith("kernel$") else spec)
    for pattern, spec in DECODER_RULES)
T5_RULES: tuple[tuple[str, PartitionSpec], ...] = (
    (r"token_embedder/embedding$", PartitionSpec(MODEL, None)),
    (r"attention/(query|key|value)/kernel$", PartitionSpec(None, MODEL)),
    (r"attention/out/kernel$", PartitionSpec(MODEL, None)),
    (r"mlp/wi_[01]/kernel$", PartitionSpec(None, MODEL)),
    (r"mlp/wo/kernel$", PartitionSpec(MODEL, None)),
    (r"logits_dense/kernel$", PartitionSpec(None, MODEL)),
    (r".*", PartitionSpec()),
)


def rules_for(model) -> tuple[tuple[str, PartitionSpec], ...]:
    """The partition rules of ``model``'s family and kernel layout."""
    if is_encoder_decoder(model):
        return T5_RULES
    layout = getattr(getattr(model, "config", None), "kernel_layout", None)
    return DECODER_RULES_OUT_IN if layout == OUT_IN else DECODER_RULES


def make_mesh(data: int | None = None, model: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, model) mesh over ``devices`` (default: all); ``data`` defaults
    to what is left after ``model``."""
    devices = list(devices or jax.devices())
    if data is None:
        data = len(devices) // model
    if data * model != len(devices):
        raise ValueError(f"mesh {data} x {model} does not cover {len(devices)} devices; "
                         "choose data * model == number of devices.")
    return Mesh(np.asarray(devices).reshape(data, model), (DATA, MODEL))


def _spec_fits(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """Drops a sharded axis whose size the mesh axis does not divide (small
    tensors, few KV heads): replication is always correct."""
    fitted = []
    for axis, dim in zip(tuple(spec) + (None,) * (len(shape) - len(spec)), shape):
        fitted.append(axis if axis is None or dim % mesh.shape[axis] == 0 else None)
    return PartitionSpec(*fitted)


def place(value, sharding: NamedSharding) -> jax.Array:
    """A global array from a value every process holds in full: each process
    fills only the shards on its own devices (``jax.device_put`` would need
    every device to be addressable, i.e. one process)."""
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


_FUSED_QKV = re.compile(r"attention/qkv/kernel$")
_ATTENTION_OUT = re.compile(r"attention/out/kernel$")


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def param_specs(params, mesh: Mesh, rules=DECODER_RULES):
    """The ``NamedSharding`` of every parameter: the first matching rule,
    replicated along axes the mesh does not divide.

    Where a layer's fused q/k/v kernel is replicated (the model axis does not
    divide H_kv), its attention output kernel is replicated too, so the whole
    attention runs on every chip of the model axis as q/k/v and the KV cache
    do. Split by rows, the partitioner carried that split back into attention
    against the replicated q/k/v and cache: the cache update ran split by KV
    head and every layer's whole keys and values were all-gathered back every
    step (both real models on 4 chips), and where the split is whole query
    heads (1.5B: 12 heads over 4) q/k/v moved between chips by
    collective-permutes and an extra all-reduce (docs/results.md, 'TPU
    compiler estimates')."""

    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = [_path_name(path) for path, _ in leaves]
    specs = [_spec_fits(next(s for pattern, s in rules if re.search(pattern, name)),
                        np.shape(leaf), mesh) for name, (_, leaf) in zip(names, leaves)]
    whole_attention = {name[:-len("qkv/kernel")] for name, spec in zip(names, specs)
                       if _FUSED_QKV.search(name) and MODEL not in tuple(spec)}
    specs = [PartitionSpec() if _ATTENTION_OUT.search(name)
             and name[:-len("out/kernel")] in whole_attention else spec
             for name, spec in zip(names, specs)]
    return jax.tree_util.tree_unflatten(treedef, [NamedSharding(mesh, s) for s in specs])


def abstract_params(params, mesh: Mesh, rules=DECODER_RULES):
    """Shapes, dtypes and shardings only (``jax.ShapeDtypeStruct``): the target
    layout for ``orbax_io.restore_params``, so each process reads just its own
    shards of a checkpoint and no host ever holds the whole tree. ``params``
    may itself be abstract (``jax.eval_shape(model.init_params, key)``)."""
    return jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype,
                                                    sharding=sharding),
        params, param_specs(params, mesh, rules))


def shard_params(params, mesh: Mesh, rules=DECODER_RULES):
    """Places every parameter according to the first matching rule."""
    return jax.tree_util.tree_map(place, params, param_specs(params, mesh, rules))


def reshard_params(params, mesh: Mesh, rules=DECODER_RULES):
    """Parameters already on the mesh's devices (e.g. converted there, in a
    layout whose sharding XLA chose) moved to the rules' shardings; a jitted
    identity, so it works across processes, where no host holds a whole array."""
    return jax.jit(lambda p: p, out_shardings=param_specs(params, mesh, rules))(params)


def local_rows(batch: int, mesh: Mesh) -> list[int]:
    """The rows of a ``[batch, ...]`` array sharded along ``data`` that this
    process's devices hold (all of them in a one-process run)."""
    spec = NamedSharding(mesh, PartitionSpec(DATA))
    rows = set()
    for index in spec.addressable_devices_indices_map((batch,)).values():
        rows.update(range(*index[0].indices(batch)))
    return sorted(rows)


def prompt_from_rows(make_row, batch: int, width: int, mesh: Mesh) -> Prompt:
    """A ``[batch, width]`` prompt sharded along ``data`` of which this
    process builds (tokenises, reads) only its own rows: ``make_row(i)``
    returns row ``i``'s tokens and is called for ``local_rows`` alone; the
    other processes fill theirs."""
    if batch % mesh.shape[DATA]:
        raise ValueError(f"batch size {batch} is not divisible by the data axis "
                         f"({mesh.shape[DATA]}); choose a batch size that is.")
    tokens, lengths = np.zeros((batch, width), np.int32), np.zeros((batch,), np.int32)
    for row in local_rows(batch, mesh):
        ids = list(make_row(row))
        if not 0 < len(ids) <= width:
            raise ValueError(f"prompt row {row} has {len(ids)} tokens; it needs 1..{width} "
                             "(raise the width or shorten the prompt).")
        tokens[row, :len(ids)], lengths[row] = ids, len(ids)
    return Prompt(tokens=place(tokens, NamedSharding(mesh, PartitionSpec(DATA, None))),
                  lengths=place(lengths, NamedSharding(mesh, PartitionSpec(DATA))))


def shard_prompt(prompt: Prompt, mesh: Mesh) -> Prompt:
    """Shards the batch along ``data`` (the batch must divide by its size).
    Every process passes the whole batch; each keeps its rows' shards."""
    batch = prompt.tokens.shape[0]
    if batch % mesh.shape[DATA]:
        raise ValueError(f"batch size {batch} is not divisible by the data axis "
                         f"({mesh.shape[DATA]}); pad the batch.")
    return Prompt(tokens=place(prompt.tokens, NamedSharding(mesh, PartitionSpec(DATA, None))),
                  lengths=place(prompt.lengths, NamedSharding(mesh, PartitionSpec(DATA))))
