"""The real files' stored blocks, for tests that check a path against a
reference on them: every kept block type of every registry GGUF file, once
per (model, type), the first 64 rows of its first tensor of that type (the
files must be in the cache: the tests that use this are ``-m slow``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

# Every block type the loader keeps; a test asserts it met them all.
KEPT_TYPES = {"q4_k", "q6_k", "q5_0", "q8_0", "q4_1"}


def first_rows_of_each_type(rows: int = 64) -> Iterator[tuple[str, str, np.ndarray]]:
    """``(model name, block type, uint8 [rows, bytes per row])`` per model and type."""
    from specdec_jax.checkpoints import gguf as gguf_io  # noqa: PLC0415
    from specdec_jax.checkpoints import registry  # noqa: PLC0415

    for name in registry.MODELS:
        path = registry.local_path(name)
        if path.suffix != ".gguf":
            continue
        seen = set()
        for tensor in gguf_io._reader(path).tensors:
            fmt = gguf_io.stored_format(tensor)
            if fmt is None or fmt in seen:
                continue
            seen.add(fmt)
            data = np.asarray(tensor.data, np.uint8)
            yield name, fmt, data[:rows].reshape(min(rows, len(data)), -1)
