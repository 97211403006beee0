"""The one cost model: tokens per round, call costs by width, round pricing,
pricing a generation's counted calls by model, the calibrated per-round
overhead, and the one in-loop timer the costs are measured with."""

import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from specdec_jax.decode import cost
from specdec_jax.drafting.tree import TreeShape
from specdec_jax.runtime import calibration, timing
from tests.table_lm import TableLM


@pytest.mark.parametrize("alpha, gamma, expected", [
    (0.0, 5, 1.0), (1.0, 5, 6.0), (0.5, 1, 1.5), (0.5, 2, 1.75)])
def test_tokens_per_round_is_the_geometric_sum(alpha, gamma, expected):
    assert cost.tokens_per_round(alpha, gamma) == pytest.approx(expected)
    # The series itself: 1 + alpha + ... + alpha^G.
    assert cost.tokens_per_round(alpha, gamma) == pytest.approx(
        sum(alpha ** i for i in range(gamma + 1)))


def test_acceptance_inverts_tokens_per_round_and_refuses_impossible_counts():
    for alpha in (0.1, 0.42, 0.9):
        tokens = cost.tokens_per_round(alpha, 4)
        assert cost.acceptance_for_tokens_per_round(tokens, 4) == pytest.approx(alpha, abs=1e-6)
    with pytest.raises(ValueError, match=r"tokens per round must be in \[1, 5\]"):
        cost.acceptance_for_tokens_per_round(5.5, 4)
    with pytest.raises(ValueError, match="acceptance rate"):
        cost.tokens_per_round(1.5, 3)


def test_call_cost_uses_measured_widths_and_the_fit_between():
    call = cost.CallCost.from_steps({1: 0.010, 2: 0.030, 4: 0.050})
    assert call.call_s(1) == 0.010 and call.call_s(4) == 0.050
    assert call.call_s(3) == pytest.approx(0.040)  # a + b K through (2, .03), (4, .05)
    assert call.call_s(6) == pytest.approx(0.070)
    with pytest.raises(ValueError, match="one-token step"):
        cost.CallCost.from_steps({2: 0.1})
    # Stored cost models (JSON) round-trip, and ones stored before the overhead load.
    model = cost.CostModel(target=call, drafter=call, round_overhead_s=0.002)
    assert cost.CostModel.from_json(model.to_json()) == model
    old = model.to_json()
    del old["round_overhead_s"]
    assert cost.CostModel.from_json(old).round_overhead_s == 0.0


def test_a_round_is_its_calls_plus_the_overhead():
    target = cost.CallCost.from_steps({1: 0.10, 4: 0.16, 6: 0.20})
    drafter = cost.CallCost.from_steps({1: 0.02, 2: 0.03, 3: 0.035})
    model = cost.CostModel(target=target, drafter=drafter, round_overhead_s=0.01)
    round_s = model.round_seconds(gamma=3, drafter_calls=4, catch_ups=1)
    assert round_s == pytest.approx(0.16 + 3 * 0.02 + 1 * 0.03 + 0.01)
    assert model.predicted_speedup(tokens_per_round=2.5, round_s=round_s) == pytest.approx(
        2.5 * 0.10 / round_s)
    row = {"target_calls": 10, "target_fed": 40, "target_single": 0, "drafter_calls": 40,
           "drafter_fed": 40, "drafter_single": 40}
    without = cost.CostModel(target=target, drafter=drafter).price(
        cost.counters_as_stats(row))
    assert model.price(cost.counters_as_stats(row)) == pytest.approx(without + 10 * 0.01)
    autoregressive = {**row, "drafter_calls": 0, "drafter_fed": 0, "drafter_single": 0}
    assert model.price(cost.counters_as_stats(autoregressive)) == pytest.approx(
        target.seconds(calls=10, fed=40, single=0))  # no rounds, no overhead


def _stats(**fields):
    """A GenerationStats stand-in: the priced counters as per-row arrays."""
    return types.SimpleNamespace(**{k: np.asarray(v) for k, v in fields.items()})


def test_price_charges_each_model_by_name_row_by_row():
    """Two rows, two drafter models: each column is priced by its own model's
    cost, the target by its own; only the speculative row pays round overheads."""
    target = cost.CallCost.from_steps({1: 1.0, 2: 1.5, 4: 2.5}, prefill_per_token_s=0.01)
    small = cost.CallCost.from_steps({1: 0.1, 2: 0.25, 4: 0.45})  # a = 0.05, b = 0.1
    big = cost.CallCost.from_steps({1: 0.3, 2: 0.5, 4: 0.9})
    model = cost.CostModel(target=target, drafter=big, round_overhead_s=0.05,
                           models={"small": small})
    stats = _stats(target_calls=[3, 5], target_fed=[12, 5], target_single_calls=[0, 5],
                   drafter_calls_by_model=[[6, 2], [0, 0]],
                   drafter_tokens_by_model=[[8, 2], [0, 0]],
                   drafter_single_calls_by_model=[[5, 2], [0, 0]])
    got = model.price(stats, drafters=("small", "big"), prompt_tokens=10)
    # Row 0: the target's 3 calls by the fit a + b K (a = 0.5, b = 0.5 through (2, 1.5),
    # (4, 2.5)) on 12 fed tokens, plus its prefill of 10 tokens; small: 5 one-token
    # calls and one call of 3 tokens; big (not in ``models``: the default drafter):
    # 2 one-token calls; 3 rounds of overhead.
    target_s, small_s, big_s = 3 * 0.5 + 12 * 0.5 + 0.1, 5 * 0.1 + 0.05 + 3 * 0.1, 2 * 0.3
    row0 = target_s + small_s + big_s + 3 * 0.05
    row1 = 5 * 1.0 + 0.1  # autoregressive: no drafter, no overhead
    np.testing.assert_allclose(got, [row0, row1])
    items = model.itemise(stats, drafters=("small", "big"), prompt_tokens=10)
    np.testing.assert_allclose(items["small"], [small_s, 0.0])
    np.testing.assert_allclose(items["target"], [target_s, row1])
    np.testing.assert_allclose(items[cost.ROUND_OVERHEAD], [0.15, 0.0])
    # One stored row (a mapping of the same fields) prices like its GenerationStats row.
    row = {name: np.asarray(getattr(stats, name))[0].tolist() for name in cost.PRICED_FIELDS}
    assert model.price(row, drafters=("small", "big"), prompt_tokens=10) == pytest.approx(row0)
    # Columns past the named drafters are not priced.
    assert model.price(row, drafters=("small",), prompt_tokens=10) == pytest.approx(
        row0 - big_s)


def test_price_at_a_fixed_width_and_explicit_rounds():
    """A model in ``widths`` pays its calls at that width's measured median (not
    the fit, not the fed tokens); ``rounds`` overrides which calls pay overhead."""
    target = cost.CallCost.from_steps({1: 1.0, 2: 1.5, 4: 3.0, 6: 3.5})
    model = cost.CostModel(target=target, drafter=cost.CallCost.from_steps({1: 0.1}),
                           round_overhead_s=0.2)
    row = {"target_calls": 4, "target_fed": 16, "target_single_calls": 0,
           "drafter_calls_by_model": [0], "drafter_tokens_by_model": [0],
           "drafter_single_calls_by_model": [0]}
    assert target.seconds(calls=4, fed=16, single=0) != pytest.approx(4 * 3.0)  # fit differs
    assert model.price(row, widths={"target": 4}) == pytest.approx(4 * 3.0)
    # No drafter calls (a Max-Gram drafter, say): rounds only when asked for.
    assert model.price(row, widths={"target": 4}, rounds=4) == pytest.approx(4 * 3.0 + 0.8)


def test_in_loop_times_one_step_after_a_warm_up():
    """Each timed run is ``steps`` calls of the body inside one jitted loop,
    after an untimed warm-up: a body that sleeps 10 ms a call reads ~10 ms a
    step, and runs (1 warm-up + repeats) x steps times."""
    calls = []

    def sleep(x):
        calls.append(1)
        time.sleep(0.01)
        return x

    def body(params, carry):
        return io_callback(sleep, jax.ShapeDtypeStruct((), jnp.float32), carry + params)

    timed = timing.in_loop(body, jnp.float32(1.0), jnp.float32(0.0), steps=4, repeats=3)
    assert len(calls) == (1 + 3) * 4
    assert len(timed.run_s) == 3
    assert 0.01 <= timed.median_s < 0.03  # per step, not per loop (0.04)
    assert float(timed.output) == 4.0  # the carry went through every step


def test_in_loop_step_returns_seconds_per_step_of_a_model():
    model = TableLM(vocab_size=16, order=1)
    params = model.init_params(jax.random.PRNGKey(0))
    one = timing.in_loop_step(model, params, 2, fill=4, steps=2, repeats=1)
    assert len(one.run_s) == 1 and one.median_s > 0 and one.compile_s > 0


def test_steps_timed_in_turn_run_each_call_once_per_repeat(monkeypatch):
    """``in_loop_steps_in_turn`` compiles and warms every call first, then
    times them in turn (one run of each per repeat); each call's figure is its
    own step's, per step; a CallTimer times only what it has not."""
    model = TableLM(vocab_size=16, order=1)
    params = model.init_params(jax.random.PRNGKey(0))
    order = []
    original = timing.Compiled.time

    def record(self, *args, repeats=1):
        order.append(self)
        return original(self, *args, repeats=repeats)

    monkeypatch.setattr(timing.Compiled, "time", record)
    timed = timing.in_loop_steps_in_turn([(model, params, 1, None), (model, params, 3, None)],
                                         fill=4, steps=2, repeats=3)
    assert [len(t.run_s) for t in timed] == [3, 3]
    assert len(set(order)) == 2 and order[0::2] == [order[0]] * 3  # A B A B A B
    assert order[1::2] == [order[1]] * 3 and order[0] is not order[1]
    assert all(t.median_s > 0 and t.compile_s > 0 for t in timed)
    assert np.asarray(timed[1].output[0]).shape == (1, 3)  # the 3-token call's tokens

    timer = calibration.CallTimer()
    order.clear()
    first = timer.steps_in_turn([("target", model, params, 1), ("target", model, params, 3)])
    again = timer.steps_in_turn([("target", model, params, 3), ("drafter", model, params, 1)])
    assert again[0] == first[1] and len(timer.seconds) == 3
    assert len(order) == 2 * calibration.RUN_TIMING_REPEATS + calibration.RUN_TIMING_REPEATS


def test_round_overhead_is_measured_from_a_timed_generation():
    model = TableLM(vocab_size=16, order=1)
    params = model.init_params(jax.random.PRNGKey(0))
    costs, measured = calibration.calibrate(target=model, target_params=params, drafter=model,
                                     drafter_params=params, context=8, widths=(1, 2, 5),
                                     repeats=1, overhead_gamma=4)
    overhead = measured["round_overhead"]
    assert overhead["gamma"] == 4 and overhead["rounds"] >= 1
    assert overhead["raw_s"] == pytest.approx(
        (overhead["measured_s"] - overhead["priced_s"]) / overhead["rounds"])
    assert costs.round_overhead_s == max(overhead["raw_s"], 0.0)
    uncalibrated, measured = calibration.calibrate(
        target=model, target_params=params, drafter=model, drafter_params=params, context=8,
        widths=(1, 2), repeats=1, overhead_gamma=None)
    assert uncalibrated.round_overhead_s == 0.0 and "round_overhead" not in measured


def test_best_gamma_follows_the_costs_and_the_acceptance():
    # A scoring call about as cheap as a step and a cheap drafter: long drafts pay
    # when drafts are usually accepted, short ones when they are not.
    flat = {1: 0.200, 9: 0.240}
    gamma, table = cost.best_gamma(target_steps=flat, drafter_step_s=0.030, alpha=0.9)
    assert gamma >= 5 and table[gamma]["predicted_speedup"] == max(
        row["predicted_speedup"] for row in table.values())
    low, _ = cost.best_gamma(target_steps=flat, drafter_step_s=0.030, alpha=0.4)
    assert low < gamma
    # Widths between measured ones lie on the line through them: G = 3 scores 4.
    row = table[3]
    expected_round = 0.200 + 3 / 8 * 0.040 + (3 + 0.9 ** 3) * 0.030
    np.testing.assert_allclose(row["round_s"], expected_round)
    np.testing.assert_allclose(row["predicted_speedup"],
                               cost.tokens_per_round(0.9, 3) * 0.200 / expected_round)
    # A scoring call that costs 2.6 steps (XLA's dot on CPU) makes it not pay at all.
    _, costly = cost.best_gamma(target_steps={1: 0.2, 9: 0.6}, drafter_step_s=0.07, alpha=0.88)
    assert max(r["predicted_speedup"] for r in costly.values()) < 1.2
    with pytest.raises(ValueError, match="1-token step"):
        cost.best_gamma(target_steps={2: 0.1, 9: 0.2}, drafter_step_s=0.01, alpha=0.5)


# --- token trees -----------------------------------------------------------------------------

WIDTHS_2_1 = (-1, -1, 0, 1)  # TreeShape.from_widths((2, 1)).parents


def test_tree_tokens_per_round_is_the_positional_model_and_a_chain_is_the_chain():
    """The worked example by hand; a chain gives ``tokens_per_round``; every
    extra sibling adds its share; the ends of the acceptance range."""
    assert cost.tree_tokens_per_round(WIDTHS_2_1, 0.5) == pytest.approx(
        1 + 0.5 + 0.25 + 0.5 * 0.5 + 0.25 * 0.5)
    np.testing.assert_array_equal(cost.sibling_ranks((-1, -1, -1, 0, 0, 2)),
                                  [0, 1, 2, 0, 1, 0])
    chain = (-1, 0, 1, 2, 3)
    for alpha in (0.0, 0.3, 0.9, 1.0):
        assert cost.tree_tokens_per_round(chain, alpha) == pytest.approx(
            cost.tokens_per_round(alpha, 5))
    assert cost.tree_tokens_per_round(WIDTHS_2_1, 1.0) == 3.0  # first children only
    assert cost.tree_tokens_per_round((-1, 0), 0.6) < cost.tree_tokens_per_round(WIDTHS_2_1, 0.6)
    with pytest.raises(ValueError, match="acceptance rate"):
        cost.tree_tokens_per_round(chain, 1.2)


def _simulated_tokens(parents, alpha, rounds, rng):
    """Mean tokens per round of a walk down the tree: at each node its children
    are tried in rank order, each matching with probability ``alpha``; the
    walk takes the first that matches and stops where none does."""
    children = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    total = 0
    for _ in range(rounds):
        node, depth = -1, 0
        while children.get(node):
            taken = next((k for k in children[node] if rng.random() < alpha), None)
            if taken is None:
                break
            node, depth = taken, depth + 1
        total += depth + 1
    return total / rounds


def _reach_at_the_chain_rate(parents, alpha):
    """Known wrong: every node reached with ``alpha`` per depth, whatever its
    rank (each sibling priced as if it were the only child)."""
    depths = TreeShape(tuple(parents)).depths
    return 1.0 + sum(alpha ** d for d in depths)


def test_tree_tokens_per_round_matches_a_simulated_walk():
    """Statistical (fixed seed, 20,000 rounds, within 5 standard errors): the
    formula is the mean of the walk it models. The known-wrong formula
    (``_reach_at_the_chain_rate``) fails against the same walk, by far."""
    rng = np.random.default_rng(0)
    parents = (-1, -1, 0, 0, 1, 2, 4)
    rounds = 20_000
    stderr = 2.0 / np.sqrt(rounds)  # tokens per round lie in [1, depth + 1 = 5]
    for alpha in (0.4, 0.8):
        simulated = _simulated_tokens(parents, alpha, rounds, rng)
        assert abs(simulated - cost.tree_tokens_per_round(parents, alpha)) < 5 * stderr
        assert abs(simulated - _reach_at_the_chain_rate(parents, alpha)) > 20 * stderr


def test_expected_dynamic_tree_grows_the_most_reached_nodes():
    """EAGLE-2's expansion under the model: the widths per depth are the
    drafter's; the most reached nodes grow; expanding every node of a depth
    is the full static tree."""
    assert cost.expected_dynamic_tree(3, 1, 2, 0.7) == (-1, -1, 0, 0, 2, 2)
    parents = cost.expected_dynamic_tree(5, 2, 3, 0.9)
    shape = TreeShape(parents)
    assert [stop - start for start, stop in shape.levels] == [3, 6, 6, 6, 6]
    assert cost.expected_dynamic_tree(2, 2, 2, 0.5) == TreeShape.from_widths((2, 2)).parents
    # Depth 2 reached 0.16, 0.096, 0.096, 0.0576: node 0's second child ties
    # node 1's first, and the tie goes to the lower index (as lax.top_k).
    assert cost.expected_dynamic_tree(3, 2, 2, 0.4)[-4:] == (2, 2, 3, 3)


def _best_tree_by_search(alpha, num_nodes, max_depth):
    """Every tree of ``num_nodes`` nodes at most ``max_depth`` deep, grown a
    node at a time onto any node (a node's rank: its elder siblings), and
    the most tokens per round of any."""
    best = 0.0

    def grow(nodes):  # nodes: (parent, depth, reach)
        nonlocal best
        if len(nodes) == num_nodes:
            best = max(best, 1.0 + sum(n[2] for n in nodes))
            return
        for parent in range(-1, len(nodes)):
            depth = 0 if parent < 0 else nodes[parent][1]
            if depth < max_depth:
                rank = sum(n[0] == parent for n in nodes)
                reach = (1.0 if parent < 0 else nodes[parent][2]) * alpha * (1 - alpha) ** rank
                grow(nodes + [(parent, depth + 1, reach)])

    grow([])
    return best


def test_greedy_tree_earns_the_most_of_any_tree_of_its_size():
    """The worked example by hand; against a search over every tree of up to 5
    nodes (depth caps 2 and 5, three acceptance rates) the greedy tree earns
    the most; at a high rate it is a chain until the depth cap; its order is
    TreeShape's. A known-wrong tree of the same size (all nodes under the
    root, widths (N,)) earns less."""
    assert cost.greedy_tree(0.5, 4, 2) == (-1, -1, -1, 0)
    for alpha in (0.3, 0.6, 0.9):
        for max_depth in (2, 5):
            for n in range(1, 6):
                parents = cost.greedy_tree(alpha, n, max_depth)
                assert TreeShape(parents).parents == parents  # depth by depth, contiguous
                assert max(TreeShape(parents).depths) <= max_depth  # depths from 1
                assert cost.tree_tokens_per_round(parents, alpha) == pytest.approx(
                    _best_tree_by_search(alpha, n, max_depth))
    flat = (-1,) * 5
    assert cost.tree_tokens_per_round(flat, 0.6) < cost.tree_tokens_per_round(
        cost.greedy_tree(0.6, 5, 5), 0.6) - 0.2
    assert cost.greedy_tree(0.9, 8, 8) == (-1, 0, 1, 2, 3, 4, 5, 6)
    assert cost.greedy_tree(0.9, 9, 8) == (-1, -1, 0, 2, 3, 4, 5, 6, 7)
    with pytest.raises(ValueError, match="at least one node"):
        cost.greedy_tree(0.5, 0, 3)


def test_calls_by_width_lie_on_the_line_through_the_timed_ones():
    steps = {1: 0.10, 5: 0.14, 9: 0.30}
    assert cost.call_on_line(steps, 5) == 0.14
    assert cost.call_on_line(steps, 3) == pytest.approx(0.12)
    assert cost.call_on_line(steps, 7) == pytest.approx(0.22)
    assert cost.call_on_line(steps, 13) == pytest.approx(0.46)  # past the widest: its slope
    with pytest.raises(ValueError, match="1-token step"):
        cost.call_on_line({9: 0.3}, 4)


def test_best_tree_prices_greedy_trees_on_a_chains_calls():
    """At a high acceptance and calls that grow fast with width every winning
    shape is a chain: nothing to price below 9 nodes, and no tree beats the
    chain. Where wide calls cost little and drafts are often rejected a tree
    wins, priced by hand: the target over N + 1 tokens on the line, the
    drafter's root step, a call per depth but the deepest (its step times the
    target's growth), the catch-up after a whole path."""
    steep = {1: 0.054, 9: 0.155}
    count, table = cost.best_tree(target_steps=steep, drafter_step_s=0.015, alpha=0.9,
                                  node_counts=range(2, 9), max_depth=8)
    assert (count, table) == (None, {})
    count, table = cost.best_tree(target_steps=steep, drafter_step_s=0.015, alpha=0.9,
                                  node_counts=range(2, 17), max_depth=8)
    _, chains = cost.best_gamma(target_steps=steep, drafter_step_s=0.015, alpha=0.9)
    assert min(table) == 9
    assert table[count]["predicted_speedup"] < max(r["predicted_speedup"] for r in chains.values())
    flat = {1: 0.100, 9: 0.116}
    count, table = cost.best_tree(target_steps=flat, drafter_step_s=0.010, alpha=0.6,
                                  node_counts=range(2, 17), max_depth=8)
    _, chains = cost.best_gamma(target_steps=flat, drafter_step_s=0.010, alpha=0.6)
    assert table[count]["predicted_speedup"] > max(r["predicted_speedup"] for r in chains.values())
    row = table[4]
    assert row["parents"] == cost.greedy_tree(0.6, 4, 8) == (-1, -1, 0, 2)
    assert row["level_widths"] == [2, 1, 1]

    def grows(width):
        return (0.100 + (width - 1) * 0.002) / 0.100

    full_path = 0.6 ** 3  # the depth-3 node
    expected = (0.100 + 4 * 0.002 + (1 - full_path) * 0.010 + full_path * 0.010 * grows(4)
                + 0.010 * grows(2) + 0.010 * grows(1))
    assert row["round_s"] == pytest.approx(expected)
    assert row["predicted_speedup"] == pytest.approx(
        cost.tree_tokens_per_round(row["parents"], 0.6) * 0.100 / expected)


def test_a_tree_round_is_its_calls():
    round_s = cost.tree_round_seconds(target_call_s=0.2, drafter_root_s=0.02,
                                      drafter_level_s=(0.03, 0.04), catch_up_s=0.05,
                                      catch_ups=0.25)
    assert round_s == pytest.approx(0.2 + 0.75 * 0.02 + 0.25 * 0.05 + 0.07)
    # Max-Gram: the target's call alone.
    assert cost.tree_round_seconds(target_call_s=0.2) == 0.2


def test_in_loop_tree_call_times_score_tree_at_the_width_fed(monkeypatch):
    """The timed body calls ``score_tree`` with the nodes asked for (the
    level's width, its start, the whole tree's parents)."""
    model = TableLM(vocab_size=16, order=1)
    params = model.init_params(jax.random.PRNGKey(0))
    seen = []
    real = model.score_tree

    class Spy(TableLM):
        def score_tree(self, params, tokens, parents, cache, start=0):
            seen.append((tokens.shape, parents.shape, start, cache.max_length))
            return real(params, tokens, parents, cache, start=start)

    spy = Spy(vocab_size=16, order=1)
    timed = calibration.in_loop_tree_call(spy, params, (-1, -1, 0, 0, 1, 1), start=2, width=4,
                                   fill=8, steps=2, repeats=1)
    assert timed.median_s > 0
    # The cache holds the fill and the tree's scratch slots.
    assert seen and all(s == ((1, 4), (1, 6), 2, 8 + 6) for s in seen)
