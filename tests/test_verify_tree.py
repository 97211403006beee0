"""Token-tree verification (docs/algorithms.md, 'Token trees'): exactness of recursive
rejection sampling and traversal verification, each over children drawn with and
without replacement (the tree says which: ``Tree.draws``), against ``p`` and two
cascade targets ``pi``, on two static trees
and an irregular one, by Monte Carlo (chi-square) and by exact enumeration;
known-wrong variants rejected by the same statistic; traversal = block
verification on chains; greedy against a brute-force reference; traversal's
expected acceptance >= RRS's.

Toy models: the drafter's and target's conditionals are rows of random tables
indexed by the *whole* prefix since the round's root (no hashing: every
context has its own laws), ``V = 4``. A round drafts a tree from the drafter
(``sample_children``), looks up ``q`` and ``pi`` at every node's context,
verifies, and emits the accepted path and the next token; the emission is
completed to ``LENGTH`` tokens by sampling from ``pi`` itself. A verifier is
exact iff these sequences follow autoregressive ``pi`` (the rest of the
generation continues from the emitted prefix with fresh rounds, so this is
the whole claim).

Statistics: a correct verifier passes each chi-square test at ``P_MIN =
1e-3``; the known-wrong variants must fall below ``P_WRONG = 1e-9`` at the
fixed seed (measured p-values in the docstrings). The exact-enumeration tests
(float64 references of the same rules, every drafted tree of a shape) pin the
laws to 1e-12 and give the exact expected acceptance, which the jitted
verifiers' Monte Carlo means must match within 4 standard errors.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax.sampling import POINT_MASS, WITH_REPLACEMENT, WITHOUT_REPLACEMENT
from specdec_jax.target_functions import get_target
from specdec_jax.verify import get_verifier
from specdec_jax.verify.block import BlockVerifier
from specdec_jax.verify.token import TokenVerifier
from specdec_jax.verify.tree import (
    ROOT,
    GreedyTreeVerifier,
    RecursiveRejectionVerifier,
    TraversalVerifier,
    Tree,
    ancestor_mask,
    chain,
    depths,
    emitted_tokens,
    node_law,
    path_nodes,
    path_tokens,
    sample_children,
    sibling_laws,
    static_tree,
    validate_tree,
)

P_MIN = 1e-3  # a correct implementation fails with probability 1e-3
P_WRONG = 1e-9  # a known-wrong variant must fall below this
MIN_EXPECTED = 5.0  # chi-square cells expected below this are pooled

V = 4
LENGTH = 4  # emitted prefix completed to 4 tokens: 256 cells
ROWS = 15_000  # per tree shape; three shapes per batch
CODE_BASE = V + 1  # context code: code * (V + 1) + token + 1, unique per prefix
TABLE = CODE_BASE ** LENGTH

# Tree shapes, all with N = 6 slots (one compilation per verifier).
SHAPES = {
    "widths-2-2": static_tree((2, 2)),  # [-1, -1, 0, 0, 1, 1]
    "widths-3-1": static_tree((3, 1)),  # [-1, -1, -1, 0, 1, 2]
    "irregular": np.array([-1, -1, -1, 0, 0, 3], np.int32),  # depth 3
}
N = 6
# Irregular rows also drop nodes per row (chosen independently of the tokens;
# only a last sibling or a whole subtree, so the kept siblings' laws are those
# they were drawn from): all nodes; no node 2; no node 5; only the 0 -> 3 -> 5 path.
IRREGULAR_MASKS = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 0],
                            [1, 0, 0, 1, 0, 1]], bool)

# Cascade targets: Chow (defer when max q < 0.6) and the token rule V3.
TARGETS = {"specdecode": 0.0, "chow": 0.4, "token-v3": 0.3}


def make_tables(seed: int = 0, mix: float = 0.35):
    """q, p float32 [TABLE, V]: p ~ Dirichlet(0.7); q = mix p + (1 - mix) noise."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.7), size=TABLE)
    noise = rng.dirichlet(np.full(V, 0.7), size=TABLE)
    q = np.maximum(mix * p + (1 - mix) * noise, 1e-4)
    return (q / q.sum(-1, keepdims=True)).astype(np.float32), p.astype(np.float32)


Q_TABLE, P_TABLE = make_tables()


@functools.lru_cache(maxsize=None)
def pi_table(target: str) -> np.ndarray:
    """pi = T(q, p) at every context, float32 [TABLE, V]."""
    fn = get_target(target)
    q, p = jnp.asarray(Q_TABLE), jnp.asarray(P_TABLE)
    pi = np.asarray(fn(q, p, q, p, jnp.float32(TARGETS[target]), jnp.float32(1.0))[0])
    assert np.allclose(pi.sum(-1), 1.0, atol=1e-5)
    return pi


def extend(codes, tokens):
    return codes * CODE_BASE + np.asarray(tokens, np.int64) + 1


def exact_law(pi: np.ndarray, length: int = LENGTH) -> np.ndarray:
    """Autoregressive pi from the root: float64 [V ** length], x_1 most significant."""
    seqs = np.array(list(itertools.product(range(V), repeat=length)))
    codes = np.zeros(len(seqs), np.int64)
    probs = np.ones(len(seqs))
    for i in range(length):
        probs *= pi[codes, seqs[:, i]].astype(np.float64)
        codes = extend(codes, seqs[:, i])
    return probs


def chi_square_pvalue(tokens_RxL: np.ndarray, expected: np.ndarray) -> float:
    length = tokens_RxL.shape[1]
    index = tokens_RxL @ (V ** np.arange(length - 1, -1, -1))
    counts = np.bincount(index, minlength=V ** length).astype(np.float64)
    want = expected / expected.sum() * len(tokens_RxL)
    small = want < MIN_EXPECTED
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        want = np.append(want[~small], want[small].sum())
    return float(stats.chisquare(counts, want).pvalue)


def sample_rows(rng, probs_RxV: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(probs_RxV.astype(np.float64), axis=-1)
    u = rng.random(len(probs_RxV)) * cdf[:, -1]
    return np.minimum((u[:, None] >= cdf).sum(-1), V - 1)


# ---------------------------------------------------------------------------
# Monte Carlo driver
# ---------------------------------------------------------------------------

children_fn = jax.jit(sample_children, static_argnums=2)


def draft(key, parents: np.ndarray, rows: int, replacement: bool):
    """Drafts ``rows`` trees of one shape; returns tokens [R, N], context codes [R, N + 1]."""
    tokens = np.zeros((rows, len(parents)), np.int64)
    codes = np.zeros((rows, len(parents) + 1), np.int64)
    for node in range(ROOT, len(parents)):
        kids = np.nonzero(parents == node)[0]
        if not len(kids):
            continue
        key, sub = jax.random.split(key)
        q_RxV = jnp.asarray(Q_TABLE[codes[:, node + 1]])
        if replacement:
            drawn = jax.random.categorical(sub, jnp.log(q_RxV), axis=-1,
                                           shape=(len(kids), rows)).T
        else:
            drawn = children_fn(sub, q_RxV, len(kids), False).tokens
        tokens[:, kids] = np.asarray(drawn)
        codes[:, kids + 1] = extend(codes[:, node + 1, None], tokens[:, kids])
    return tokens, codes


@functools.lru_cache(maxsize=None)
def jitted(verifier):
    return jax.jit(verifier.__call__)


def draft_deterministic(parents: np.ndarray, rows: int):
    """The deterministic drafter's tree of a shape (``deterministic_children``),
    the same on every row: tokens [R, N], context codes [R, N + 1]."""
    tokens = np.zeros(len(parents), np.int64)
    codes = np.zeros(len(parents) + 1, np.int64)
    for node in range(ROOT, len(parents)):
        kids = np.nonzero(parents == node)[0]
        tokens[kids] = deterministic_children(codes[node + 1], len(kids))
        codes[kids + 1] = extend(codes[node + 1], tokens[kids])
    return np.broadcast_to(tokens, (rows, len(parents))), \
        np.broadcast_to(codes, (rows, len(parents) + 1))


def deterministic_children(code: int, k: int) -> np.ndarray:
    """A Max-Gram-like drafter: ``k`` distinct tokens chosen from the context
    alone (here the k largest entries of ``Q_TABLE``'s row, reversed for odd
    contexts so that the first child is not always q's favourite)."""
    order = np.argsort(-Q_TABLE[code], kind="stable")[:k]
    return order[::-1].copy() if code % 2 else order


def run_trees(verifier, target: str, replacement: bool = False, seed: int = 0,
              shapes=tuple(SHAPES), rows: int = ROWS, deterministic: bool = False,
              label: str | None = None):
    """One round per row for each shape (all shapes in one verifier call);
    ``deterministic``: the trees of ``draft_deterministic``, verified as
    point-mass trees (``Tree.draws = POINT_MASS``); ``label``: the drawing the
    tree *states* (default: the one it was drawn with; another one is the
    known-wrong pairing of a drafter and a law it did not draw from).

    Returns {shape: (completed tokens [R, LENGTH], accepted counts [R])}.
    """
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    pi = pi_table(target)
    parents, tokens, codes, valid = [], [], [], []
    for name in shapes:
        key, sub = jax.random.split(key)
        t, c = (draft_deterministic(SHAPES[name], rows) if deterministic else
                draft(sub, SHAPES[name], rows, replacement))
        tokens.append(t)
        codes.append(c)
        parents.append(np.broadcast_to(SHAPES[name], (rows, N)))
        if name == "irregular":
            valid.append(IRREGULAR_MASKS[rng.integers(len(IRREGULAR_MASKS), size=rows)])
        else:
            valid.append(np.ones((rows, N), bool))
    parents, tokens, codes, valid = map(np.concatenate, (parents, tokens, codes, valid))
    validate_tree(parents, valid)
    tree = Tree(parents=jnp.asarray(parents, jnp.int32), tokens=jnp.asarray(tokens, jnp.int32),
                valid=jnp.asarray(valid),
                draws=label or (POINT_MASS if deterministic else
                                WITH_REPLACEMENT if replacement else WITHOUT_REPLACEMENT))
    key, sub = jax.random.split(key)
    out = jitted(verifier)(sub, tree, jnp.asarray(Q_TABLE[codes]), jnp.asarray(pi[codes]))
    emitted = np.asarray(jax.jit(emitted_tokens)(tree, out.node, out.next_token))
    count = np.asarray(out.num_accepted) + 1
    seqs = np.zeros((len(count), LENGTH), np.int64)
    ctx = np.zeros(len(count), np.int64)
    for i in range(LENGTH):
        from_round = i < count
        token = np.where(from_round, emitted[:, min(i, N)], sample_rows(rng, pi[ctx]))
        seqs[:, i] = token
        ctx = extend(ctx, token)
    accepted = np.asarray(out.num_accepted)
    return {name: (seqs[k * rows:(k + 1) * rows], accepted[k * rows:(k + 1) * rows])
            for k, name in enumerate(shapes)}


def pvalues(results, target: str):
    """(first-token p-value, LENGTH-token p-value) per shape."""
    law = exact_law(pi_table(target))
    first = law.reshape(V, -1).sum(-1)
    return {name: (chi_square_pvalue(seqs[:, :1], first), chi_square_pvalue(seqs, law))
            for name, (seqs, _) in results.items()}


# name -> (verifier, children drawn with replacement); the laws come from the tree.
VERIFIERS = {
    "rrs": (RecursiveRejectionVerifier(), False),
    "rrs-replacement": (RecursiveRejectionVerifier(), True),
    "traversal": (TraversalVerifier(), False),
    "traversal-replacement": (TraversalVerifier(), True),
}


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("name", list(VERIFIERS))
def test_tree_verifier_follows_pi(name, target):
    """First token ~ pi at the root and the emitted prefix (completed from pi)
    ~ autoregressive pi, for every shape, under p and two cascade targets.
    Measured p-values (first token / 4 tokens) are all in [0.003, 0.95]. The
    mean number of accepted drafts on the static shapes matches the exact
    expectation of ``test_exact_laws_by_enumeration`` within 4 standard errors."""
    verifier, replacement = VERIFIERS[name]
    results = run_trees(verifier, target, replacement, seed=1)
    for shape, (p_first, p_seq) in pvalues(results, target).items():
        assert p_first > P_MIN and p_seq > P_MIN, (shape, p_first, p_seq)
    reference, drawn_with_replacement, kwargs = REFERENCES[name]
    for shape in ("widths-2-2", "widths-3-1"):
        _, exact = exact_round_law(reference, shape, target, drawn_with_replacement, **kwargs)
        accepted = results[shape][1]
        stderr = accepted.std() / np.sqrt(len(accepted))
        assert abs(accepted.mean() - exact) < 4 * stderr, (shape, accepted.mean(), exact)


class RRSWithoutSiblingUpdate(RecursiveRejectionVerifier):
    """Known-wrong: the residual is not updated between siblings (every sibling
    is tested against pi itself)."""

    def sibling_residual(self, r_V, law_V):
        return r_V


def test_known_wrong_variants_fail():
    """Children drawn without replacement in a tree that says they were drawn
    with it (verified with q_j = q, the pairing the API once accepted):
    first-token p-value 6e-13, 4-token 1e-23 on widths (2, 2) at 15k rows.
    Residual not updated between siblings: 2e-136 / 1e-149 on widths (3, 1)."""
    law = exact_law(pi_table("specdecode"))
    first = law.reshape(V, -1).sum(-1)
    wrong_q = run_trees(RecursiveRejectionVerifier(), "specdecode", replacement=False, seed=2,
                        label=WITH_REPLACEMENT)
    seqs, _ = wrong_q["widths-2-2"]
    assert chi_square_pvalue(seqs[:, :1], first) < P_WRONG
    assert chi_square_pvalue(seqs, law) < P_WRONG
    no_update = run_trees(RRSWithoutSiblingUpdate(), "specdecode", seed=3)
    seqs, _ = no_update["widths-3-1"]
    assert chi_square_pvalue(seqs[:, :1], first) < P_WRONG
    assert chi_square_pvalue(seqs, law) < P_WRONG


# ---------------------------------------------------------------------------
# Exact enumeration: float64 references of the rules, every drafted tree
# ---------------------------------------------------------------------------

def float64_laws(probs):
    probs = probs.astype(np.float64)
    return probs / probs.sum(-1, keepdims=True)


Q64 = float64_laws(Q_TABLE)


def _positive(x):
    return np.maximum(x, 0.0)


def _law_of_child(q, removed, replacement, point_mass=None):
    if point_mass is not None:  # a deterministic child: the point mass on its token
        return np.eye(V)[point_mass]
    if replacement:
        return q
    kept = np.where(removed, 0.0, q)
    return kept / kept.sum()


def reference_rrs(kids, tokens, codes, pi, replacement=False, update=True, point_mass=False):
    """{node: (probability the round ends there, law of the next token)} for one tree.

    ``replacement``: the laws the verifier assumes; the known-wrong variants
    assume q_j = q on trees drawn without replacement, or skip the update.
    """
    out = {}

    def visit(node, mass):
        r = pi[codes[node + 1]]
        q = Q64[codes[node + 1]]
        removed = np.zeros(V, bool)
        for child in kids[node]:
            x = tokens[child]
            law = _law_of_child(q, removed, replacement, x if point_mass else None)
            accept = min(1.0, r[x] / law[x]) if law[x] > 0 else 0.0
            if accept > 0:
                visit(child, mass * accept)
            mass *= 1.0 - accept
            if update:
                res = _positive(r - law)
                r = res / res.sum() if res.sum() > 1e-15 else r
            removed[x] = True
        out[node] = (mass, r)

    visit(ROOT, 1.0)
    return out


def reference_traversal(kids, tokens, codes, pi, replacement=False, point_mass=False):
    """Traversal verification on one tree, as ``reference_rrs``: post-order,
    each node accepted w.p. its alpha once its children are all rejected."""
    out = {}

    def visit(node, alpha, mass):
        p = pi[codes[node + 1]]
        q = Q64[codes[node + 1]]
        removed = np.zeros(V, bool)
        reach = 1.0  # every earlier child's subtree rejected
        for child in kids[node]:
            x = tokens[child]
            law = _law_of_child(q, removed, replacement, x if point_mass else None)
            alpha_child = min(1.0, alpha * p[x] / law[x]) if law[x] > 0 else 0.0
            reach *= 1.0 - visit(child, alpha_child, mass * reach)
            diff = alpha * p - law
            s = _positive(diff).sum()
            p = _positive(diff) / s if s > 1e-15 else p
            alpha = s / (s + 1.0 - alpha) if s + 1.0 - alpha > 0 else 1.0
            removed[x] = True
        accept = 1.0 if node == ROOT else alpha
        out[node] = (mass * reach * accept, p)
        return 1.0 - reach + reach * accept

    visit(ROOT, 1.0, 1.0)
    return out


def enumerate_trees(parents, replacement):
    """Every drafted tree of a shape: (tokens [N], context codes [N + 1], probability)."""
    n = len(parents)
    kids = {node: [int(i) for i in np.nonzero(parents == node)[0]] for node in range(ROOT, n)}
    internal = [node for node in range(ROOT, n) if kids[node]]
    tokens = np.zeros(n, np.int64)
    codes = np.zeros(n + 1, np.int64)

    def rec(k, prob):
        if k == len(internal):
            yield tokens.copy(), codes.copy(), prob
            return
        node = internal[k]
        q = Q64[codes[node + 1]]
        k_kids = len(kids[node])
        draws = itertools.product(range(V), repeat=k_kids) if replacement else \
            itertools.permutations(range(V), k_kids)
        for tup in draws:
            pr, left = 1.0, 1.0
            for x in tup:
                pr *= q[x] / (1.0 if replacement else left)
                left -= q[x]
            for child, x in zip(kids[node], tup):
                tokens[child] = x
                codes[child + 1] = extend(codes[node + 1], x)
            yield from rec(k + 1, prob * pr)

    return kids, list(rec(0, 1.0))


def exact_round_law(reference, shape: str, target: str, drawn_with_replacement: bool,
                    **kwargs):
    """The law of the emitted prefix completed from pi ([V ** LENGTH]) and the
    expected number of accepted drafts, over every drafted tree of ``shape``
    (``point_mass=True``: the one tree of ``draft_deterministic``)."""
    parents = SHAPES[shape]
    pi = float64_laws(pi_table(target))
    if kwargs.get("point_mass"):
        kids = {node: [int(i) for i in np.nonzero(parents == node)[0]]
                for node in range(ROOT, len(parents))}
        tokens, codes = draft_deterministic(parents, 1)
        trees = [(tokens[0], codes[0], 1.0)]
    else:
        kids, trees = enumerate_trees(parents, drawn_with_replacement)
    depth = {ROOT: 0}
    for node in range(N):
        depth[node] = depth[int(parents[node])] + 1
    prefix_mass = {}
    expected_accepted = 0.0
    for tokens, codes, prob in trees:
        for node, (mass, law) in reference(kids, tokens, codes, pi, **kwargs).items():
            path, at = [], node
            while at != ROOT:
                path.insert(0, int(tokens[at]))
                at = int(parents[at])
            expected_accepted += prob * mass * depth[node]
            for y in range(V):
                key = tuple((path + [y])[:LENGTH])
                prefix_mass[key] = prefix_mass.get(key, 0.0) + prob * mass * law[y]
    seqs = np.array(list(itertools.product(range(V), repeat=LENGTH)))
    law = np.zeros(len(seqs))
    for s, seq in enumerate(seqs):
        ctx, tail = 0, 1.0
        # sum over emitted prefixes of length k: mass * pi of the completion
        cond = []
        for i in range(LENGTH):
            cond.append(float(pi[ctx, seq[i]]))
            ctx = extend(ctx, seq[i])
        for k in range(LENGTH, 0, -1):
            law[s] += prefix_mass.get(tuple(int(t) for t in seq[:k]), 0.0) * tail
            tail *= cond[k - 1]
    return law, expected_accepted


REFERENCES = {
    "rrs": (reference_rrs, False, {}),
    "rrs-replacement": (reference_rrs, True, {"replacement": True}),
    "traversal": (reference_traversal, False, {}),
    "traversal-replacement": (reference_traversal, True, {"replacement": True}),
}


@pytest.mark.parametrize("target", ["specdecode", "token-v3"])
def test_exact_laws_by_enumeration(target):
    """Every drafted tree of every shape (the irregular one with all 6 nodes):
    the references of RRS and traversal, each over both drawings, emit
    autoregressive pi to float64 precision (measured total variation below
    5e-16), the known-wrong variants do not (TV 0.054 / 0.102 under p, 0.013 /
    0.062 under token-v3). Exact E[accepted drafts] under p on widths (2, 2),
    (3, 1), irregular: traversal 1.8127 / 1.6118 / 2.1769, RRS without
    replacement 1.7692 / 1.5545 / 2.0625; with replacement traversal 1.7308 /
    1.5779 / 2.0944, RRS 1.6743 / 1.5331 / 1.9693 (token-v3: 1.7553 / 1.6964 /
    2.0216, 1.7364 / 1.6175 / 1.9063; 1.5616 / 1.5504 / 1.8695, 1.5198 /
    1.4740 / 1.7314): traversal gains 2.5%, 3.7%, 5.5% over RRS under p
    without replacement, 3.4%, 2.9%, 6.4% with it."""
    want = exact_law(float64_laws(pi_table(target)))
    for shape in SHAPES:
        accepted = {}
        for name, (reference, replacement, kwargs) in REFERENCES.items():
            law, accepted[name] = exact_round_law(reference, shape, target, replacement,
                                                  **kwargs)
            assert 0.5 * np.abs(law - want).sum() < 1e-12, (name, shape)
        assert accepted["traversal"] >= accepted["rrs"] - 1e-12, (shape, accepted)
        assert accepted["rrs"] >= accepted["rrs-replacement"] - 1e-12, (shape, accepted)
        assert accepted["traversal-replacement"] >= accepted["rrs-replacement"] - 1e-12, \
            (shape, accepted)
    wrong_q, _ = exact_round_law(reference_rrs, "widths-2-2", target, False, replacement=True)
    no_update, _ = exact_round_law(reference_rrs, "widths-3-1", target, False, update=False)
    assert 0.5 * np.abs(wrong_q - want).sum() > 1e-3
    assert 0.5 * np.abs(no_update - want).sum() > 1e-3


@pytest.mark.parametrize("target", ["specdecode", "token-v3"])
def test_point_mass_trees_are_exact(target):
    """Deterministic children (Max-Gram trees: ``Tree.draws = POINT_MASS``) verified
    with each node's point mass at T = 1: RRS and traversal emit
    autoregressive pi, by enumeration (float64, TV < 1e-12) and by chi-square
    on 15k rounds per shape; later siblings are accepted (the old one-hot law
    of the first child never accepted them). Dropping the residual update
    between siblings is wrong: TV 0.21 by enumeration on widths (3, 1) under
    p (measured), and its chi-square p-values must fall below 1e-9.
    Measured at these seeds (first token / 4 tokens, per shape): all in
    [0.096, 0.997] for both verifiers under both targets; the wrong variant
    gives 0.0 / 0.0 (below float64's smallest: the test fails it)."""
    want = exact_law(float64_laws(pi_table(target)))
    for shape in SHAPES:
        for reference in (reference_rrs, reference_traversal):
            law, _ = exact_round_law(reference, shape, target, False, point_mass=True)
            assert 0.5 * np.abs(law - want).sum() < 1e-12, (reference.__name__, shape)
    for verifier in (RecursiveRejectionVerifier(), TraversalVerifier()):
        results = run_trees(verifier, target, seed=5, deterministic=True)
        for shape, (p_first, p_seq) in pvalues(results, target).items():
            assert p_first > P_MIN and p_seq > P_MIN, (verifier.name, shape, p_first, p_seq)
        seqs, accepted = results["widths-3-1"]
        second = int(draft_deterministic(SHAPES["widths-3-1"], 1)[0][0, 1])
        # The second root child is accepted as a draft (pi(second) is 0.22 / 0.14 here).
        assert np.mean((seqs[:, 0] == second) & (accepted >= 1)) > 0.05
    if target == "specdecode":
        wrong, _ = exact_round_law(reference_rrs, "widths-3-1", target, False,
                                   point_mass=True, update=False)
        assert 0.5 * np.abs(wrong - want).sum() > 1e-2
        seqs, _ = run_trees(RRSWithoutSiblingUpdate(), target, seed=6,
                            deterministic=True)["widths-3-1"]
        law = exact_law(pi_table(target))
        assert chi_square_pvalue(seqs[:, :1], law.reshape(V, -1).sum(-1)) < P_WRONG
        assert chi_square_pvalue(seqs, law) < P_WRONG


def test_point_mass_sibling_laws():
    tree = Tree(parents=jnp.asarray([[-1, -1, 0]]), tokens=jnp.asarray([[1, 0, 3]]),
                valid=jnp.asarray([[True, True, False]]), draws=POINT_MASS)
    q = jnp.full((1, 4, V), 0.25)
    law = np.asarray(sibling_laws(tree, q))
    np.testing.assert_array_equal(law[0], [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    # The one-hot of the first child read as every sibling's law: never the second.
    one_hot = jnp.zeros((1, 4, V)).at[0, 0, 1].set(1.0)
    assert float(sibling_laws(tree.replace(draws=WITHOUT_REPLACEMENT),
                              one_hot)[0, 1].sum()) == 0
    with pytest.raises(ValueError, match="unknown tree drawing"):
        tree.replace(draws="sometimes")


def reference_node_laws(parents, tokens, valid, q_N1xV, draws):
    """The law each node was drawn from, by the definition, one node at a time."""
    laws = []
    for i, (parent, token) in enumerate(zip(parents, tokens)):
        if draws == POINT_MASS:
            laws.append(np.eye(q_N1xV.shape[-1])[token] * valid[i])
            continue
        law = np.array(q_N1xV[parent + 1], np.float64)
        if draws == WITHOUT_REPLACEMENT:
            for j in range(i):
                if parents[j] == parent and valid[j]:
                    law[tokens[j]] = 0.0
            law = law / law.sum() if law.sum() > 0 else law
        laws.append(law)
    return np.stack(laws)


def test_sibling_laws_worked_example():
    """q = [0.5, 0.3, 0.2], root children drawn 1 then 0: [0.5, 0.3, 0.2], [5/7, 0, 2/7]."""
    tree = Tree(parents=jnp.asarray([[-1, -1]]), tokens=jnp.asarray([[1, 0]]),
                valid=jnp.asarray([[True, True]]))
    q = jnp.asarray([[[0.5, 0.3, 0.2], [1 / 3] * 3, [1 / 3] * 3]])
    np.testing.assert_allclose(np.asarray(sibling_laws(tree, q))[0],
                               [[0.5, 0.3, 0.2], [5 / 7, 0, 2 / 7]], rtol=1e-6)


@pytest.mark.parametrize("draws", [WITHOUT_REPLACEMENT, WITH_REPLACEMENT, POINT_MASS])
def test_node_laws_follow_the_drawing(draws):
    """``node_law`` (one row's node, made when a walk tests it) and
    ``sibling_laws`` (all nodes) against the definition computed node by node:
    siblings removed and renormalised, a repeated token, an invalid slot, a
    sibling whose parent's law has no mass left after removals."""
    parents, tokens = [-1, -1, -1, 0, 0, 1], [2, 0, 2, 1, 3, 0]
    valid = [True, True, True, True, False, True]
    tree = Tree(parents=jnp.asarray([parents]), tokens=jnp.asarray([tokens]),
                valid=jnp.asarray([valid]), draws=draws)
    q = jax.random.dirichlet(jax.random.PRNGKey(0), jnp.ones(V), (1, 7))
    q = q.at[0, 2].set(jnp.asarray([0.0, 0.0, 1.0, 0.0]))  # node 1's law: only token 2
    want = reference_node_laws(parents, tokens, valid, np.asarray(q[0]), draws)
    row = jax.tree_util.tree_map(lambda x: x[0], tree)
    for i in range(tree.num_nodes):
        np.testing.assert_allclose(np.asarray(node_law(row, q[0], i)), want[i], rtol=1e-6,
                                   atol=1e-7, err_msg=f"node {i}")
    np.testing.assert_allclose(np.asarray(sibling_laws(tree, q))[0], want, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------
# Chains: traversal = block verification, RRS = token verification
# ---------------------------------------------------------------------------

def random_chain(seed: int, rows: int = 3 * ROWS, g: int = N, v: int = V):
    """Drafts from q, laws q and pi (a cascade mixture of p and q) per position.
    (The Monte Carlo tests' shapes, so the tree verifiers are compiled once.)"""
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(v, 0.7), size=(rows, g + 1)).astype(np.float32)
    p = rng.dirichlet(np.full(v, 0.7), size=(rows, g + 1)).astype(np.float32)
    defer = (rng.random((rows, g + 1, 1)) < 0.5).astype(np.float32)
    pi = defer * p + (1 - defer) * q
    drafts = np.stack([sample_rows(rng, q[:, j]) for j in range(g)], 1).astype(np.int32)
    return jnp.asarray(drafts), jnp.asarray(q), jnp.asarray(pi)


def test_traversal_equals_block_verification_on_chains():
    """On a chain, traversal draws the block verifier's uniforms and sampling
    key, so with one key both accept the same drafts and emit the same token
    on every row (hence the same law and the same acceptance); also for
    ragged chains (a row offering fewer drafts)."""
    drafts, q, pi = random_chain(0)
    key = jax.random.PRNGKey(7)
    g = drafts.shape[1]
    block = jitted(BlockVerifier())(key, drafts, q[:, :g], pi[:, :g], pi[:, g])
    tree = jitted(TraversalVerifier())(key, chain(drafts), q, pi)
    np.testing.assert_array_equal(tree.num_accepted, block.num_accepted)
    np.testing.assert_array_equal(tree.next_token, block.next_token)
    np.testing.assert_array_equal(tree.node, np.asarray(block.num_accepted) - 1)
    tau = np.asarray(block.num_accepted)
    assert np.mean(tau == 0) > 0.1 and np.mean((tau > 0) & (tau < g)) > 0.1  # rejections occur

    count = jnp.asarray(np.random.default_rng(1).integers(0, g + 1, size=drafts.shape[0]))
    bonus = jnp.take_along_axis(pi, count[:, None, None], axis=1)[:, 0]
    block = jitted(BlockVerifier())(key, drafts, q[:, :g], pi[:, :g], bonus, count_B=count)
    ragged = chain(drafts).replace(valid=jnp.arange(g)[None, :] < count[:, None])
    tree = jitted(TraversalVerifier())(key, ragged, q, pi)
    np.testing.assert_array_equal(tree.num_accepted, block.num_accepted)
    np.testing.assert_array_equal(tree.next_token, block.next_token)


def test_traversal_keeps_one_law_per_depth_of_its_path():
    """Traversal keeps one P per depth of the walk's path: a stack sized by
    ``Tree.max_depth`` (the drafter's tree depth, 3 here) decides every row as
    one sized by the node count: the same accepted node and next token for one
    key, on a 15-node tree with rejections at every depth. (That the walk
    follows pi is ``test_tree_verifier_follows_pi``'s chi-square.)"""
    rng = np.random.default_rng(3)
    rows, v = 400, 6
    parents = np.asarray(static_tree((3, 2, 1)))
    n = len(parents)
    q = rng.dirichlet(np.full(v, 0.5), size=(rows, n + 1)).astype(np.float32)
    pi = rng.dirichlet(np.full(v, 0.5), size=(rows, n + 1)).astype(np.float32)
    tree = Tree(parents=jnp.broadcast_to(jnp.asarray(parents, jnp.int32), (rows, n)),
                tokens=jnp.asarray(rng.integers(0, v, size=(rows, n)), jnp.int32),
                valid=jnp.ones((rows, n), bool), draws=WITH_REPLACEMENT)
    key = jax.random.PRNGKey(4)
    per_node = jitted(TraversalVerifier())(key, tree, jnp.asarray(q), jnp.asarray(pi))
    per_depth = jitted(TraversalVerifier())(key, tree.replace(max_depth=3), jnp.asarray(q),
                                            jnp.asarray(pi))
    np.testing.assert_array_equal(per_depth.node, per_node.node)
    np.testing.assert_array_equal(per_depth.next_token, per_node.next_token)
    assert set(np.asarray(per_node.num_accepted).tolist()) == {0, 1, 2, 3}


def test_rrs_equals_token_verification_on_chains():
    """With one child per node, recursive rejection sampling (either drawing)
    is token verification, draw for draw."""
    drafts, q, pi = random_chain(2)
    key = jax.random.PRNGKey(8)
    g = drafts.shape[1]
    token = jitted(TokenVerifier())(key, drafts, q[:, :g], pi[:, :g], pi[:, g])
    verifier = RecursiveRejectionVerifier()
    for draws in (WITHOUT_REPLACEMENT, WITH_REPLACEMENT):
        tree = jitted(verifier)(key, chain(drafts).replace(draws=draws), q, pi)
        np.testing.assert_array_equal(tree.num_accepted, token.num_accepted)
        np.testing.assert_array_equal(tree.next_token, token.next_token)


# ---------------------------------------------------------------------------
# Greedy
# ---------------------------------------------------------------------------

def random_layouts(rng, rows: int, n: int):
    """Random parents in topological order and valid masks closed under parents."""
    parents = np.full((rows, n), ROOT, np.int32)
    valid = np.ones((rows, n), bool)
    for i in range(1, n):
        parents[:, i] = rng.integers(ROOT, i, size=rows)
    for i in range(n):
        has_parent = parents[:, i] >= 0
        parent_valid = valid[np.arange(rows), np.maximum(parents[:, i], 0)]
        valid[:, i] = (rng.random(rows) < 0.85) & (~has_parent | parent_valid)
    return parents, valid


def greedy_reference(parents, tokens, valid, best):
    """Brute force: the deepest valid node whose path matches argmax pi at every
    parent (lowest index among ties), then argmax pi after it."""
    node_best, depth_best = ROOT, 0
    for i in range(len(parents)):
        if not valid[i]:
            continue
        path, at = [], i
        while at != ROOT:
            path.append(at)
            at = int(parents[at])
        if all(tokens[j] == best[parents[j] + 1] for j in path) and len(path) > depth_best:
            node_best, depth_best = i, len(path)
    return node_best, depth_best, int(best[node_best + 1])


def test_greedy_matches_brute_force():
    """Random layouts with repeated sibling tokens and ties broken to the lowest index."""
    rng = np.random.default_rng(4)
    rows, n, v = 500, 7, 3
    parents, valid = random_layouts(rng, rows, n)
    validate_tree(parents, valid)
    pi = rng.dirichlet(np.ones(v), size=(rows, n + 1)).astype(np.float32)
    best = pi.argmax(-1)
    # Make most nodes match so that deep paths occur.
    tokens = np.where(rng.random((rows, n)) < 0.7,
                      np.take_along_axis(best, parents + 1, axis=1),
                      rng.integers(0, v, size=(rows, n))).astype(np.int32)
    tree = Tree(parents=jnp.asarray(parents), tokens=jnp.asarray(tokens), valid=jnp.asarray(valid))
    out = jitted(GreedyTreeVerifier())(jax.random.PRNGKey(0), tree, jnp.asarray(pi),
                                       jnp.asarray(pi))
    want = np.array([greedy_reference(parents[b], tokens[b], valid[b], best[b])
                     for b in range(rows)])
    np.testing.assert_array_equal(out.node, want[:, 0])
    np.testing.assert_array_equal(out.num_accepted, want[:, 1])
    np.testing.assert_array_equal(out.next_token, want[:, 2])
    assert want[:, 1].max() >= 3


# ---------------------------------------------------------------------------
# Drafting children and tree helpers
# ---------------------------------------------------------------------------

def test_sample_children_without_replacement():
    """Gumbel-top-k: (c_1, c_2) ~ q(a) q(b) / (1 - q(a)) (chi-square over the 12
    ordered pairs, p-value 0.18); the reported laws are the sequential laws
    (equal to ``sibling_laws`` of the drafted tree); the third child of a law
    with two tokens is invalid; T = 0 gives the top-k in order, one-hot laws."""
    q = np.array([0.5, 0.3, 0.15, 0.05], np.float32)
    rows = ROWS  # the drafting driver's shape: no new compilation
    kids = children_fn(jax.random.PRNGKey(5), jnp.broadcast_to(jnp.asarray(q), (rows, 4)), 2,
                       False)
    pairs = np.asarray(kids.tokens)
    assert np.all(pairs[:, 0] != pairs[:, 1]) and np.all(kids.valid)
    want = np.zeros(16)
    for a, b in itertools.permutations(range(4), 2):
        want[a * 4 + b] = q[a] * q[b] / (1 - q[a])
    counts = np.bincount(pairs[:, 0] * 4 + pairs[:, 1], minlength=16)
    cells = want > 0
    expected = want[cells] / want[cells].sum() * rows
    assert stats.chisquare(counts[cells], expected).pvalue > P_MIN
    tree = Tree(parents=jnp.full((rows, 2), ROOT, jnp.int32), tokens=kids.tokens,
                valid=jnp.ones((rows, 2), bool))
    laws = jax.jit(sibling_laws)(tree, jnp.broadcast_to(jnp.asarray(q), (rows, 3, 4)))
    np.testing.assert_allclose(kids.laws, laws, atol=1e-6)

    two = jnp.asarray([0.6, 0.0, 0.4, 0.0])
    drawn = children_fn(jax.random.PRNGKey(6), two, 3, False)
    assert list(np.asarray(drawn.valid)) == [True, True, False]
    greedy = children_fn(jax.random.PRNGKey(6), jnp.asarray(q), 3, True)
    assert list(np.asarray(greedy.tokens)) == [0, 1, 2]
    np.testing.assert_array_equal(greedy.laws, np.eye(4)[:3])


def test_tree_helpers():
    """parents [-1, 0, 0, 2, -1], tokens [5, 6, 7, 8, 9], node 4 invalid."""
    tree = Tree(parents=jnp.asarray([[-1, 0, 0, 2, -1]]), tokens=jnp.asarray([[5, 6, 7, 8, 9]]),
                valid=jnp.asarray([[True, True, True, True, False]]))

    @jax.jit
    def helpers(tree, node, next_token):
        return (ancestor_mask(tree), depths(tree), path_nodes(tree, node),
                path_tokens(tree, node), emitted_tokens(tree, node, next_token))

    anc, depth, nodes, tokens, emitted = helpers(tree, jnp.asarray([3]), jnp.asarray([1]))
    np.testing.assert_array_equal(np.asarray(anc)[0].astype(int),
                                  [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                                   [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(depth, [[1, 2, 2, 3, 0]])
    np.testing.assert_array_equal(nodes, [[0, 2, 3, -1, -1]])
    np.testing.assert_array_equal(tokens, [[5, 7, 8, 0, 0]])
    np.testing.assert_array_equal(emitted, [[5, 7, 8, 1, 0, 0]])
    *_, emitted = helpers(tree, jnp.asarray([ROOT]), jnp.asarray([1]))
    np.testing.assert_array_equal(emitted, [[1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(static_tree((2, 2)), [-1, -1, 0, 0, 1, 1])
    long_chain = chain(jnp.zeros((1, 9), jnp.int32))
    np.testing.assert_array_equal(jax.jit(depths)(long_chain), [np.arange(1, 10)])
    with pytest.raises(ValueError, match="topological"):
        validate_tree([[-1, 2, 0]])
    with pytest.raises(ValueError, match="invalid parent"):
        validate_tree([[-1, 0]], [[False, True]])
    assert get_verifier("traversal", tree=True) == TraversalVerifier()
    with pytest.raises(ValueError, match="unknown tree verifier"):
        get_verifier("beam", tree=True)


def test_sparse_laws_stay_in_support():
    """Top-k-like laws (zeros in q and pi, supports that barely overlap) and
    children beyond q's support marked invalid: every sampling verifier keeps
    only drafts pi allows, emits a token pi allows at the accepted context, and
    never produces NaN. (The Monte Carlo tests' shapes: no new compilation.)"""
    rng = np.random.default_rng(9)
    rows, parents = 3 * ROWS, SHAPES["widths-3-1"]

    def sparse(size):
        probs = rng.dirichlet(np.full(V, 0.5), size=size)
        probs[rng.random(probs.shape) < 0.5] = 0.0
        probs[np.arange(size), rng.integers(0, V, size)] += 0.1
        return (probs / probs.sum(-1, keepdims=True)).astype(np.float32)

    q = sparse(rows * (N + 1)).reshape(rows, N + 1, V)
    pi = sparse(rows * (N + 1)).reshape(rows, N + 1, V)
    tokens = np.zeros((rows, N), np.int64)
    valid = np.zeros((rows, N), bool)
    for node in range(ROOT, N):
        kids = np.nonzero(parents == node)[0]
        if len(kids):  # Gumbel-top-k without replacement, as sample_children
            q_RxV = q[:, node + 1]
            scores = np.where(q_RxV > 0, np.log(np.maximum(q_RxV, 1e-38)), -np.inf)
            scores = scores + rng.gumbel(size=scores.shape)
            drawn = np.argsort(-scores, axis=1)[:, :len(kids)]
            parent_ok = valid[:, node] if node >= 0 else np.ones(rows, bool)
            tokens[:, kids] = drawn
            valid[:, kids] = (np.take_along_axis(q_RxV, drawn, 1) > 0) & parent_ok[:, None]
    validate_tree(np.broadcast_to(parents, (rows, N)), valid)
    tree = Tree(parents=jnp.broadcast_to(jnp.asarray(parents), (rows, N)),
                tokens=jnp.asarray(tokens, jnp.int32), valid=jnp.asarray(valid))
    # Does pi at each node's parent context allow the node's token?
    allowed_RxN = pi[np.arange(rows)[:, None], parents[None, :] + 1, tokens] > 0
    assert np.mean(valid) < 0.95 and np.mean(~allowed_RxN & valid) > 0.1
    for name, (verifier, _) in VERIFIERS.items():
        out = jitted(verifier)(jax.random.PRNGKey(11), tree, jnp.asarray(q), jnp.asarray(pi))
        node, nxt = np.asarray(out.node), np.asarray(out.next_token)
        on_path_RxN = np.asarray(jax.jit(ancestor_mask)(tree))[np.arange(rows),
                                                                 np.maximum(node, 0)]
        on_path_RxN &= (node >= 0)[:, None]
        assert not np.any(on_path_RxN & ~(valid & allowed_RxN)), name
        assert np.all(pi[np.arange(rows), node + 1, nxt] > 0), name
