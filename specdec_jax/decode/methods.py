"""The one table of methods: a name -> the kind of decoder its rounds run, the
target function they apply, and the range of its ``alpha``.

Kinds (``Method.kind``), one round structure each:

- ``autoregressive``: the target alone, a token a step (``decode.autoregressive``);
- ``chain``: draft ``G``, score ``G + 1``, verify a block with ``pi = T(q, p)``
  (``decode.chain``); a chain method may draft a token tree instead
  (``tree=``: ``decode.tree``), verified by the tree form of its verifier;
- ``oracle``: a ``G = 0`` round with the Diff rule, both models at every position;
- ``draft-until``: the drafter runs until a rule calls the target
  (``decode.cascade_baselines``).

Every method of the papers is a row: speculative decoding and its lossy
relaxations, every deferral rule of the speculative cascades (each a target
function of ``target_functions``), and the cascade baselines. The sequence-level
cascade is not a decoder (it combines two autoregressive runs, ``decode.
cascade_baselines.sequence_cascade``) and has no row. ``api.decoder_spec``
checks a request against this table; the CLI and the gin jobs call it.
"""

from __future__ import annotations

import dataclasses

from specdec_jax import target_functions
from specdec_jax.target_functions import TargetFunction

AUTOREGRESSIVE = "autoregressive"
CHAIN = "chain"
TREE = "tree"  # a chain method drafting a token tree (a request's kind, not a method's)
ORACLE = "oracle"
DRAFT_UNTIL = "draft-until"


@dataclasses.dataclass(frozen=True)
class Method:
    """One method: ``kind`` (how its rounds run), ``target_fn`` (the ``pi``
    they verify or draw from; None for the target alone) and ``alpha_range``
    (None: it takes no alpha; a target function may check more, e.g. Lossy's
    ``beta``)."""

    name: str
    kind: str
    target_fn: TargetFunction | None = None
    alpha_range: tuple[float, float] | None = None

    @property
    def drafts(self) -> bool:
        """Whether it runs a drafter (every kind but the target alone)."""
        return self.kind != AUTOREGRESSIVE

    @property
    def verifies_block(self) -> bool:
        """Whether its rounds verify a drafted block (so it takes a verifier,
        and may draft a tree)."""
        return self.kind == CHAIN

    @property
    def defers(self) -> bool:
        """Whether it hands positions to the target by a deferral rule, so its
        deferred mass is a statistic worth reporting (speculative and lossy
        decoding, and the target alone, defer nothing)."""
        return self.kind in (ORACLE, DRAFT_UNTIL) or isinstance(
            self.target_fn, (target_functions.DeferralRule, target_functions.TokenRule))

    def check_alpha(self, alpha: float, beta: float = 1.0) -> None:
        """Refuses an ``alpha`` (or ``beta``) outside the method's range."""
        if self.kind == CHAIN:
            self.target_fn.validate(alpha, beta)
        elif self.alpha_range is not None:
            low, high = self.alpha_range
            if not low <= alpha <= high:
                raise ValueError(f"alpha={alpha} is outside [{low}, {high}], the range of "
                                 f"method {self.name!r}.")


METHODS: dict[str, Method] = {
    AUTOREGRESSIVE: Method(AUTOREGRESSIVE, AUTOREGRESSIVE),
    # Every target function is a chain method of its name.
    **{name: Method(name, CHAIN, cls(), cls.alpha_range)
       for name, cls in target_functions.TARGETS.items()},
    # The cascade baselines that are not a chain round: the oracle (a G = 0 round
    # with Diff), the sequential token cascade (Chow) and the original Big-Little
    # Decoder, whose alpha is its rollback threshold on D(q, p).
    ORACLE: Method(ORACLE, ORACLE, target_functions.Diff(), target_functions.Diff.alpha_range),
    "token-cascade": Method("token-cascade", DRAFT_UNTIL, target_functions.Chow(),
                            target_functions.Chow.alpha_range),
    "bild-original": Method("bild-original", DRAFT_UNTIL, target_functions.BiLD(),
                            target_functions.BiLD.alpha_range),
}
METHOD_NAMES = tuple(METHODS)


def get_method(name: str) -> Method:
    """The table's row for ``name``; an unknown name is refused with the list."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHOD_NAMES)}.")
    return METHODS[name]


def names_of(kind: str) -> tuple[str, ...]:
    """The methods whose rounds are of ``kind``."""
    return tuple(name for name, method in METHODS.items() if method.kind == kind)
