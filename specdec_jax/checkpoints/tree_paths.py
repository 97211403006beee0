"""Nested-dict parameter trees addressed by key paths, and shape checks.

Shared by the checkpoint converters, which rename tensors between another
library's flat names and our nested trees.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from specdec_jax.models.layers import HEAD_VOCAB, IN_OUT, OUT_IN, is_kernel

# Values of each leaf the fingerprint reads (from both ends): it tells weights apart
# cheaply (a 0.5B model is hashed in milliseconds); it is not a tamper check.
FINGERPRINT_VALUES = 4096


@dataclasses.dataclass(frozen=True)
class Deferred:
    """A parameter subtree made on demand: its shapes now (a tree of
    ``jax.ShapeDtypeStruct``), its arrays when ``make()`` is called. A
    converter writing a tree entry by entry holds one entry at a time."""

    shapes: Any
    make: Callable[[], Any]

    def cast(self, dtype) -> Deferred:
        """The same subtree with every leaf cast to ``dtype`` when made (no
        copy of a leaf already in ``dtype``)."""
        dtype = np.dtype(dtype)
        return Deferred(
            jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), self.shapes),
            lambda: jax.tree_util.tree_map(
                lambda x: np.asarray(x).astype(dtype, copy=False), self.make()))


def made(entry: Any) -> Any:
    """``entry`` itself, or the arrays of a ``Deferred`` one."""
    return entry.make() if isinstance(entry, Deferred) else entry


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def get_path(tree: Mapping, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def check_shapes(params: Mapping[str, Any], init_params: Callable) -> None:
    """Fails with the tensor's name when ``params`` does not match the model:
    a tensor missing, of another shape, or one the model does not use.

    Expected shapes come from tracing ``init_params`` abstractly (no compute),
    so they cannot drift from the model definition.
    """
    check_shapes_against(params, jax.eval_shape(init_params, jax.random.key(0)))


def check_shapes_against(params: Mapping[str, Any], expected: Any) -> None:
    """``check_shapes`` with the expected shapes given (a tree of
    ``jax.ShapeDtypeStruct``, e.g. one entry of the model's)."""
    expected_names = set()
    for path, spec in jax.tree_util.tree_flatten_with_path(expected)[0]:
        keys = tuple(k.key for k in path)
        expected_names.add("/".join(keys))
        try:
            got = tuple(np.shape(get_path(params, keys)))
        except KeyError:
            raise ValueError(f"tensor {'/'.join(keys)} is missing; the checkpoint does not "
                             "match its config (corrupt file or wrong config).") from None
        if got != tuple(spec.shape):
            raise ValueError(
                f"tensor {'/'.join(keys)} has shape {got}, config expects {tuple(spec.shape)}; "
                "the checkpoint does not match its config (corrupt file or wrong config).")
    names = {"/".join(k.key for k in path)
             for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    unexpected = sorted(names - expected_names)
    if unexpected:
        raise ValueError(f"the checkpoint has tensors the model does not use: {unexpected[:5]}; "
                         "it is another architecture or the config is wrong.")


class _Part:
    """A separate projection inside a fused kernel, as a numpy view (no copy):
    ``values`` iterate in the separate kernel's order, ``shape`` is its shape."""

    def __init__(self, values: np.ndarray, shape: tuple[int, ...]):
        self.values, self.shape = values, shape


def _separate_projections(params: Any) -> Any:
    """``params`` with each fused ``qkv`` / ``wi`` entry (``decoder_only.
    with_kernel_layout``: [H_kv, G + 2, D_head, D] and [2, I, D]) replaced by the
    separate q/k/v and gate/up entries it holds, as ``_Part`` views."""
    if not isinstance(params, Mapping) or not any(
            isinstance(layer, Mapping) and "qkv" in layer.get("attention", {})
            for layer in params.values()):
        return params
    out = dict(params)
    for name, layer in params.items():
        if not (isinstance(layer, Mapping) and "qkv" in layer.get("attention", {})):
            continue
        attention, mlp = dict(layer["attention"]), dict(layer["mlp"])
        qkv = {field: np.asarray(leaf) for field, leaf in attention.pop("qkv").items()}
        groups = qkv["kernel"].shape[1] - 2
        for part, index in (("query", slice(0, groups)), ("key", slice(groups, groups + 1)),
                            ("value", slice(groups + 1, groups + 2))):
            attention[part] = {}
            for field, leaf in qkv.items():
                view = leaf[:, index]  # [H_kv, n, D_head, *tail]: C order = the separate kernel's
                attention[part][field] = _Part(view, (int(np.prod(view.shape[:3])),
                                                      *view.shape[3:]))
        wi = np.asarray(mlp.pop("wi")["kernel"])
        mlp["wi_0"], mlp["wi_1"] = ({"kernel": _Part(wi[i], wi[i].shape)} for i in (0, 1))
        out[name] = {**layer, "attention": attention, "mlp": mlp}
    return out


def params_fingerprint(params: Any, kernel_layout: str = IN_OUT) -> str:
    """sha256 over every leaf's path, shape, dtype and its first and last
    ``FINGERPRINT_VALUES`` values: equal for the same weights, different for
    another checkpoint or architecture (what a SpecDec++ head or a stored
    sweep records of the weights it was made with).

    Parameters in the decode layout (``kernel_layout="out_in"``, every
    ``kernel`` stored transposed) are fingerprinted as their documented
    ``[in, out]`` form, so the fingerprint names the weights, not the layout.
    A restricted output head (``decoder_only.with_head_vocab``: rows copied from
    the head) is skipped for the same reason, and fused projections
    (``decoder_only.with_kernel_layout``) are hashed as the separate kernels they
    hold."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(_separate_projections(params))[0]:
        if getattr(path[0], "key", None) == HEAD_VOCAB:
            continue
        if isinstance(leaf, _Part):
            array, shape = leaf.values, leaf.shape
        else:
            array = np.asarray(leaf)
            shape = array.shape
        if kernel_layout == OUT_IN and is_kernel(path):
            # a view ([out, in] -> [in, out]): only the values hashed below are read
            array, shape = np.moveaxis(array, -1, 0), shape[::-1]
        size = array.size
        digest.update(f"{jax.tree_util.keystr(path)}|{shape}|{array.dtype}|".encode())
        digest.update(np.ascontiguousarray(array.flat[:FINGERPRINT_VALUES]).tobytes())
        digest.update(np.ascontiguousarray(
            array.flat[max(size - FINGERPRINT_VALUES, 0):]).tobytes())
    return digest.hexdigest()
