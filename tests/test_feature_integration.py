"""The feature head (drafting/feature.py) composed with the rest of drafting:
the ``feature:<dir>`` spelling, CS Drafting (a segment of a horizontal
cascade, a level reviewed by a model, a reviewer of Max-Gram), SpecDec++'s
adaptive stopping on the head's predicted features, and the command line.

Greedy: token for token the target's autoregressive output (a tiny decoder
target, ragged prompts). T = 1: chi-square on the enumerable ``TableLM``
target of tests/exactness.py, whose hidden state is the one-hot of its
context index (D = V ** order); a head over it brings its own ``embedding``
and output ``rows`` (the table has neither).
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import target_functions
from specdec_jax.api import sampling_params
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.drafting import (
    AdaptiveFeatureDrafter,
    FeatureDrafter,
    FeatureHead,
    FeatureHeadConfig,
    FeatureVerticalCascade,
    HorizontalCascade,
    MaxGramDrafter,
    ModelDrafter,
    VerticalCascade,
    cs_drafter,
    make_drafter,
    needs_features,
)
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
from specdec_jax.models import feature_head
from specdec_jax.models.interface import make_prompt
from specdec_jax.verify.block import BlockVerifier
from specdec_jax.verify.token import TokenVerifier
from tests.exactness import (
    DRAFTER,
    DRAFTER_PARAMS,
    LENGTH,
    P_MIN,
    PROMPT,
    ROWS,
    TARGET,
    TARGET_PARAMS,
    V,
    chi_square_pvalue,
    exact_sequence_probs,
)
from tests.table_lm import TableLM

# ---------------------------------------------------------------------------
# Greedy: every composition is the target's output, token for token
# ---------------------------------------------------------------------------

# A table target of order 1 (its hidden state: the one-hot of the last token)
# and a head that predicts that feature exactly (fc passes the token's one-hot
# embedding through; the layer's attention and MLP outputs are zero) and scores
# it with the target's logits plus noise: blocks are accepted whole, in part,
# or not at all. The "small" model is the target's table plus noise too.
GV = 16
G_TARGET = TableLM(GV, order=1)
G_TARGET_PARAMS = G_TARGET.init_params(jax.random.PRNGKey(0), scale=3.0)
G_SMALL = TableLM(GV, order=1)
G_HEAD = FeatureHead(FeatureHeadConfig(vocab_size=GV, feature_size=GV, embed_size=GV,
                                       num_heads=2, num_kv_heads=1, intermediate_size=32))
G_ITEM = "feature:/heads/toy"  # a spec item; make_drafter only reads its name here
G_ACCEPTANCE = AcceptanceHead(HeadConfig(hidden_size=GV, depth=1))


def noisy(table, noise: float, seed: int):
    return table + noise * jax.random.normal(jax.random.PRNGKey(seed), table.shape)


def noisy_exact_head(noise: float = 1.5, seed: int = 11) -> dict:
    net = G_HEAD.init_net(jax.random.PRNGKey(seed))
    net = {**net, "fc": {"bias": jnp.zeros(GV),
                         "kernel": jnp.concatenate([jnp.eye(GV), jnp.zeros((GV, GV))])},
           "attention": {**net["attention"], "out": {"kernel": jnp.zeros((GV, GV))}},
           "mlp": {**net["mlp"], "wo": {"kernel": jnp.zeros((32, GV))}}}
    rows = noisy(G_TARGET_PARAMS["table"].T, noise, seed + 1)
    return {"net": net, "embedding": jnp.eye(GV), "head": {"rows": rows}}


G_NAMED = {G_ITEM: noisy_exact_head(),
           "small": {"table": noisy(G_TARGET_PARAMS["table"], 1.5, 13)},
           "mag": jax.random.randint(jax.random.PRNGKey(3), (GV,), 0, GV),
           f"{G_ITEM}/acceptance_head": G_ACCEPTANCE.init_params(jax.random.PRNGKey(4),
                                                                 prior_acceptance=0.8)}
G_PROMPTS = [[1, 2, 3, 1, 2], [4], [5, 6, 7, 8, 9, 5, 6]]
NEW_TOKENS = 24


def g_drafter(spec: str, k_matrix=None, target=G_TARGET, head=G_HEAD):
    return make_drafter(spec, models={"small": G_SMALL}, vocab_size=GV, k_matrix=k_matrix,
                        feature_heads={G_ITEM: head}, target=target)


@functools.lru_cache
def greedy_reference(target=G_TARGET) -> np.ndarray:
    params = G_TARGET_PARAMS if target is G_TARGET else D_TARGET_PARAMS
    return np.asarray(sj.generate(target=target, target_params=params, prompts=G_PROMPTS,
                                  method="autoregressive", max_new_tokens=NEW_TOKENS).tokens)


# (id, spec, K-matrix, check(calls c, rounds r) of the head's calls in a row).
# Besides, a prompt wider than the head's window (G + 1) is first fed in one
# chunk: one call more in that row.
COMPOSITIONS = [
    ("alone", G_ITEM, None, lambda c, r: c == 3 * r),  # a window, then 2 steps (G = 3)
    # A window (the positions the last round revealed), then 2 steps; Max-Gram: none.
    ("horizontal", f"{G_ITEM}+mag", [[3, 4], [0, 0]], lambda c, r: c == 3 * r),
    # At least one inner round a round: a window and 2 steps.
    ("under-a-model", f"small+{G_ITEM}", [[4, 0], [0, 3]], lambda c, r: c >= 3 * r),
    # Each inner review: 6 one-token calls and one for the token the previous
    # review emitted (the round's first review rides on the window instead).
    ("reviews-mag", f"{G_ITEM}+mag", [[4, 0], [0, 6]], lambda c, r: c % 7 == 0 and c >= 7 * r),
    ("three-levels", f"small+{G_ITEM}+mag", [[2, 2, 0], [0, 2, 2], [0, 0, 3]],
     lambda c, r: c > 0),
]


@pytest.mark.parametrize("name, spec, k_matrix, calls_ok", COMPOSITIONS,
                         ids=[c[0] for c in COMPOSITIONS])
def test_greedy_compositions_equal_the_greedy_target(name, spec, k_matrix, calls_ok):
    drafter = g_drafter(spec, k_matrix)
    assert needs_features(drafter), "the decoding loop must keep the target's features"
    gamma = 3 if k_matrix is None else None
    out = sj.generate(target=G_TARGET, target_params=G_TARGET_PARAMS, prompts=G_PROMPTS,
                      drafter=drafter, drafter_params=drafter.select_params(G_NAMED),
                      gamma=gamma, max_new_tokens=NEW_TOKENS, lenience=3.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference())
    stats = out.stats
    hist = np.asarray(stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[2:].sum() > 0, f"rejections and long accepts: {hist}"
    assert np.asarray(stats.nan_logits).sum() == 0
    window = (gamma or sum(k_matrix[0])) + 1
    calls = np.asarray(stats.drafter_calls_by_model)[:, drafter.model_names.index(G_ITEM)]
    for prompt, c, r in zip(G_PROMPTS, calls, np.asarray(stats.target_calls), strict=True):
        assert calls_ok(int(c) - int(len(prompt) > window), int(r)), (name, prompt, c, r)


def test_greedy_adaptive_feature_drafter_equals_the_greedy_target(verifier=TokenVerifier()):
    drafter = AdaptiveFeatureDrafter(G_HEAD, name=G_ITEM, acceptance_head=G_ACCEPTANCE)
    decoder = SpeculativeDecoder(target=G_TARGET, drafter=drafter,
                                 target_fn=target_functions.SpecDecode(), gamma=5,
                                 max_new_tokens=NEW_TOKENS, verifier=verifier)
    out = jax.jit(decoder.generate)(G_TARGET_PARAMS, drafter.select_params(G_NAMED),
                                    make_prompt(G_PROMPTS), jax.random.PRNGKey(0),
                                    sampling_params(stop_threshold=0.5))
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference())
    drafted = np.asarray(out.stats.drafted).sum() / np.asarray(out.stats.target_calls).sum()
    assert 1.0 < drafted < 5, f"rows stop before K_max ({drafted:.2f} drafts a round)"


# The realistic path once: a decoder target's prefill of every prompt
# position's hidden state, every composition at once, a random head.
D_TARGET = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=GV, hidden_size=32,
                                             intermediate_size=64, num_layers=2, num_heads=4,
                                             num_kv_heads=2))
D_TARGET_PARAMS = D_TARGET.init_params(jax.random.PRNGKey(0))


def test_greedy_three_levels_on_a_decoder_target_equal_the_greedy_target():
    head = FeatureHead(FeatureHeadConfig.for_target(D_TARGET, intermediate_size=32))
    drafter = g_drafter(f"small+{G_ITEM}+mag", [[2, 2, 0], [0, 2, 2], [0, 0, 3]],
                        target=D_TARGET, head=head)
    named = {**G_NAMED, G_ITEM: feature_head.drafter_params(D_TARGET, D_TARGET_PARAMS,
                                                       head.init_net(jax.random.PRNGKey(1)))}
    out = sj.generate(target=D_TARGET, target_params=D_TARGET_PARAMS, prompts=G_PROMPTS,
                      drafter=drafter, drafter_params=drafter.select_params(named),
                      max_new_tokens=NEW_TOKENS, lenience=3.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference(D_TARGET))
    assert np.asarray(out.stats.rejections).sum() > 0


def test_feature_drafters_need_the_target_features_through_every_cascade():
    vertical, = g_drafter(f"small+{G_ITEM}", [[4, 0], [0, 3]]).drafters
    assert isinstance(vertical, VerticalCascade) and isinstance(vertical.inner, FeatureDrafter)
    assert vertical.inner.window == 5  # re-feeds a whole round's reveal at once
    review, = g_drafter(f"{G_ITEM}+mag", [[4, 0], [0, 6]]).drafters
    assert isinstance(review, FeatureVerticalCascade) and not review.lenient
    assert isinstance(review.inner, MaxGramDrafter) and review.inner_gamma == 6
    assert needs_features(vertical) and needs_features(review)
    assert needs_features(HorizontalCascade((ModelDrafter(G_SMALL), review), (1, 1)))
    adaptive = AdaptiveFeatureDrafter(G_HEAD, name=G_ITEM, acceptance_head=G_ACCEPTANCE)
    with pytest.raises(ValueError, match="stops rows early"):
        cs_drafter([[2, 3], [0, 0]], [adaptive, MaxGramDrafter(GV)])
    plain = make_drafter("small+mag", models={"small": G_SMALL}, vocab_size=GV,
                         k_matrix=[[2, 3], [0, 3]])
    assert not needs_features(plain) and not needs_features(plain.drafters[0])


@pytest.mark.parametrize("spec, kwargs, message", [
    ("feature:", {}, "names no directory"),
    (G_ITEM, {"feature_heads": {}}, "holds no FeatureHead"),
    (G_ITEM, {"target": None}, "pass target="),
    (G_ITEM, {"feature_heads": {G_ITEM: FeatureHead(
        dataclasses.replace(G_HEAD.config, vocab_size=GV + 1))}}, f"vocabulary {GV + 1}"),
    (G_ITEM, {"target": D_TARGET}, "hidden size is 32"),
    (f"mag+{G_ITEM}", {}, "list it last"),
])
def test_bad_feature_specs_fail_with_the_fix(spec, kwargs, message):
    args = dict(models={}, vocab_size=GV, feature_heads={G_ITEM: G_HEAD}, target=G_TARGET,
                k_matrix=[[1, 1], [0, 1]] if "+" in spec else None)
    with pytest.raises(ValueError, match=message):
        make_drafter(spec, **{**args, **kwargs})


def test_an_encoder_decoder_target_is_refused():
    from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM  # noqa: PLC0415

    t5 = T5EncoderDecoderLM(T5Config(vocab_size=GV, d_model=16, d_ff=32, num_heads=2, d_kv=8,
                                     num_encoder_layers=1, num_decoder_layers=1))
    with pytest.raises(ValueError, match="encoder-decoder"):
        make_drafter(G_ITEM, models={}, vocab_size=GV, feature_heads={G_ITEM: G_HEAD},
                     target=t5)


# ---------------------------------------------------------------------------
# T = 1: chi-square against the enumerable target (tests/exactness.py)
# ---------------------------------------------------------------------------

D = V ** TARGET.order  # the table target's hidden state: one-hot of its context index
T_HEAD = FeatureHead(FeatureHeadConfig(vocab_size=V, feature_size=D, embed_size=8,
                                       num_heads=2, num_kv_heads=1, intermediate_size=32))
T_ITEM = "feature:/heads/table"
ACCEPTANCE = AcceptanceHead(HeadConfig(hidden_size=D, depth=1))


def table_head_params(seed: int = 31) -> dict:
    net_key, embed_key, rows_key = jax.random.split(jax.random.PRNGKey(seed), 3)
    return {"net": T_HEAD.init_net(net_key),
            "embedding": jax.random.normal(embed_key, (V, 8)),
            "head": {"rows": 0.7 * jax.random.normal(rows_key, (V, D))}}


def acceptance_params(seed: int = 33) -> dict:
    """A random head whose stop decisions vary with the predicted feature."""
    params = ACCEPTANCE.init_params(jax.random.PRNGKey(seed))
    kernel = 3.0 * jax.random.normal(jax.random.PRNGKey(seed + 1), (D, 1))
    return {**params, "output": {"kernel": kernel, "bias": jnp.full((1,), 1.0)}}


T_NAMED = {T_ITEM: table_head_params(), "big": DRAFTER_PARAMS,
           "mag": jax.random.randint(jax.random.PRNGKey(14), (V,), 0, V),
           f"{T_ITEM}/acceptance_head": acceptance_params()}
T_FEATURE = FeatureDrafter(T_HEAD, name=T_ITEM)
T_BIG = ModelDrafter(DRAFTER, name="big")
T_MAG = MaxGramDrafter(V)
LENIENCE = 2.0


def t_sample(drafter, gamma=None, verifier=TokenVerifier(), lenience=1.0, rows=ROWS,
             threshold=0.5):
    decoder = SpeculativeDecoder(target=TARGET, drafter=drafter,
                                 target_fn=target_functions.SpecDecode(),
                                 gamma=gamma or drafter.gamma, max_new_tokens=LENGTH,
                                 verifier=verifier)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, drafter.select_params(T_NAMED),
                                    make_prompt([list(PROMPT)] * rows), jax.random.PRNGKey(0),
                                    sampling_params(temperature=1.0, lenience=lenience,
                                                    stop_threshold=threshold))
    assert np.all(np.asarray(out.lengths) == LENGTH)
    return out


def target_probs():
    return exact_sequence_probs(lambda c: TARGET.next_probs(TARGET_PARAMS, c))


@dataclasses.dataclass(frozen=True)
class ReportsMaxGramsLaw(FeatureVerticalCascade):
    """Known-wrong: reports Max-Gram's one-hot q as the law of the reviewed
    tokens; a rejected position then emits the head's correction, which that
    one-hot gives no mass."""

    @staticmethod
    def review_law(q_xV, p_xV, lenience):
        return q_xV


@dataclasses.dataclass(frozen=True)
class ReportsTheHeadsLaw(FeatureVerticalCascade):
    """Known-wrong: reviews Max-Gram with lenience l = 2 but reports the head's
    own law p (the l = 1 law) as the level's q."""

    @staticmethod
    def review_law(q_xV, p_xV, lenience):
        return p_xV


def _review(cls=FeatureVerticalCascade, lenient=False):
    return HorizontalCascade((cls(model=T_FEATURE, inner=T_MAG, inner_gamma=2, name=T_ITEM,
                                  lenient=lenient),), (2,))


# (id, drafter, verifier, lenience)
EXACT = [
    ("horizontal-token", cs_drafter([[1, 2], [0, 0]], [T_FEATURE, T_MAG]), TokenVerifier(),
     1.0),
    ("horizontal-block", cs_drafter([[1, 2], [0, 0]], [T_FEATURE, T_MAG]), BlockVerifier(),
     1.0),
    ("under-a-model-l2", cs_drafter([[2, 0], [0, 2]], [T_BIG, T_FEATURE]), TokenVerifier(),
     LENIENCE),
    ("reviews-mag", cs_drafter([[2, 0], [0, 2]], [T_FEATURE, T_MAG]), TokenVerifier(), 1.0),
    ("reviews-mag-l2", _review(lenient=True), TokenVerifier(), LENIENCE),
]


@pytest.mark.long
@pytest.mark.parametrize("name, drafter, verifier, lenience", EXACT, ids=[e[0] for e in EXACT])
def test_feature_compositions_keep_the_target_law(name, drafter, verifier, lenience):
    out = t_sample(drafter, verifier=verifier, lenience=lenience)
    assert chi_square_pvalue(np.asarray(out.tokens), target_probs()) > P_MIN
    hist = np.asarray(out.stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[1:].sum() > 0, "rejections and acceptances both occur"


@pytest.mark.long
@pytest.mark.parametrize("wrong, lenience", [(ReportsMaxGramsLaw, 1.0),
                                             (ReportsTheHeadsLaw, LENIENCE)],
                         ids=["max-gram-one-hot", "l2-with-the-heads-law"])
def test_a_review_reported_with_the_wrong_law_is_rejected(wrong, lenience):
    """The statistic that passes ``reviews-mag`` and ``reviews-mag-l2`` rejects
    the same reviews reported with another law: p-value < 1e-12 (asserted;
    measured 0.0 for both; the correct laws gave 0.28 and 0.10)."""
    out = t_sample(_review(wrong, lenient=lenience > 1), lenience=lenience)
    assert chi_square_pvalue(np.asarray(out.tokens), target_probs()) < 1e-12


@pytest.mark.long
@pytest.mark.parametrize("verifier", [TokenVerifier(), BlockVerifier()], ids=["token", "block"])
def test_adaptive_feature_drafter_keeps_the_target_law(verifier):
    drafter = AdaptiveFeatureDrafter(T_HEAD, name=T_ITEM, acceptance_head=ACCEPTANCE)
    out = t_sample(drafter, gamma=4, verifier=verifier)
    assert chi_square_pvalue(np.asarray(out.tokens), target_probs()) > P_MIN
    per_round = np.asarray(out.stats.drafted).sum() / np.asarray(out.stats.target_calls).sum()
    assert 1.0 < per_round < 4, f"rows stop at different lengths ({per_round:.2f})"


# ---------------------------------------------------------------------------
# The command line: a saved head, end to end on a toy target
# ---------------------------------------------------------------------------

@pytest.mark.long  # five compiled generations through the CLI (about a minute)
def test_cli_drafts_with_a_saved_feature_head(tmp_path, capsys):
    """``specdec-jax generate --draft feature:<dir>``: greedy output equals the
    target's alone, composed with Max-Gram and block verification; a cascade
    target function runs; another target's head is refused when loading
    (same name, other weights: the fingerprint)."""
    from specdec_jax.checkpoints import feature_head_io  # noqa: PLC0415
    from specdec_jax.jobs import cli, resolver  # noqa: PLC0415

    name = "toy-bytes-large"
    target, target_params, _ = resolver.resolve(name)
    head = FeatureHead(FeatureHeadConfig.for_target(target, intermediate_size=32))
    path = feature_head_io.save_feature_head(
        tmp_path / "head", head, head.init_net(jax.random.PRNGKey(0)), target_name=name,
        fingerprint=feature_head_io.target_fingerprint(target_params, target))
    table = tmp_path / "bigram.npy"
    np.save(table, np.roll(np.arange(target.vocab_size), 1).astype(np.int32))

    def run(*argv):
        code = cli.main(["generate", "--target", name, "--prompt", "def f(x):\n    return",
                         "--prompt", "abcabcab", "--max-new-tokens", "12", "--no-baseline",
                         "--json", "--bigram", str(table), *argv])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        return json.loads(captured.out)

    reference = run("--method", "autoregressive")["completions"]
    for argv in [["--draft", f"feature:{path}", "--gamma", "3"],
                 ["--draft", f"feature:{path}+mag", "--k-matrix", "[[3,4],[0,0]]",
                  "--verifier", "block"],
                 ["--draft", f"feature:{path}+mag", "--k-matrix", "[[4,0],[0,6]]",
                  "--verifier", "block-seed"]]:
        report = run(*argv)
        assert report["completions"] == reference, argv
        assert report["results"][report["method"]]["drafter_calls"] > 0
    cascade = run("--draft", f"feature:{path}", "--method", "token-v3", "--alpha", "0.3",
                  "--temperature", "1")
    assert cascade["results"]["token-v3"]["tokens"] == 24

    other = sj.DecoderOnlyLM(target.config).init_params(jax.random.PRNGKey(7))
    with pytest.raises(ValueError, match="trained for target"):
        feature_head_io.load_feature_head(path, target_name=name, target=target,
                                        target_params=other)
