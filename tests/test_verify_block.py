"""Block verification (docs/algorithms.md, 'Block verification'): exactness over many rounds (both
forms, against p and against a cascade pi), the seed form's carried residual
zones (exact enumeration, stacked zones), optimality (Theorems 1 and 2),
greedy and G = 1 equivalence with token verification, known-wrong variants.

Toy models: ``q(.|prefix)`` and ``p(.|prefix)`` are rows of fixed random
tables indexed by a hash of the *whole* prefix (not an n-gram window), so
every position of a carried zone has its own conditionals. The multi-round
driver below draws G drafts from q, builds q / pi / bonus from the tables,
calls the verifier and appends ``tau`` drafts plus the next token, round
after round, exactly as the decoding engine does (one engine run is checked
at the end).

Statistics: a correct implementation passes a chi-square test at
``P_MIN = 1e-3`` (fails with probability 1e-3); every known-wrong variant must
fall below ``P_WRONG = 1e-9`` under the same statistic. Sample: 100k rows,
V = 3, G = 4, the first 5 tokens (243 cells; cells expected below 5 counts
are pooled). Measured p-values are in each test's docstring; over 8 seeds the
correct forms gave p in [0.04, 0.95] (block), [0.11, 0.94] (seed), [0.14,
0.81] / [0.29, 0.95] (cascade pi), i.e. no sign of bias. Exact enumeration
(float32 kernels, float64 bookkeeping) complements the Monte Carlo runs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax import target_functions
from specdec_jax.api import sampling_params
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.models.interface import make_prompt
from specdec_jax.verify.block import (
    BlockVerifier,
    SeedBlockState,
    SeedBlockVerifier,
    advance_state,
    block_weights,
    carried_conditionals,
    scaled_residual,
    seed_block_weights,
)
from specdec_jax.verify.token import TokenVerifier, VerifyOutput, correction_or_bonus
from tests import exactness
from tests.exactness import DRAFTER, DRAFTER_PARAMS, TARGET, TARGET_PARAMS

P_MIN = 1e-3  # a correct implementation fails with probability 1e-3
P_WRONG = 1e-9  # a known-wrong variant must fall below this

V = 3
GAMMA = 4
LENGTH = 5  # V ** LENGTH = 243 cells
ROWS = 100_000
TABLE_ROWS = 1 << 12
PROMPT = (2, 0, 1)
HASH_MULT = np.uint64(0x9E3779B97F4A7C15)
HASH_SHIFT = np.uint64(40)


# ---------------------------------------------------------------------------
# Toy models: conditionals indexed by a hash of the whole prefix
# ---------------------------------------------------------------------------

def extend_code(codes: np.ndarray, tokens: np.ndarray, v: int) -> np.ndarray:
    """Prefix code after appending ``tokens`` (unique per prefix up to uint64 wrap)."""
    return codes * np.uint64(v + 1) + np.asarray(tokens).astype(np.uint64) + np.uint64(1)


def prompt_code(v: int) -> np.ndarray:
    code = np.zeros((1,), np.uint64)
    for token in PROMPT:
        code = extend_code(code, np.array([token]), v)
    return code


def table_rows(codes: np.ndarray) -> np.ndarray:
    return ((codes * HASH_MULT) >> HASH_SHIFT) % np.uint64(TABLE_ROWS)


@dataclasses.dataclass(frozen=True, eq=False)
class ToyPair:
    """Drafter and target tables, float32 [TABLE_ROWS, V]. ``pi`` is what the
    verifier is given (and what the output must follow): p itself, or with
    ``cascade`` the cascade target ``cascade_pi(q, p)``."""

    q_table: np.ndarray
    p_table: np.ndarray
    cascade: bool = False

    @property
    def vocab(self) -> int:
        return self.q_table.shape[1]

    def q(self, codes):
        return self.q_table[table_rows(codes)]

    def pi(self, codes):
        q, p = self.q_table[table_rows(codes)], self.p_table[table_rows(codes)]
        return cascade_pi(q, p) if self.cascade else p


CHOW_THRESHOLD = 0.7


def cascade_pi(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """A cascade target T(q, p): Chow's rule, defer to p when max q < 0.7."""
    defer = (q.max(axis=-1, keepdims=True) < CHOW_THRESHOLD).astype(q.dtype)
    return (1 - defer) * q + defer * p


def make_pair(seed: int, v: int = V, mix: float = 0.35, cascade: bool = False) -> ToyPair:
    """p ~ Dirichlet(0.7) per row; q = mix * p + (1 - mix) * independent noise."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(v, 0.7), size=TABLE_ROWS)
    noise = rng.dirichlet(np.full(v, 0.7), size=TABLE_ROWS)
    q = mix * p + (1 - mix) * noise
    q = np.maximum(q, 1e-4)
    return ToyPair((q / q.sum(-1, keepdims=True)).astype(np.float32),
                   p.astype(np.float32), cascade)


PAIR = make_pair(0)
CASCADE_PAIR = make_pair(0, cascade=True)


def exact_sequence_probs(pair: ToyPair, length: int) -> np.ndarray:
    """P(x_1 .. x_length) under autoregressive sampling from pi, float64 [V ** length],
    index = base-V number of the sequence (x_1 most significant)."""
    v = pair.vocab
    seqs = np.array(list(itertools.product(range(v), repeat=length)))
    codes = np.repeat(prompt_code(v), len(seqs))
    probs = np.ones(len(seqs))
    for i in range(length):
        probs *= pair.pi(codes)[np.arange(len(seqs)), seqs[:, i]].astype(np.float64)
        codes = extend_code(codes, seqs[:, i], v)
    return probs


MIN_EXPECTED = 5.0  # cells expected below this are pooled into one (chi-square validity)


def chi_square_pvalue(tokens_RxN: np.ndarray, expected: np.ndarray, v: int) -> float:
    """p-value of the sampled sequences against the exact law (all V ** N cells)."""
    length = tokens_RxN.shape[1]
    index = tokens_RxN @ (v ** np.arange(length - 1, -1, -1))
    counts = np.bincount(index, minlength=v ** length).astype(np.float64)
    want = expected / expected.sum() * len(tokens_RxN)
    small = want < MIN_EXPECTED
    counts = np.append(counts[~small], counts[small].sum())
    want = np.append(want[~small], want[small].sum())
    return float(stats.chisquare(counts, want).pvalue)


# ---------------------------------------------------------------------------
# Multi-round driver
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def jitted(verifier):
    return jax.jit(verifier.__call__)


def sample_rows(rng: np.random.Generator, probs_RxV: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(probs_RxV.astype(np.float64), axis=-1)
    u = rng.random(len(probs_RxV)) * cdf[:, -1]
    return np.minimum((u[:, None] >= cdf).sum(-1), probs_RxV.shape[1] - 1)


@dataclasses.dataclass
class ZoneCounts:
    """Rounds (that still shape the measured tokens) by the zones live at their start."""

    in_zone: int = 0  # >= 1 live zone
    stacked: int = 0  # >= 2 live zones
    stacked3: int = 0  # >= 3 live zones
    corrected_in_zone: int = 0  # correction at a position a live zone covers


def run_rounds(verifier, pair: ToyPair, rows: int = ROWS, gamma: int = GAMMA,
               length: int = LENGTH, seed: int = 0) -> tuple[np.ndarray, ZoneCounts]:
    """Generates ``length`` tokens per row by repeated rounds of ``verifier``."""
    v = pair.vocab
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    call = jitted(verifier)
    width = length + gamma + 1
    tokens = np.zeros((rows, width), np.int64)
    count = np.zeros(rows, np.int64)
    codes = np.repeat(prompt_code(v), rows)
    state = verifier.init_state(rows)
    zones = ZoneCounts()
    row_ids = np.arange(rows)
    while count.min() < length:
        q_list, pi_list, drafts = [], [], []
        c = codes
        for j in range(gamma + 1):
            q_list.append(pair.q(c))
            pi_list.append(pair.pi(c))
            if j < gamma:
                drafts.append(sample_rows(rng, q_list[-1]))
                c = extend_code(c, drafts[-1], v)
        q_RxG1xV, pi_RxG1xV = np.stack(q_list, 1), np.stack(pi_list, 1)
        drafts_RxG = np.stack(drafts, 1)
        key, sub = jax.random.split(key)
        out = call(sub, jnp.asarray(drafts_RxG, jnp.int32), jnp.asarray(q_RxG1xV[:, :gamma]),
                   jnp.asarray(pi_RxG1xV[:, :gamma]), jnp.asarray(pi_RxG1xV[:, gamma]),
                   state)
        tau, y = np.asarray(out.num_accepted), np.asarray(out.next_token)
        if isinstance(state, SeedBlockState):
            live = np.asarray(state.live)[:, : gamma - 1]
            matters = count < length
            n_live = live.sum(-1)
            zones.in_zone += int(np.sum(matters & (n_live >= 1)))
            zones.stacked += int(np.sum(matters & (n_live >= 2)))
            zones.stacked3 += int(np.sum(matters & (n_live >= 3)))
            covers = live & (np.arange(gamma - 1)[None, :] >= tau[:, None])
            zones.corrected_in_zone += int(np.sum(matters & (tau < gamma) & covers.any(-1)))
        candidates = np.concatenate([drafts_RxG, drafts_RxG[:, :1]], axis=1)
        candidates[row_ids, tau] = y
        for i in range(gamma + 1):
            emit = (i <= tau) & (count + i < width)
            tokens[row_ids[emit], (count + i)[emit]] = candidates[emit, i]
            codes = np.where(i <= tau, extend_code(codes, candidates[:, i], v), codes)
        count += tau + 1
        state = out.state
    return tokens[:, :length], zones


# ---------------------------------------------------------------------------
# Known-wrong variants (each must be rejected by the same statistic)
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ResidualFromPi:
    """Known-wrong: after the block decision, the correction is drawn from
    norm(pi) instead of norm((w_tau pi - q)_+)."""

    inner: BlockVerifier = BlockVerifier()

    def init_state(self, batch_size):
        return self.inner.init_state(batch_size)

    def __call__(self, key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state):
        out = self.inner(key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state)
        nxt = correction_or_bonus(jax.random.fold_in(key, 1), out.num_accepted, q_BxGxV,
                                  pi_BxGxV, bonus_BxV, weights_fn=lambda pi, q: pi)
        return VerifyOutput(out.num_accepted, nxt, out.state)


@dataclasses.dataclass(frozen=True)
class SeedWithoutCarry(SeedBlockVerifier):
    """Known-wrong: the seed form with its state dropped (every round fresh)."""

    def __call__(self, key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state):
        fresh = self.init_state(drafts_BxG.shape[0])
        return super().__call__(key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, fresh)


@dataclasses.dataclass(frozen=True)
class SeedWithoutStacking(SeedBlockVerifier):
    """Known-wrong: a new zone replaces the live ones instead of stacking on them."""

    def __call__(self, key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state):
        out = super().__call__(key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state)
        return VerifyOutput(out.num_accepted, out.next_token, drop_older_zones(
            out.state, out.num_accepted, drafts_BxG.shape[1]))


def drop_older_zones(state: SeedBlockState, tau_B, gamma: int) -> SeedBlockState:
    newest_1xZ = jnp.arange(state.live.shape[1])[None, :] == (gamma - 2 - tau_B)[:, None]
    opened_B1 = (tau_B <= gamma - 2)[:, None]
    return state.replace(live=state.live & (newest_1xZ | ~opened_B1))


# ---------------------------------------------------------------------------
# Exactness over many rounds (Monte Carlo, chi-square on all 243 sequences)
# ---------------------------------------------------------------------------

@pytest.mark.long
def test_forward_block_is_exact_over_rounds():
    """Stateless form vs autoregressive p: p-value 0.79. The known-wrong
    residual norm(p) instead of norm((w_tau p - q)_+): p-value 0 (underflow)."""
    expected = exact_sequence_probs(PAIR, LENGTH)
    tokens, _ = run_rounds(BlockVerifier(), PAIR)
    assert chi_square_pvalue(tokens, expected, V) > P_MIN
    wrong, _ = run_rounds(ResidualFromPi(), PAIR, seed=1)
    assert chi_square_pvalue(wrong, expected, V) < P_WRONG


@pytest.mark.long
def test_seed_block_is_exact_over_rounds_with_stacked_zones():
    """Seed form with carried zones vs autoregressive p: p-value 0.56. Of the
    rounds that shape the 5 measured tokens, ~82k start inside a zone, ~33k
    inside two stacked zones, ~7.7k inside three, ~56k correct inside a zone.
    Known-wrong: the seed form without carried state, p-value 0 (underflow);
    with a new zone replacing the live ones instead of stacking, 5e-87."""
    expected = exact_sequence_probs(PAIR, LENGTH)
    tokens, zones = run_rounds(SeedBlockVerifier(), PAIR)
    assert chi_square_pvalue(tokens, expected, V) > P_MIN
    assert zones.in_zone > 20_000 and zones.stacked > 2_000 and zones.stacked3 > 200
    assert zones.corrected_in_zone > 10_000
    no_carry, _ = run_rounds(SeedWithoutCarry(), PAIR, seed=1)
    assert chi_square_pvalue(no_carry, expected, V) < P_WRONG
    no_stack, _ = run_rounds(SeedWithoutStacking(), PAIR, seed=2)
    assert chi_square_pvalue(no_stack, expected, V) < P_WRONG


@pytest.mark.long
@pytest.mark.parametrize("verifier", [BlockVerifier(), SeedBlockVerifier()],
                         ids=["block", "block-seed"])
def test_block_verified_cascade_follows_pi(verifier):
    """Against a cascade target pi = T(q, p) (block-verified speculative
    cascade): sequences ~ autoregressive pi. p-values 0.71 (block), 0.60
    (block-seed, ~78k rounds starting in a zone, ~31k in stacked zones)."""
    expected = exact_sequence_probs(CASCADE_PAIR, LENGTH)
    tokens, zones = run_rounds(verifier, CASCADE_PAIR)
    assert chi_square_pvalue(tokens, expected, V) > P_MIN
    if isinstance(verifier, SeedBlockVerifier):
        assert zones.stacked > 2_000 and zones.corrected_in_zone > 10_000


# ---------------------------------------------------------------------------
# Exact enumeration of the multi-round output law
# ---------------------------------------------------------------------------

FORMS = ("seed", "seed-no-carry", "seed-no-stack", "forward", "forward-token-residual")


@functools.partial(jax.jit, static_argnums=0)
def round_kernel(form: str, live, log_ratio, drafts, q, pi):
    """One round of ``form`` from the module's own functions: h [B, G + 1], the
    next-token distribution for every tau [B, G + 1, V] (the last one unused:
    the bonus), the round's log scale (log rho or log w) and zone log ratios."""
    state = SeedBlockState(live=live, log_ratio=log_ratio)
    if form == "seed-no-carry":
        state = SeedBlockVerifier().init_state(drafts.shape[0])
    if form.startswith("forward"):
        w, h = block_weights(drafts, q, pi)
        log_scale = jnp.zeros_like(w) if form.endswith("token-residual") else jnp.log(w)
        v_cond, log_r = pi, jnp.zeros((drafts.shape[0], drafts.shape[1] - 1, drafts.shape[1]))
    else:
        v_cond, log_r = carried_conditionals(state, drafts, q, pi)
        log_scale, h = seed_block_weights(drafts, q, v_cond)
    g = drafts.shape[1]
    res = scaled_residual(log_scale[:, :g], v_cond, q)
    next_w = jnp.concatenate([res / jnp.sum(res, -1, keepdims=True), res[:, :1]], axis=1)
    return h, next_w, log_scale, log_r


@jax.jit
def advance_state_arrays(live, log_ratio, *args):
    new = advance_state(SeedBlockState(live=live, log_ratio=log_ratio), *args)
    return new.live, new.log_ratio


CHUNK = 4096  # enumeration rows per jitted call (one compilation per kernel)


def chunked(fn, *arrays):
    """``fn`` over fixed-size, zero-padded chunks of the rows; numpy outputs."""
    n, outs = len(arrays[0]), []
    for start in range(0, n, CHUNK):
        part = [np.asarray(a[start:start + CHUNK]) for a in arrays]
        m = len(part[0])
        padded = [np.pad(a, [(0, CHUNK - m)] + [(0, 0)] * (a.ndim - 1)) for a in part]
        outs.append(jax.tree_util.tree_map(lambda a, m=m: np.asarray(a)[:m], fn(*padded)))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outs)


def exact_output_law(form: str, pair: ToyPair, gamma: int, length: int
                     ) -> tuple[np.ndarray, float]:
    """Exact law of the first ``length`` tokens of repeated rounds, [V ** length].

    Enumerates, round after round, every draft block (prob prod q), every tau
    (P(tau = k | X) = h_k prod_{j > k} (1 - h_j)) and every next token (its
    residual or bonus probability). Children with the same parent, tau, next
    token and accepted drafts share the emitted tokens and the carried state,
    so they are merged. Also returns the probability that a round starts with
    two or more live zones (so stacked zones were enumerated).
    """
    v = pair.vocab
    all_drafts = np.array(list(itertools.product(range(v), repeat=gamma)), np.int64)
    num_d = len(all_drafts)
    empty_state = SeedBlockVerifier().init_state(1)
    law = np.zeros(v ** length)
    tokens = np.zeros((1, length + gamma + 1), np.int64)
    count, prob = np.zeros(1, np.int64), np.ones(1)
    codes = prompt_code(v)
    live, log_ratio = np.asarray(empty_state.live), np.asarray(empty_state.log_ratio)
    stacked_mass = 0.0
    while len(prob):
        stacked_mass += float(np.sum(prob[live[:, : gamma - 1].sum(-1) >= 2]))
        n = len(prob) * num_d
        parent = np.repeat(np.arange(len(prob)), num_d)
        drafts = np.tile(all_drafts, (len(prob), 1))
        c = codes[parent]
        q_list, pi_list = [], []
        for j in range(gamma + 1):
            q_list.append(pair.q(c))
            pi_list.append(pair.pi(c))
            if j < gamma:
                c = extend_code(c, drafts[:, j], v)
        q, pi = np.stack(q_list, 1), np.stack(pi_list, 1)
        draft_prob = np.prod(q[np.arange(n)[:, None], np.arange(gamma)[None, :], drafts], -1)
        f32 = lambda a: a.astype(np.float32)
        kernel_form = "seed" if form == "seed-no-stack" else form
        h, next_w, log_scale, log_r = chunked(
            functools.partial(round_kernel, kernel_form), live[parent], log_ratio[parent],
            drafts.astype(np.int32), f32(q[:, :gamma]), f32(pi[:, :gamma]))
        h, next_w = h.astype(np.float64), next_w.astype(np.float64)
        tail = np.concatenate([np.cumprod((1 - h[:, :0:-1]), axis=1)[:, ::-1],
                               np.ones((n, 1))], axis=1)  # prod_{j > k} (1 - h_j)
        p_tau = h * tail  # [n, G + 1]
        next_w[:, gamma] = pi[:, gamma]
        child_p = (prob[parent] * draft_prob)[:, None, None] * p_tau[:, :, None] * next_w
        row, tau, y = np.nonzero(child_p > 0)
        weight = child_p[row, tau, y]
        # Merge children with equal (parent, tau, y, accepted drafts).
        accepted = np.where(np.arange(gamma)[None, :] < tau[:, None], drafts[row], -1)
        keys = np.concatenate([parent[row, None], tau[:, None], y[:, None], accepted], 1)
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        weight = np.bincount(inverse.reshape(-1), weights=weight)
        row, tau, y = row[first], tau[first], y[first]
        if form.startswith("seed") and form != "seed-no-carry":
            live, log_ratio = chunked(
                advance_state_arrays, live[parent][row], log_ratio[parent][row],
                drafts[row].astype(np.int32), f32(q[row, :gamma]), f32(pi[row, :gamma]),
                log_r[row], log_scale[row], tau.astype(np.int32), y.astype(np.int32))
            if form == "seed-no-stack":
                live = np.asarray(drop_older_zones(SeedBlockState(live, log_ratio),
                                                   jnp.asarray(tau), gamma).live)
        else:
            live = np.zeros((len(row), live.shape[1]), bool)
            log_ratio = np.zeros((len(row), live.shape[1]), np.float32)
        emitted = np.concatenate([drafts[row], drafts[row, :1]], 1)
        emitted[np.arange(len(row)), tau] = y
        tokens, count, codes = tokens[parent[row]], count[parent[row]], codes[parent[row]]
        for i in range(gamma + 1):
            put = (i <= tau) & (count + i < tokens.shape[1])
            tokens[np.nonzero(put)[0], (count + i)[put]] = emitted[put, i]
            codes = np.where(i <= tau, extend_code(codes, emitted[:, i], v), codes)
        count = count + tau + 1
        done = count >= length
        index = tokens[done, :length] @ (v ** np.arange(length - 1, -1, -1))
        law += np.bincount(index, weights=weight[done], minlength=v ** length)
        keep = ~done
        tokens, count, codes, prob = tokens[keep], count[keep], codes[keep], weight[keep]
        live, log_ratio = live[keep], log_ratio[keep]
    return law, stacked_mass


@pytest.mark.long
@pytest.mark.parametrize("pair_seed,cascade", [(5, False), (0, True)], ids=["p", "cascade-pi"])
def test_multi_round_law_is_exact_by_enumeration(pair_seed, cascade):
    """Exact law of the first 4 tokens (V = 3, G = 3): both forms equal
    autoregressive sampling from p (or from the cascade pi) to float32
    precision (measured total variation 3e-8), with stacked zones enumerated
    (they start rounds with total probability 0.10 / 0.18). Known-wrong
    variants are off by far more than float32 noise: the seed form without its
    carried state (TV 0.055 / 0.13) or without stacking (0.0029 / 0.011), the
    forward form with the token residual norm((pi - q)_+) (0.010 / 0.0045)."""
    pair = make_pair(pair_seed, cascade=cascade)
    gamma, length = 3, 4
    exact = exact_sequence_probs(pair, length)
    tv = {form: 0.5 * np.abs(exact_output_law(form, pair, gamma, length)[0] - exact).sum()
          for form in FORMS}
    assert exact_output_law("seed", pair, gamma, length)[1] > 0.05  # stacked zones reached
    assert tv["seed"] < 1e-6 and tv["forward"] < 1e-6
    assert tv["seed-no-carry"] > 1e-2
    assert tv["seed-no-stack"] > 1e-3
    assert tv["forward-token-residual"] > 1e-3


# ---------------------------------------------------------------------------
# Optimality (Theorems 1 and 2), one fresh round, exact enumeration
# ---------------------------------------------------------------------------

def fresh_round_tables(pair: ToyPair, gamma: int):
    """All V ** G draft blocks from the prompt: drafts [D, G], q / pi [D, G, V], q(X) [D]."""
    v = pair.vocab
    drafts = np.array(list(itertools.product(range(v), repeat=gamma)))
    codes = np.repeat(prompt_code(v), len(drafts))
    q_list, pi_list = [], []
    for j in range(gamma):
        q_list.append(pair.q(codes))
        pi_list.append(pair.pi(codes))
        codes = extend_code(codes, drafts[:, j], v)
    q, pi = np.stack(q_list, 1), np.stack(pi_list, 1)
    return drafts, q, pi, np.prod(token_probs(q, drafts), axis=-1)


def token_probs(probs_DxGxV: np.ndarray, drafts_DxG: np.ndarray) -> np.ndarray:
    return np.take_along_axis(probs_DxGxV, drafts_DxG[..., None], -1)[..., 0].astype(np.float64)


def theorem_values(pair: ToyPair, gamma: int) -> tuple[float, float]:
    """Theorem 1: sum_l sum_{x^l} min(M_s(x^l), M_b(x^l)); Theorem 2 (token
    verification): sum_l sum_{x^l} prod_{i <= l} min(q_i(x_i), p_i(x_i))."""
    drafts, q, pi, _ = fresh_round_tables(pair, gamma)
    q_tok, pi_tok = token_probs(q, drafts), token_probs(pi, drafts)
    theorem1 = theorem2 = 0.0
    for length in range(1, gamma + 1):
        # each prefix x^l appears V ** (G - l) times among the full blocks: keep one
        _, first = np.unique(drafts[:, :length], axis=0, return_index=True)
        m_s = np.prod(q_tok[first, :length], -1)
        m_b = np.prod(pi_tok[first, :length], -1)
        theorem1 += np.minimum(m_s, m_b).sum()
        theorem2 += np.prod(np.minimum(q_tok[first, :length], pi_tok[first, :length]), -1).sum()
    return float(theorem1), float(theorem2)


def expected_tau(h_DxG1: np.ndarray, draft_prob_D: np.ndarray) -> float:
    """E[tau] = sum_X q(X) sum_k k h_k prod_{j > k} (1 - h_j)."""
    h = np.asarray(h_DxG1, np.float64)
    tail = np.concatenate([np.cumprod(1 - h[:, :0:-1], axis=1)[:, ::-1],
                           np.ones((len(h), 1))], axis=1)
    return float(draft_prob_D @ ((h * tail) @ np.arange(h.shape[1])))


def monte_carlo_tau(verifier, drafts, q, pi, draft_prob, seed) -> tuple[float, float]:
    """Mean tau of the jitted verifier over ROWS rows (every block repeated
    ROWS // D times; the shapes of the exactness runs, so no new compile),
    weighted by q(X); returns (mean, standard error)."""
    repeats = ROWS // len(drafts)
    index = np.concatenate([np.repeat(np.arange(len(drafts)), repeats),
                            np.zeros(ROWS - repeats * len(drafts), np.int64)])
    out = jitted(verifier)(jax.random.PRNGKey(seed), jnp.asarray(drafts[index], jnp.int32),
                           jnp.asarray(q[index]), jnp.asarray(pi[index]),
                           jnp.asarray(pi[index, -1]), verifier.init_state(ROWS))
    tau = np.asarray(out.num_accepted)[: repeats * len(drafts)].astype(np.float64)
    tau = tau.reshape(len(drafts), repeats)
    return draft_prob @ tau.mean(1), float(np.sqrt(draft_prob ** 2 @ tau.var(1) / repeats))


@pytest.mark.parametrize("pair_seed,cascade", [(0, False), (1, False), (2, True)])
def test_expected_accepted_length_theorems(pair_seed, cascade):
    """Fresh round, V = 3, G = 4, all 81 draft blocks: E[tau] of the seed form
    = Theorem 1; token verification = Theorem 2 < stateless form < Theorem 1;
    the jitted verifiers' Monte Carlo mean tau matches the exact values.
    Measured (Theorem 1 = seed / stateless / Theorem 2 = token):
    2.4395 / 2.1461 / 2.0079, 2.4749 / 2.3470 / 2.1005, cascade 2.4383 /
    2.2920 / 1.9274."""
    pair, gamma = make_pair(pair_seed, cascade=cascade), GAMMA
    theorem1, theorem2 = theorem_values(pair, gamma)
    drafts, q, pi, draft_prob = fresh_round_tables(pair, gamma)
    fresh = SeedBlockVerifier().init_state(len(drafts))
    arrays = (np.asarray(fresh.live), np.asarray(fresh.log_ratio), drafts.astype(np.int32), q, pi)
    seed_h = chunked(functools.partial(round_kernel, "seed"), *arrays)[0]
    block_h = chunked(functools.partial(round_kernel, "forward"), *arrays)[0]
    seed_tau, block_tau = expected_tau(seed_h, draft_prob), expected_tau(block_h, draft_prob)
    ratios = np.minimum(1.0, token_probs(pi, drafts) / token_probs(q, drafts))
    token_tau = float(draft_prob @ np.cumprod(ratios, axis=1).sum(1))
    np.testing.assert_allclose(seed_tau, theorem1, rtol=1e-5)
    np.testing.assert_allclose(token_tau, theorem2, rtol=1e-5)
    assert theorem2 + 1e-3 < block_tau < theorem1 - 1e-3
    for verifier, exact in [(SeedBlockVerifier(), seed_tau), (BlockVerifier(), block_tau)]:
        mean, stderr = monte_carlo_tau(verifier, drafts, q, pi, draft_prob, pair_seed)
        assert abs(mean - exact) < 5 * stderr


# ---------------------------------------------------------------------------
# Greedy, G = 1, numerics, engine
# ---------------------------------------------------------------------------

def random_live_state(rng: np.random.Generator, batch: int, gamma: int) -> SeedBlockState:
    state = SeedBlockVerifier().init_state(batch)
    live = np.zeros(state.live.shape, bool)
    live[:, : gamma - 1] = rng.random((batch, gamma - 1)) < 0.5
    log_ratio = np.where(live, 3.0 * rng.standard_normal(live.shape), 0.0)
    return SeedBlockState(live=jnp.asarray(live), log_ratio=jnp.asarray(log_ratio, jnp.float32))


def test_greedy_block_equals_token_verification():
    """One-hot q and p: both forms (the seed form also from states with live
    zones, whose residual of a one-hot p is p itself) = token verification."""
    rng = np.random.default_rng(0)
    q_idx = rng.integers(0, V, size=(ROWS, GAMMA + 1))
    p_idx = np.where(rng.random((ROWS, GAMMA + 1)) < 0.7, q_idx,
                     rng.integers(0, V, (ROWS, GAMMA + 1)))
    q, p = jax.nn.one_hot(q_idx, V), jax.nn.one_hot(p_idx, V)
    drafts = jnp.asarray(q_idx[:, :GAMMA], jnp.int32)
    args = (jax.random.PRNGKey(3), drafts, q[:, :GAMMA], p[:, :GAMMA], p[:, GAMMA])
    tok = jitted(TokenVerifier())(*args, None)
    for verifier, state in [(BlockVerifier(), None),
                            (SeedBlockVerifier(), SeedBlockVerifier().init_state(ROWS)),
                            (SeedBlockVerifier(), random_live_state(rng, ROWS, GAMMA))]:
        out = jitted(verifier)(*args, state)
        np.testing.assert_array_equal(np.asarray(tok.num_accepted), np.asarray(out.num_accepted))
        np.testing.assert_array_equal(np.asarray(tok.next_token), np.asarray(out.next_token))
    assert 0 < np.mean(np.asarray(tok.num_accepted) == GAMMA) < 1


def test_block_with_one_draft_is_token_verification():
    """G = 1: both forms are token verification, draw for draw."""
    rng = np.random.default_rng(1)
    rows = 4096
    q = jnp.asarray(rng.dirichlet(np.ones(5), size=(rows, 1)), jnp.float32)
    p = jnp.asarray(rng.dirichlet(np.ones(5), size=(rows, 1)), jnp.float32)
    drafts = jax.random.categorical(jax.random.PRNGKey(0), jnp.log(q[:, 0]))[:, None]
    args = (jax.random.PRNGKey(5), drafts, q, p, p[:, 0])
    tok = jitted(TokenVerifier())(*args, None)
    for verifier in (BlockVerifier(), SeedBlockVerifier()):
        out = jitted(verifier)(*args, verifier.init_state(rows))
        np.testing.assert_array_equal(np.asarray(tok.num_accepted), np.asarray(out.num_accepted))
        np.testing.assert_array_equal(np.asarray(tok.next_token), np.asarray(out.next_token))
        if out.state is not None:
            assert not np.any(np.asarray(out.state.live))  # G = 1 never opens a zone


def test_huge_ratios_stay_finite():
    """Drafts the drafter found very unlikely (p/q ~ 1e18 per token, rho_4 ~
    1e73, beyond float32): h and the residual follow the float64 formulas."""
    v, gamma = 3, 4
    q = np.full((1, gamma, v), 0.5, np.float32)
    q[..., 0] = 1e-18
    pi = np.tile(np.array([0.3, 0.3, 0.4], np.float32), (1, gamma, 1))
    drafts = np.zeros((1, gamma), np.int32)
    log_rho, h = jax.jit(seed_block_weights)(drafts, q, pi)
    h, log_rho = np.asarray(h, np.float64), np.asarray(log_rho)
    assert np.all(np.isfinite(h)) and np.all(np.isfinite(log_rho))
    rho = np.exp(np.cumsum(np.log(pi[0, :, 0].astype(np.float64) / q[0, :, 0])))
    for k in range(1, gamma):
        diff = rho[k - 1] * pi[0, k].astype(np.float64) - q[0, k]
        remain, rej = np.maximum(diff, 0).sum(), np.maximum(-diff, 0).sum()
        np.testing.assert_allclose(h[0, k], min(1.0, remain / rej) if rej > 0 else 1.0,
                                   rtol=1e-5)
    res = np.asarray(jax.jit(scaled_residual)(log_rho[:, 2], pi[:, 2], q[:, 2]), np.float64)
    want = np.maximum(rho[1] * pi[0, 2].astype(np.float64) - q[0, 2], 0)
    np.testing.assert_allclose(res[0] / res[0].sum(), want / want.sum(), rtol=1e-5)


ENGINE_ROWS = 40_000


@pytest.mark.long
def test_seed_block_in_the_decoding_engine():
    """The seed form's state rides the jitted engine loop (per-row masking of
    finished rows included): sequences ~ p on the engine's toy models
    (V = 4, 3 tokens, 40k rows; p-values over keys 0..5: 1.0, 0.40, 0.89,
    0.40, 0.08, 0.22)."""
    decoder = SpeculativeDecoder(target=TARGET, drafter=DRAFTER,
                                 target_fn=target_functions.SpecDecode(), gamma=3,
                                 max_new_tokens=exactness.LENGTH,
                                 verifier=SeedBlockVerifier())
    out = jax.jit(decoder.generate)(TARGET_PARAMS, DRAFTER_PARAMS,
                                    make_prompt([list(exactness.PROMPT)] * ENGINE_ROWS),
                                    jax.random.PRNGKey(0), sampling_params(temperature=1.0))
    expected = exactness.exact_sequence_probs(
        lambda c: TARGET.next_probs(TARGET_PARAMS, c))
    assert exactness.chi_square_pvalue(np.asarray(out.tokens), expected) > P_MIN
    hist = np.asarray(out.stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[3] > 0
