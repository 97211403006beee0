"""The decoding core: one round, one loop, and the decoders built on them.

- ``round``: the round every decoder runs (draft, score, verify, emit, commit,
  count), the loop over it, the prefill of both models and the cache-room
  checks (``RoundDecoder``);
- ``chain``: chains of ``G`` drafts, token or block verified (``SpeculativeDecoder``);
- ``tree``: token trees, verified by a tree verifier (``TreeDecoder``);
- ``cascade_baselines``: drafting until a rule defers (``DraftUntilDecoder``)
  and the sequence-level cascade;
- ``autoregressive``: the target alone, a round with nothing drafted;
- ``stats``: the counters every generation returns.

A decoder supplies how it drafts, scores, verifies and commits; everything
else is the round's. ``api.make_decoder`` picks the decoder a request needs.
"""

from specdec_jax.decode.autoregressive import AutoregressiveDecoder
from specdec_jax.decode.cascade_baselines import (
    DraftUntilDecoder,
    sequence_cascade,
    sequence_defers,
)
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.decode.round import (
    MIN_SCRATCH,
    EndOfBlockStop,
    Prefilled,
    RoundDecoder,
    extend_bucketed,
    required_cache_length,
)
from specdec_jax.decode.stats import GenerationOutput, GenerationStats
from specdec_jax.decode.tree import TreeDecoder, TreeSpec

__all__ = [
    "MIN_SCRATCH", "AutoregressiveDecoder", "DraftUntilDecoder", "EndOfBlockStop",
    "GenerationOutput", "GenerationStats", "Prefilled", "RoundDecoder", "SpeculativeDecoder",
    "TreeDecoder", "TreeSpec", "extend_bucketed", "required_cache_length", "sequence_cascade",
    "sequence_defers",
]
