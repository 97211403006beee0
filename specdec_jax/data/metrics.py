"""Quality metrics and their bootstrap confidence intervals.

Each metric is a ``tasks.Metric``: per-example items, then a corpus
aggregate. sacrebleu and rouge-score are imported when a metric first runs,
so the library imports without them (they live in the ``eval`` extra).
"""

from __future__ import annotations

import numpy as np

from specdec_jax import sandbox
from specdec_jax.data.humaneval import PASS_AT_1
from specdec_jax.data.tasks import Example, Metric

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0


def bootstrap_ci(items: list, aggregate, *, num_samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, float, float]:
    """(score, low, high): the corpus score and a percentile bootstrap interval.

    Resamples the examples with replacement ``num_samples`` times and
    re-aggregates, so corpus-level metrics (BLEU) get an honest interval too.
    """
    if not items:
        raise ValueError("cannot score an empty set of examples.")
    return _bootstrap(len(items), lambda rows: float(aggregate([items[i] for i in rows])),
                      num_samples=num_samples, seed=seed, level=level)


def paired_difference_ci(items_a: list, items_b: list, aggregate, *,
                         num_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED,
                         level: float = 0.95) -> tuple[float, float, float]:
    """(difference, low, high) of ``aggregate(a) - aggregate(b)`` for two systems
    scored on the same examples (``items_a[i]`` and ``items_b[i]`` are one
    example's items): a paired bootstrap, both resampled with the same indices,
    which is what "a is better than b" needs (two separate intervals that
    overlap can still differ)."""
    if len(items_a) != len(items_b) or not items_a:
        raise ValueError(f"a paired comparison needs the same examples on both sides; got "
                         f"{len(items_a)} and {len(items_b)} items.")

    def difference(rows):
        return (float(aggregate([items_a[i] for i in rows]))
                - float(aggregate([items_b[i] for i in rows])))
    return _bootstrap(len(items_a), difference, num_samples=num_samples, seed=seed, level=level)


def _bootstrap(n: int, statistic, *, num_samples: int, seed: int, level: float
               ) -> tuple[float, float, float]:
    """``statistic`` of all ``n`` rows and its percentile interval over resamples."""
    rng = np.random.default_rng(seed)
    draws = [statistic(rng.integers(0, n, n)) for _ in range(num_samples)]
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return statistic(np.arange(n)), float(low), float(high)


def ratio_ci(rows: list[dict], numerator: str, denominator: str, **kwargs
             ) -> tuple[float, float, float]:
    """``bootstrap_ci`` of sum(numerator) / sum(denominator) over ``rows``
    (a ratio of totals, e.g. tokens per target call, not a mean of per-row
    ratios, which would overweight short rows)."""
    def ratio(items):
        return sum(r[numerator] for r in items) / max(sum(r[denominator] for r in items), 1)
    return bootstrap_ci(rows, ratio, **kwargs)


def _mean(items: list) -> float:
    return float(np.mean(np.asarray(items, np.float64)))


def _bleu_items(outputs: list[str], examples: list[Example]) -> list:
    return [(out, ex.reference) for out, ex in zip(outputs, examples, strict=True)]


def _bleu_aggregate(items: list) -> float:
    import sacrebleu  # the eval extra

    hyps = [h for h, _ in items]
    refs = [r for _, r in items]
    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def _rouge2_items(outputs: list[str], examples: list[Example]) -> list:
    from rouge_score import rouge_scorer  # the eval extra

    scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
    return [100.0 * scorer.score(ex.reference, out)["rouge2"].fmeasure
            for out, ex in zip(outputs, examples, strict=True)]


BLEU = Metric(name="bleu", score_examples=_bleu_items, aggregate=_bleu_aggregate)
ROUGE2 = Metric(name="rouge2", score_examples=_rouge2_items, aggregate=_mean)


def execution_isolation(metric: Metric) -> str | None:
    """For a study record: how the samples ``metric`` executes are isolated on
    this machine (``sandbox.isolation_level()``, e.g. "kernel: ..." or "audit
    hook only: ..."); None for metrics that execute nothing."""
    if metric is not PASS_AT_1:
        return None
    return sandbox.isolation_level()

