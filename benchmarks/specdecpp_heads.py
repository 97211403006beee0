"""Acceptance heads scored on each data build's held-out shards: how a head
trained on corpus responses differs from one trained on the target's own
responses (SpecDec++ builds from the target; the corpus is the cheaper option).

    python -m benchmarks.main --gin_file=benchmarks/configs/specdecpp_heads.gin \\
        --gin.DATA="['/runs/data-corpus', '/runs/data-target']" \\
        --gin.HEADS="['/runs/head-corpus-d3-w1/head', '/runs/head-target-d3-w1/head']"

Both builds use the same prompts in the same shards, so the last
``held_out_shards`` shards are prompts no head saw in training
(``training.acceptance_training.evaluate_head`` refuses a head that trained on any).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

from specdec_jax.checkpoints.acceptance_head_io import META_FILE
from specdec_jax.jobs import tables
from specdec_jax.runtime import timing
from specdec_jax.training.acceptance_data import MANIFEST
from specdec_jax.training.acceptance_training import evaluate_head


def markdown_table(rows: list[dict]) -> str:
    return "\n".join(tables.markdown_table(
        ("head", "D", "w_rej", "scored on", "binary KL", "best constant", "mean prediction",
         "mean label"),
        [(r["head"], r["depth"], f"{r['w_rej']:g}", r["data_source"], f"{r['binary_kl']:.4f}",
          f"{r['constant_binary_kl']:.4f}", f"{r['mean_prediction']:.3f}",
          f"{r['mean_label']:.3f}") for r in rows]))


def run_bench_specdecpp_heads(*, data: Sequence[str], heads: Sequence[str],
                              held_out_shards: int = 3,
                              out: str | None = "results/bench_specdecpp_heads.json",
                              markdown_path: str | None = "results/bench_specdecpp_heads.md"
                              ) -> list[dict]:
    """Every head of ``heads`` (head directories) on the last
    ``held_out_shards`` shards of every build of ``data`` (data build
    directories): one row each (binary KL, the best constant's, calibration).
    Writes the rows as JSON (``out``) and the table as Markdown
    (``markdown_path``); returns them."""
    for name, values in (("data", data), ("heads", heads)):
        if isinstance(values, str) or not values:
            raise ValueError(f"{name} must be a non-empty list of directories, got {values!r}.")
    if held_out_shards < 1:
        raise ValueError(f"held_out_shards must be >= 1, got {held_out_shards}.")
    for directories, what, marker, fix in (
            (data, "data directory", MANIFEST, "build it with configs/runs/specdecpp_data.gin"),
            (heads, "head directory", META_FILE,
             "train one with configs/runs/specdecpp_train.gin")):
        for directory in directories:
            if not pathlib.Path(directory, marker).exists():
                raise FileNotFoundError(f"{what} {directory!r} holds no acceptance "
                                        f"{'data' if marker == MANIFEST else 'head'} "
                                        f"({marker} missing); {fix}.")
    rows = [evaluate_head(head, directory, held_out_shards)
            for directory in data for head in heads]
    if markdown_path:
        pathlib.Path(markdown_path).parent.mkdir(parents=True, exist_ok=True)
    timing.print_markdown(markdown_table(rows), markdown_path)
    if out:
        path = pathlib.Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1))
    return rows
