"""A calibrated cost model: counted calls times measured per-call latencies.

Full sweeps on a 2-core CPU are too slow to time every point at batch 1, so a
sweep counts what each method did (``GenerationStats``: calls and tokens fed,
per model) on batched runs, and prices the counts with latencies measured on
this machine at batch 1:

    seconds(model) = single_calls * t1 + (calls - single_calls) * a
                     + (fed - single_calls) * b
    relative latency = (seconds(target) + seconds(drafter)) / seconds(AR target)

``t1`` is the median of a one-token call (on CPU it takes a cheaper
matrix-vector path, so it is priced on its own) and ``a + b K`` the
least-squares fit of a K-token call for K >= 2. A prefill is compute-bound,
unlike those memory-bound steps, so it is measured on its own (a prompt of
``context`` tokens) and priced per prompt token; a model is charged its
prefill only for examples where it ran. Each latency is a step inside a jitted loop
(DESIGN.md "Performance method"), never a single host-dispatched call.
The sweep also times a subset by wall clock and reports how well the two agree.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.drafting.base import start_token_and_prefill
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing

CALIBRATION_WIDTHS = (1, 2, 4, 6, 8, 11)
STEPS_PER_TIMING = 4


@dataclasses.dataclass(frozen=True)
class CallCost:
    single_s: float  # one-token call
    base_s: float  # a: fixed part of a K >= 2 call
    per_token_s: float  # b: per fed token of a K >= 2 call
    prefill_per_token_s: float  # a prefill, per prompt token

    def seconds(self, *, calls: float, fed: float, single: float) -> float:
        multi = calls - single
        return single * self.single_s + multi * self.base_s + (fed - single) * self.per_token_s

    def prefill(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.prefill_per_token_s


def measure_call_cost(model, params, *, context: int, widths=CALIBRATION_WIDTHS,
                      repeats: int = 3) -> tuple[CallCost, dict[int, float]]:
    """Per-call seconds of ``extend`` at batch 1 with ``context`` tokens cached;
    returns the fitted cost and the measured medians per width."""
    length = context + max(widths) * STEPS_PER_TIMING + 1
    # jitted: an eager prefill compiles every op separately (seconds, even for toys)
    cache, _ = jax.jit(lambda p, prompt: start_token_and_prefill(model, p, prompt, length))(
        params, make_prompt([[1] * context]))
    medians = {}
    for width in widths:

        def loop(params, cache, width=width):
            def body(_, cache):
                out = model.extend(params, jnp.ones((1, width), jnp.int32), cache)
                return out.cache.replace(lengths=cache.lengths)
            return jax.lax.fori_loop(0, STEPS_PER_TIMING, body, cache)

        compiled = timing.Compiled(jax.jit(loop), params, cache)
        medians[width] = compiled.time(params, cache, repeats=repeats).median_s / \
            STEPS_PER_TIMING
    prompt = make_prompt([[1] * context])

    def prefill(params, prompt):
        cache = model.init_cache(1, context + 1)
        return model.prefill(params, prompt, cache).logits

    prefill_s = timing.Compiled(jax.jit(prefill), params, prompt).time(
        params, prompt, repeats=repeats).median_s
    multi = [w for w in medians if w >= 2]
    if len(multi) >= 2:
        base, per_token = np.polyfit(multi, [medians[w] for w in multi], 1)[::-1]
    else:
        base, per_token = medians[multi[0]] if multi else medians[1], 0.0
    return CallCost(single_s=medians[1], base_s=float(max(base, 0.0)),
                    per_token_s=float(max(per_token, 0.0)),
                    prefill_per_token_s=prefill_s / context), medians


@dataclasses.dataclass(frozen=True)
class CostModel:
    target: CallCost
    drafter: CallCost

    def row_seconds(self, row: dict, *, prompt_tokens: int) -> float:
        """Seconds one example costs at batch 1, from its counters (``row`` keys:
        target_calls, target_fed, target_single, drafter_calls, drafter_fed,
        drafter_single)."""
        total = 0.0
        if row["target_calls"]:
            total += self.target.prefill(prompt_tokens) + self.target.seconds(
                calls=row["target_calls"], fed=row["target_fed"], single=row["target_single"])
        if row["drafter_calls"]:
            total += self.drafter.prefill(prompt_tokens) + self.drafter.seconds(
                calls=row["drafter_calls"], fed=row["drafter_fed"],
                single=row["drafter_single"])
        return total

    def to_json(self) -> dict:
        return {"target": dataclasses.asdict(self.target),
                "drafter": dataclasses.asdict(self.drafter)}

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        return cls(target=CallCost(**data["target"]), drafter=CallCost(**data["drafter"]))


def calibrate(*, target, target_params, drafter, drafter_params, context: int,
              widths=CALIBRATION_WIDTHS, repeats: int = 3) -> tuple[CostModel, dict]:
    """Measures both models; returns the model and the raw medians (for the report).
    Run it on a quiet machine: anything else running inflates every latency."""
    if 1 not in widths or not any(w >= 2 for w in widths):
        raise ValueError(f"calibration widths must include 1 and a width >= 2, got {widths}.")
    target_cost, target_medians = measure_call_cost(target, target_params, context=context,
                                                    widths=widths, repeats=repeats)
    drafter_cost, drafter_medians = measure_call_cost(drafter, drafter_params,
                                                      context=context, widths=widths,
                                                      repeats=repeats)
    medians = {"target": {str(k): v for k, v in target_medians.items()},
               "drafter": {str(k): v for k, v in drafter_medians.items()},
               "context": context}
    return CostModel(target=target_cost, drafter=drafter_cost), medians
