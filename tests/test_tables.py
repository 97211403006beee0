"""Report formatting (jobs/tables.py): Markdown tables and figures with their
95% intervals, as every job's report writes them."""

import math

import numpy as np
import pytest

from specdec_jax.jobs import tables


def test_markdown_table_writes_header_rule_and_rows():
    lines = tables.markdown_table(("a", "b"), [(1, "x"), [2.5, True]])
    assert lines == ["| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | True |"]
    assert tables.markdown_table(["only"], []) == ["| only |", "|---|"]


def test_markdown_table_refuses_rows_that_would_shift_columns():
    with pytest.raises(ValueError, match="2 cells for 3 headers"):
        tables.markdown_table(("a", "b", "c"), [(1, 2)])


def test_mean_ci_is_the_normal_interval_of_the_mean():
    mean, half = tables.mean_ci([1.0, 2.0, 3.0, 6.0])
    assert mean == 3.0
    assert half == pytest.approx(1.959964 * np.std([1, 2, 3, 6], ddof=1) / 2)
    mean, half = tables.mean_ci([4.0])
    assert mean == 4.0 and math.isnan(half)


@pytest.mark.parametrize("args, kwargs, expected", [
    ((0.12345, (0.1, 0.15)), {}, "0.123 [0.100, 0.150]"),
    ((2.5, [2.0, 3.0]), {"digits": 2}, "2.50 [2.00, 3.00]"),
    ((1.5, 0.25), {"digits": 2}, "1.50 ± 0.25"),
    ((1.5, float("nan")), {"digits": 2}, "1.50"),  # one sample: no interval
    ((0.5,), {}, "0.500"),
    ((0.5, None), {}, "0.500"),
    ((1.2, (-0.3, 2.0)), {"digits": 2, "sign": True}, "+1.20 [-0.30, +2.00]"),
    ((1.2, 0.3), {"digits": 1, "sign": True}, "+1.2 ± 0.3"),  # a half-width: unsigned
    ((1.234, 0.1), {"digits": 2, "unit": "x"}, "1.23x ± 0.10"),
])
def test_format_ci_writes_each_notation(args, kwargs, expected):
    assert tables.format_ci(*args, **kwargs) == expected
