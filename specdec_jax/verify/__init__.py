"""The verifiers: one module each, and here the one table of their names.

- ``verify.token``: token-by-token rejection sampling with any target law ``pi``;
- ``verify.block``: block verification (Sun et al.), stateless and seed forms;
- ``verify.tree``: token trees (recursive rejection sampling, traversal, greedy).

Every verifier a decoder takes, by name: one registry for chains and token trees.

Chains (a block of G drafts a round):

- ``token`` (the default): token-by-token rejection sampling (``verify.token.TokenVerifier``);
- ``block``: the stateless optimal block verifier (``verify.block.BlockVerifier``);
- ``block-seed``: the published block verifier with its carried state
  (``verify.block.SeedBlockVerifier``).

Token trees (``tree=...``; ``verify.tree``):

- ``traversal`` (the default: it accepts the most, +4.3% over RRS on the 0.5B's
  trees): traversal verification, the tree form of ``block``;
- ``rrs``: recursive rejection sampling, the tree form of ``token``;
- ``rrs-replacement``: RRS over children drawn *with* replacement (SpecInfer's
  trees): the name asks the drafter to draw so (``requested_draws``);
- ``greedy``: the target's argmax path at any temperature, for T = 0 only
  (where every tree verifier verifies greedily anyway).

A chain's name given for a tree names its tree form, so ``verifier="token"``
means the same rule whether the round drafts a chain or a tree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from specdec_jax.sampling import WITH_REPLACEMENT
from specdec_jax.verify.block import BlockVerifier, SeedBlockVerifier
from specdec_jax.verify.token import TokenVerifier
from specdec_jax.verify.tree import (
    GreedyTreeVerifier,
    RecursiveRejectionVerifier,
    TraversalVerifier,
)

# name -> a constructor of the strategy (frozen dataclasses: hashable, static).
CHAIN_BY_NAME: dict[str, Callable[[], Any]] = {
    "token": TokenVerifier, "block": BlockVerifier, "block-seed": SeedBlockVerifier}
TREE_BY_NAME: dict[str, Callable[[], Any]] = {
    "traversal": TraversalVerifier, "rrs": RecursiveRejectionVerifier,
    "rrs-replacement": functools.partial(RecursiveRejectionVerifier, name="rrs-replacement"),
    "greedy": GreedyTreeVerifier}
# The built-in names (``register`` adds to the tables, not to these).
VERIFIERS = tuple(CHAIN_BY_NAME)  # chains; the default first
TREE_VERIFIERS = tuple(TREE_BY_NAME)  # trees; the default first
ALL_VERIFIERS = VERIFIERS + tuple(v for v in TREE_VERIFIERS if v not in VERIFIERS)
DEFAULT_TREE_VERIFIER = TREE_VERIFIERS[0]
# A chain verifier's name, given for a tree: its tree form.
TREE_FORMS = {"token": "rrs", "block": "traversal"}
_REQUESTED_DRAWS = {"rrs-replacement": WITH_REPLACEMENT}


def register(name: str, make: Callable[[], Any], *, tree: bool = False) -> None:
    """Adds a verifier to the table: ``make()`` builds the strategy (a frozen
    dataclass whose ``__call__`` takes what the built-in verifiers of its kind
    take), for chains or, with ``tree``, for token trees. From then on
    ``get_verifier(name)``, and so ``make_decoder``, ``make_generate_fn`` and
    ``generate``, take ``verifier=name``. Registering the same constructor
    again changes nothing; another one under a taken name is refused."""
    taken = CHAIN_BY_NAME.get(name, TREE_BY_NAME.get(name))
    if taken is make:
        return
    if taken is not None:
        raise ValueError(f"verifier name {name!r} is taken by {taken}; pick another name.")
    (TREE_BY_NAME if tree else CHAIN_BY_NAME)[name] = make


def get_verifier(name: str | None = None, *, tree: bool = False) -> Any:
    """The verifier strategy ``name`` gives for a chain, or with ``tree`` for a
    token tree; None is the default of each (``token``, ``traversal``)."""
    if not tree:
        name = VERIFIERS[0] if name is None else name
        if name in CHAIN_BY_NAME:
            return CHAIN_BY_NAME[name]()
        if name in TREE_BY_NAME:
            raise ValueError(f"verifier {name!r} verifies token trees; pass tree=... (e.g. "
                             f"(3, 2, 1, 1)) or a chain verifier: {', '.join(VERIFIERS)}.")
        raise ValueError(f"unknown verifier {name!r}; choose one of "
                         f"{', '.join(ALL_VERIFIERS)}.")
    name = DEFAULT_TREE_VERIFIER if name is None else TREE_FORMS.get(name, name)
    if name == "block-seed":
        raise ValueError("the 'block-seed' verifier carries state between chain rounds and has "
                         "no tree form; use 'traversal' (the tree form of 'block') or 'rrs'.")
    if name not in TREE_BY_NAME:
        raise ValueError(f"unknown tree verifier {name!r}; choose one of "
                         f"{', '.join(TREE_VERIFIERS)} (or token = rrs, block = traversal).")
    return TREE_BY_NAME[name]()


def requested_draws(verifier) -> str | None:
    """How a verifier (or its name) asks the drafter to draw a tree's
    children, or None (the drafter's own way: every sampling verifier reads
    the laws from the tree). Only 'rrs-replacement' asks: with replacement."""
    return _REQUESTED_DRAWS.get(getattr(verifier, "name", verifier))
