"""Report formatting shared by every job and benchmark: Markdown tables, the
normal 95% interval of a mean over prompts, and a figure with its interval.

Reports print many small tables; writing each header and ``|---|`` rule by
hand let their column counts drift from their rows. Here a table is headers
plus rows of cells, and an interval is written one way per notation, so every
report reads alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

Z95 = 1.959964  # two-sided 95% quantile of the standard normal


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table's lines: the header, the rule, then one line per row.
    Cells are written with ``str``; a row must have one cell per header (a
    short or long row would shift every column after it)."""
    headers = list(headers)
    lines = [_line(headers), "|" + "---|" * len(headers)]
    for row in rows:
        cells = [str(cell) for cell in row]
        if len(cells) != len(headers):
            raise ValueError(f"a table row has {len(cells)} cells for {len(headers)} headers: "
                             f"{cells!r}.")
        lines.append(_line(cells))
    return lines


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def mean_ci(values) -> tuple[float, float]:
    """Mean and the half-width of its 95% normal interval (NaN for one value)."""
    values = np.asarray(values, np.float64)
    half = Z95 * values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return float(values.mean()), float(half)


def format_ci(value: float, interval=None, *, digits: int = 3, sign: bool = False,
              unit: str = "") -> str:
    """``value`` with its 95% interval: ``interval`` a ``(low, high)`` pair gives
    ``"v [low, high]"``, a half-width gives ``"v ± half"``; None, or a half-width
    that is not finite (one sample), gives ``"v"`` alone. ``sign``: always write
    the sign of the value and bounds (differences); ``unit`` follows the value
    (``"x"`` for ratios)."""
    spec = f"{'+' if sign else ''}.{digits}f"
    text = format(value, spec) + unit
    if interval is None:
        return text
    if isinstance(interval, (int, float)):  # a half-width: never signed
        return text if not math.isfinite(interval) else f"{text} ± {interval:.{digits}f}"
    low, high = interval
    return f"{text} [{format(low, spec)}, {format(high, spec)}]"
