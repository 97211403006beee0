"""Shared machinery for distribution tests on enumerable toy models.

A test draws ``ROWS`` independent continuations of ``LENGTH`` tokens from one
prompt in a single batched generation and compares the histogram of the
sequences with the exact distribution by a chi-square test.

Sample size: 40 000 rows over V ** LENGTH = 64 cells. A correct
implementation passes with probability 1 - ``P_MIN`` = 0.999; the known-wrong
variants in the tests give p-values below 1e-12 at this size (recorded in each
test's docstring), so the test separates them with a wide margin.
"""

from __future__ import annotations

import functools
import itertools

import jax
import numpy as np
from scipy import stats

from tests.table_lm import TableLM

V = 4
LENGTH = 3
ROWS = 40_000
P_MIN = 1e-3
PROMPT = (1, 2)

TARGET = TableLM(V, order=2)
DRAFTER = TableLM(V, order=1)  # a different (weaker) model on the same vocabulary
TARGET_PARAMS = TARGET.init_params(jax.random.PRNGKey(11))
DRAFTER_PARAMS = DRAFTER.init_params(jax.random.PRNGKey(12))


def exact_sequence_probs(next_dist) -> dict[tuple[int, ...], float]:
    """P(x_1 .. x_LENGTH) = prod_i next_dist(PROMPT + x_<i)(x_i), by enumeration
    (``next_dist`` called once per context: 21 contexts, not 192 calls)."""
    law = functools.lru_cache(maxsize=None)(next_dist)
    probs = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        prob = 1.0
        for i, token in enumerate(seq):
            prob *= law(PROMPT + seq[:i])[token]
        probs[seq] = prob
    return probs


def chi_square_pvalue(tokens_BxN: np.ndarray, expected: dict[tuple[int, ...], float]) -> float:
    """p-value of the sampled sequences against the exact distribution."""
    cells = sorted(expected)
    index = {seq: i for i, seq in enumerate(cells)}
    counts = np.zeros(len(cells))
    for row in np.asarray(tokens_BxN)[:, :LENGTH]:
        counts[index[tuple(int(t) for t in row)]] += 1
    want = np.array([expected[c] for c in cells])
    assert abs(want.sum() - 1.0) < 1e-5, "expected distribution must be normalised"
    want = want / want.sum() * len(tokens_BxN)  # float32 targets sum to 1 +- 1e-7
    return float(stats.chisquare(counts, want).pvalue)
