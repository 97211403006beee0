"""Decoding speed on an accelerator (or the CPU), in-loop, at explicit acceptance regimes.

Runs where the real weights are not at hand: the resolver's ``random:<arch>:<seed>``
names build the registered architectures' exact shapes (``registry.ARCHITECTURES``)
with random weights, since a step's cost depends on shapes and dtype, not on
values. For each dtype, in one process:

1. **Device limits**: read, copy and matmul rates (``timing.device_limits``).
2. **In-loop steps**: each model's ``extend`` of K tokens (K = 1 and every
   G + 1) at each batch size, timed as 32 steps inside one jitted loop (a
   host-dispatched call would add its dispatch, which the decoding loop never
   pays), with the effective bandwidth ``weight bytes / step`` against the
   measured copy rate (the reference on a GPU) and read rate (the reference
   on CPU, where writing a fresh 1 GiB output page-faults and the copy
   measures far below what a step can read). Beside them, **Max-Gram's
   drafting** at batch 1 over ``max_gram_context`` tokens of text: one
   lookup (a chain makes one per draft) and one best-first tree of each of
   ``MAX_GRAM_TRIES`` (the token-tree benchmark prices Max-Gram with them).
3. **Decoding**: the autoregressive target and ``specdecode`` / ``token-v3``
   at each G, greedy, in two regimes made explicit by the drafter:
   *all-accept* (the drafter is the target itself: every draft is accepted)
   and *none-accepted* (the real drafter's shapes with independent random
   weights: greedy drafts essentially never match). Decode time excludes
   both prefills (timed alone and subtracted). Per run: tokens/s, round time,
   **round overhead = round / (drafter calls per round x drafter step +
   target step of G + 1 tokens) - 1** (in-loop steps), compile time, measured
   acceptance; and a check that nothing recompiles across prompts and
   sampling settings (backend compile events counted, must be 0 after the
   first call).
4. **Predicted tokens/s** of the real pair at acceptance rates measured on
   CPU with the real weights (``acceptance``): i.i.d. acceptance ``a`` gives
   ``cost.tokens_per_round(a, G)`` tokens per round, at the measured round time
   of the none-accepted regime (the real drafter's shapes). The same model at
   the none-accepted runs' own measured acceptance is compared with their
   measured tokens/s (``predicted_agreement``: Pearson r and mean bias).
5. **Peers** (batch 1, same weights): ``transformers`` eager and with a static
   cache + ``torch.compile`` (its own ``generate`` path, the fair peer), AR and
   assisted generation (eager: ``transformers`` refuses assisted generation
   with a static cache) in both regimes; greedy outputs compared token for
   token with ours (float32).

``benchmarks/configs/accelerator.gin`` runs it (random weights of the Qwen2.5-Coder
shapes); ``benchmarks/configs/accelerator_tiny.gin`` is a smoke run on tiny shapes::

    # GPU (bf16 is the accelerator default):
    python -m benchmarks.main --gin_file=benchmarks/configs/accelerator.gin \\
        --gin_bindings="bench_accelerator.dtypes = ['bfloat16', 'float32']"
    # CPU (the README's figures; 2 cores take ~15 min):
    python -m benchmarks.main --gin_file=benchmarks/configs/accelerator.gin \\
        --gin_bindings="bench_accelerator.dtypes = ['float32']" \\
        --gin_bindings="bench_accelerator.batch_sizes = [1]" \\
        --gin_bindings="bench_accelerator.gammas = [5]" \\
        --gin_bindings="bench_accelerator.max_new_tokens = 32" \\
        --gin_bindings="bench_accelerator.steps = 8" --gin_bindings="bench_accelerator.repeats = 3"

Writes a JSON report after every section (``out``) and a Markdown summary; its
``steps`` are what ``benchmarks/configs/specdecpp_device.gin`` (``device_steps``) reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peers as peer_lib
from benchmarks import shared
from specdec_jax import api, precision
from specdec_jax.decode import cost
from specdec_jax.decode.round import required_cache_length
from specdec_jax.drafting.maxgram import DEFAULT_MAX_NGRAM, longest_match_next
from specdec_jax.drafting.tree import MaxGramTrieDrafter
from specdec_jax.jobs import resolver, tables
from specdec_jax.models.decoder_only import with_kernel_layout
from specdec_jax.models.layers import KERNEL_LAYOUTS, OUT_IN
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm

REGIMES = ("all-accept", "none-accepted")
SPECULATIVE = ("specdecode", "token-v3")
# Acceptance per draft of the real pair measured on CPU with the real weights
# (README, bench_speculative, HumanEval, G = 5: mean accepted 3.62 of 5 greedy
# and 3.43 at T = 1, i.e. a = 0.87 and 0.84 under i.i.d. acceptance).
MEASURED_ACCEPTANCE = (0.87, 0.84)
TOKEN_V3_ALPHA = 0.3
PEERS = ("eager", "compiled", "assisted")
# Max-Gram best-first trees whose drafting is timed: (nodes, depth), labelled 'trie:N,D'.
MAX_GRAM_TRIES = ((16, 8),)
MAX_GRAM_TABLE_COLUMNS = 8  # continuations per token of the tries' bigram table


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one run measures (the job's arguments; ``dtypes`` resolved)."""

    target: str
    drafter: str
    dtypes: list[str]
    batch_sizes: list[int]
    gammas: list[int]
    methods: list[str]
    prompt_len: int
    max_new_tokens: int
    steps: int
    repeats: int
    kernel_layout: str
    fused_projections: bool
    rounds_per_sync: list[int]
    target_step_widths: list[int]
    acceptance: list[float]
    peers: list[str]
    max_gram_context: int = 2048  # 0: Max-Gram's drafting is not timed

    @property
    def random_weights(self) -> bool:
        """Both models are random weights of registered shapes (``random:`` names)."""
        return all(name.startswith(resolver.RANDOM_PREFIX) for name in (self.target,
                                                                        self.drafter))

    def to_json(self) -> dict:
        """The report's ``settings`` (the keys the script's reports have)."""
        fields = dataclasses.asdict(self)
        return {"target": fields.pop("target"), "drafter": fields.pop("drafter"),
                "random_weights": self.random_weights, **fields}


def run_bench_accelerator(*, target: str = "qwen2.5-coder-1.5b",
                          drafter: str = "qwen2.5-coder-0.5b",
                          dtypes: Sequence[str] = ("auto",),
                          batch_sizes: Sequence[int] = (1, 8),
                          gammas: Sequence[int] = (3, 5, 7),
                          methods: Sequence[str] = SPECULATIVE, prompt_len: int = 128,
                          max_new_tokens: int = 128, steps: int = 32, repeats: int = 5,
                          kernel_layout: str = OUT_IN, fused_projections: bool = True,
                          rounds_per_sync: Sequence[int] = (1,),
                          target_step_widths: Sequence[int] = (),
                          acceptance: Sequence[float] = MEASURED_ACCEPTANCE,
                          peers: Sequence[str] = PEERS, max_gram_context: int = 2048,
                          out: str = "results/bench_accelerator.json",
                          markdown_path: str | None = None) -> dict:
    """The benchmark (module docstring) for ``target`` and ``drafter`` (resolver
    names: ``random:<architecture>:<seed>`` for random weights of its shapes,
    different seeds giving independent weights) at each of ``dtypes`` (auto:
    float32 on CPU, bfloat16 on accelerators).

    ``steps``: steps per in-loop timing; ``repeats``: timed repeats (in-loop)
    and prompts (decoding). ``kernel_layout``: dense kernels while decoding,
    ``out_in`` (``api.decode_layout``, the library's way) or ``in_out`` (the
    checkpoint tree); ``fused_projections`` (``out_in`` only): q/k/v and gate/up
    as one product each (the decode layout's default) or separate
    (``models.decoder.with_kernel_layout``). ``rounds_per_sync``: each decoding
    configuration runs once per value (``decode.round.loop_until_done``: rounds
    between two host reads of the loop condition; the round overhead shows
    what a read costs). ``target_step_widths``: more widths K for the
    target's in-loop step table (decoding runs only at ``gammas``): SpecDec++'s
    compiled target widths, say, whose costs ``benchmarks/configs/specdecpp_device.gin``
    turns into tokens/s. ``peers``: the ``transformers`` variants to time
    (empty: none). ``max_gram_context``: tokens of text Max-Gram's timed
    drafting searches (0: not timed). Writes ``out`` (JSON) after every section and prints the
    Markdown summary (also to ``markdown_path`` if given)."""
    settings = check_settings(
        target=target, drafter=drafter, dtypes=list(dtypes), batch_sizes=list(batch_sizes),
        gammas=list(gammas), methods=list(methods), prompt_len=prompt_len,
        max_new_tokens=max_new_tokens, steps=steps, repeats=repeats,
        kernel_layout=kernel_layout, fused_projections=fused_projections,
        rounds_per_sync=list(rounds_per_sync),
        target_step_widths=list(target_step_widths), acceptance=list(acceptance),
        peers=list(peers), max_gram_context=max_gram_context)
    report = {"environment": timing.environment(), "backend": jax.default_backend(),
              "settings": settings.to_json(), "by_dtype": {}}
    for dtype in settings.dtypes:
        section = report["by_dtype"][dtype] = {}
        section["limits"] = timing.device_limits(dtype)
        models = build_models(settings, dtype)
        section["weight_bytes"] = {role: weight_bytes(p) for role, (_, p) in models.items()}
        section["steps"] = measure_steps(models, settings, section["limits"])
        if settings.max_gram_context:
            section["max_gram"] = measure_max_gram(models["target"][0].vocab_size, settings)
        shared.write_report(report, out)
        rows = section["decoding"] = []
        jobs = [(b, c) for b in settings.batch_sizes for c in decode_configs(settings)]
        prefill_by_role = prefill_fns(models, settings)
        for batch, config in tqdm(jobs, desc=f"decoding ({dtype})"):
            rows.append(run_decode(config, models, settings, batch, section["steps"],
                                   prefill_by_role))
            shared.write_report(report, out)
        section["predicted"] = predict(rows, settings.acceptance)
        section["predicted_agreement"] = predicted_agreement(rows)
        if settings.peers:
            ours_tokens_per_s, ours = peer_lib.ours_on_peer_prompts(models, settings)
            section["peers"] = peer_lib.run_peers(models, settings, dtype, ours)
            section["peers"]["ours_autoregressive_tokens_per_s"] = ours_tokens_per_s
            peer_lib.match_peers_with_ours(section)
        shared.write_report(report, out)
        del models
    timing.print_markdown(markdown(report), markdown_path)
    return report


def check_settings(**arguments) -> Settings:
    """The job's arguments, checked before any model is loaded."""
    s = arguments
    shared.check_at_least(1, gammas=s["gammas"], batch_sizes=s["batch_sizes"],
                          max_new_tokens=s["max_new_tokens"], steps=s["steps"],
                          repeats=s["repeats"])
    if s["target_step_widths"]:
        shared.check_at_least(1, target_step_widths=s["target_step_widths"])
    shared.check_at_least(2, prompt_len=s["prompt_len"])
    shared.check_at_least(0, max_gram_context=s["max_gram_context"])
    if 0 < s["max_gram_context"] <= max(d for _, d in MAX_GRAM_TRIES):
        raise ValueError(f"max_gram_context={s['max_gram_context']} leaves no text before a "
                         f"tree of depth {max(d for _, d in MAX_GRAM_TRIES)}; give more tokens "
                         "(2048, the TPU programs' room) or 0 to skip Max-Gram.")
    shared.check_choices("methods", s["methods"], SPECULATIVE)
    shared.check_choices("peers", s["peers"], PEERS, allow_empty=True)
    shared.check_choices("kernel_layout", s["kernel_layout"], KERNEL_LAYOUTS)
    if not s["rounds_per_sync"] or not all(isinstance(r, int) and r >= 1
                                           for r in s["rounds_per_sync"]):
        raise ValueError(f"rounds_per_sync takes integers >= 1, one or more; got "
                         f"{s['rounds_per_sync']!r}.")
    if not isinstance(s["fused_projections"], bool):
        raise ValueError(f"fused_projections must be True or False, got "
                         f"{s['fused_projections']!r}.")
    if s["fused_projections"] and s["kernel_layout"] != OUT_IN:
        raise ValueError("fused projections are part of the out_in layout; set "
                         "fused_projections = False with kernel_layout = 'in_out'.")
    if not s["acceptance"] or not all(isinstance(a, (int, float)) and 0 <= a < 1
                                      for a in s["acceptance"]):
        raise ValueError(f"acceptance rates must lie in [0, 1), one or more; got "
                         f"{s['acceptance']!r}.")
    if not s["dtypes"]:
        raise ValueError("dtypes is empty; give one or more of 'auto', 'float32', 'bfloat16'.")
    s["dtypes"] = [precision.resolve_dtype(d) for d in s["dtypes"]]
    for role in ("target", "drafter"):
        resolver.family_of(s[role])  # an unknown name fails here, listing the known ones
        if s[role].startswith(resolver.RANDOM_PREFIX):
            resolver.parse_random(s[role])
    if s["target"] == s["drafter"]:
        raise ValueError(f"target and drafter are both {s['target']!r}: the none-accepted "
                         "regime needs a drafter with independent weights (random weights: "
                         "another seed, e.g. random:<architecture>:1).")
    return Settings(**s)


def build_models(settings: Settings, dtype: str) -> dict:
    """role -> (model, params): the target and the drafter (independent weights),
    in ``kernel_layout``, their projections fused or not."""
    models = {}
    for role in ("target", "drafter"):
        model, params, _ = resolver.resolve(getattr(settings, role), dtype=dtype,
                                            kernel_layout=settings.kernel_layout)
        models[role] = with_kernel_layout(model, params, settings.kernel_layout,
                                          fused=settings.fused_projections)
    return models


def weight_bytes(params) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(params))


# -- in-loop steps -------------------------------------------------------------------------

def measure_steps(models: dict, settings: Settings, limits: dict) -> dict:
    """role -> batch -> K -> step figures."""
    ks = {1} | {g + 1 for g in settings.gammas}
    jobs = [(role, b, k) for role in models for b in settings.batch_sizes
            for k in sorted(ks | (set(settings.target_step_widths) if role == "target"
                                  else set()))]
    steps: dict = {}
    for role, batch, k in tqdm(jobs, desc="in-loop steps"):
        model, params = models[role]
        timed = timing.in_loop_step(model, params, k, batch, fill=settings.prompt_len,
                                    steps=settings.steps, repeats=settings.repeats)
        gb_s = weight_bytes(params) / timed.median_s / 1e9
        steps.setdefault(role, {}).setdefault(str(batch), {})[str(k)] = {
            "step_s": timed.median_s, "compile_s": timed.compile_s,
            "weight_gb_s": gb_s, "of_copy_bandwidth": gb_s / limits["copy_gb_s"],
            "of_read_rate": gb_s / limits["read_gb_s"]}
    return steps


def measure_max_gram(vocab_size: int, settings: Settings) -> dict:
    """Seconds of Max-Gram's drafting at batch 1 over ``max_gram_context``
    tokens of random text (in-loop: each step writes its proposal back into
    the text at a fixed position, so every step searches the same length):
    ``{"context", "lookup_s", "trie_s": {"trie:N,D": s}}``. Random text matches
    rarely; the search, not the matches, is what a step costs."""
    context = settings.max_gram_context
    key_text, key_table = jax.random.split(jax.random.PRNGKey(0))
    text = jax.random.randint(key_text, (1, context), 0, vocab_size, jnp.int32)
    table = jax.random.randint(key_table, (vocab_size, MAX_GRAM_TABLE_COLUMNS), 0, vocab_size,
                               jnp.int32)

    def timed(propose, depth: int) -> float:
        n = jnp.full((1,), context - depth - 1, jnp.int32)

        def body(table, text):
            return text.at[0, n[0]].set(propose(table, text, n)[0])

        return timing.in_loop(body, table, text, steps=settings.steps,
                              repeats=settings.repeats).median_s

    out = {"context": context,
           "lookup_s": timed(lambda t, x, n: longest_match_next(x, n, t[:, 0], DEFAULT_MAX_NGRAM),
                             1),
           "trie_s": {}}
    for nodes, depth in MAX_GRAM_TRIES:
        trie = MaxGramTrieDrafter(vocab_size, num_nodes=nodes, depth=depth)
        out["trie_s"][f"trie:{nodes},{depth}"] = timed(
            lambda t, x, n, trie=trie: trie.grow(t, x, n)[0][:, 0], depth)
    return out


# -- decoding ------------------------------------------------------------------------------

@contextlib.contextmanager
def count_compiles():
    """Counts XLA backend compilations inside the block."""
    count = [0]

    def listener(event, duration_secs, **kwargs):
        del duration_secs, kwargs
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def decode_configs(settings: Settings) -> list[dict]:
    configs = [{"name": "autoregressive", "method": "autoregressive", "gamma": 0,
                "regime": None}]
    configs += [{"name": f"{m} G={g} {r}", "method": m, "gamma": g, "regime": r}
                for m in settings.methods for g in settings.gammas for r in REGIMES]
    return [{**c, "rounds_per_sync": n,
             "name": c["name"] + ("" if n == 1 else f" R={n}")}
            for n in settings.rounds_per_sync for c in configs]


def prefill_fns(models: dict, settings: Settings) -> dict:
    """role -> jitted prefill at the decoders' cache length (one program per
    model and prompt shape, shared by every configuration)."""
    max_length = required_cache_length(settings.prompt_len, settings.max_new_tokens,
                                       max(settings.gammas))
    return {role: timing.prefill_fn(model, max_length) for role, (model, _) in models.items()}


def run_decode(config: dict, models: dict, settings: Settings, batch: int, steps: dict,
               prefill_by_role: dict) -> dict:
    """Times one configuration over ``settings.repeats`` prompts, prefills subtracted."""
    target, target_params = models["target"]
    drafter_role = "target" if config["regime"] == "all-accept" else "drafter"
    drafter, drafter_params = models[drafter_role]
    fn = api.make_generate_fn(target=target, drafter=drafter, method=config["method"],
                              gamma=max(config["gamma"], 1),
                              max_new_tokens=settings.max_new_tokens,
                              rounds_per_sync=config.get("rounds_per_sync", 1))
    prompts = shared.random_prompts(target.vocab_size, batch, settings.prompt_len,
                             settings.repeats + 1, seed=batch)
    alpha = TOKEN_V3_ALPHA if config["method"] == "token-v3" else 0.0
    greedy = api.sampling_params(temperature=0.0, alpha=alpha)
    with count_compiles() as compiles:
        start = time.perf_counter()
        jax.block_until_ready(fn(target_params, drafter_params, prompts[0],
                                 jax.random.PRNGKey(0), greedy))
        first_call_s = time.perf_counter() - start
        compiled = compiles[0]
        roles = ["target"] + ([drafter_role] if config["gamma"] else [])
        prefills = [(prefill_by_role[role], models[role][1]) for role in roles]
        for fn_p, p in prefills:
            jax.block_until_ready(fn_p(p, prompts[0]))
        before = compiles[0]
        runs = []
        for i, prompt in enumerate(prompts[1:]):
            prefill_s = sum(timing.seconds(fn_p, p, prompt)[0] for fn_p, p in prefills)
            total_s, out = timing.seconds(fn, target_params, drafter_params, prompt,
                                          jax.random.PRNGKey(i + 1), greedy)
            runs.append({"decode_s": total_s - prefill_s, "prefill_s": prefill_s,
                         "tokens": int(np.asarray(out.lengths).sum()),
                         "rounds": int(np.asarray(out.stats.target_calls).max()),
                         "drafter_calls": int(np.asarray(out.stats.drafter_calls).max()),
                         # numpy, not stats.accepted(): an eager jnp op would compile
                         # a small program of its own and blur the recompile count
                         "accepted": int((np.asarray(out.stats.accepted_histogram) * np.arange(
                             out.stats.accepted_histogram.shape[-1])).sum()),
                         "drafted": int(np.asarray(out.stats.drafted).sum()),
                         "nan_logits": int(np.asarray(out.stats.nan_logits).sum())})
        # Other sampling settings (traced) and keys on a seen prompt: no new program.
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
            sp = api.sampling_params(temperature=temperature, top_p=top_p, alpha=alpha)
            jax.block_until_ready(fn(target_params, drafter_params, prompts[1],
                                     jax.random.PRNGKey(99), sp))
        recompiles = compiles[0] - before
    decode_s = sum(r["decode_s"] for r in runs)
    tokens = sum(r["tokens"] for r in runs)
    rounds = sum(r["rounds"] for r in runs)
    row = {"batch": batch, **config, "compiled_programs_first_call": compiled,
           "first_call_s": first_call_s, "recompiles_after_first_call": recompiles,
           "jit_cache_entries": fn._cache_size(),  # one program for every call above
           "decode_tokens_per_s": tokens / decode_s, "round_s": decode_s / rounds,
           "tokens_per_round": tokens / rounds / batch,
           "nan_logits": sum(r["nan_logits"] for r in runs), "runs": runs}
    b = str(batch)
    calls_per_round = sum(r["drafter_calls"] for r in runs) / rounds  # 0 when autoregressive
    if config["gamma"]:
        drafted = sum(r["drafted"] for r in runs)
        row.update(acceptance=sum(r["accepted"] for r in runs) / max(drafted, 1),
                   drafter_calls_per_round=calls_per_round)
    row["round_overhead"] = timing.round_overhead(
        row["round_s"], calls_per_round, steps[drafter_role][b]["1"]["step_s"],
        steps["target"][b][str(config["gamma"] + 1)]["step_s"])
    return row


def predicted_tokens_per_s(row: dict, acceptance: float) -> tuple[float, float]:
    """Tokens per round and tokens/s of ``row``'s configuration at i.i.d.
    acceptance ``acceptance``, at its measured round time."""
    per_round = cost.tokens_per_round(acceptance, row["gamma"])
    return per_round, row["batch"] * per_round / row["round_s"]


def autoregressive_row(rows: list[dict], row: dict) -> dict:
    """The autoregressive run ``row`` is compared with: same batch, same
    ``rounds_per_sync`` (like with like: both loops read their condition as often)."""
    same = row.get("rounds_per_sync", 1)
    return next(r for r in rows if r["batch"] == row["batch"] and not r["gamma"]
                and r.get("rounds_per_sync", 1) == same)


def predict(rows: list[dict], acceptance: list[float]) -> list[dict]:
    """Tokens/s of the real pair at CPU-measured acceptance, from measured rounds."""
    predicted = []
    for row in rows:
        if row["regime"] != "none-accepted":
            continue
        ar = autoregressive_row(rows, row)
        for a in acceptance:
            per_round, tps = predicted_tokens_per_s(row, a)
            predicted.append({"batch": row["batch"], "method": row["method"],
                              "gamma": row["gamma"], "acceptance": a,
                              "rounds_per_sync": row.get("rounds_per_sync", 1),
                              "tokens_per_round": per_round, "tokens_per_s": tps,
                              "speedup_vs_autoregressive": tps / ar["decode_tokens_per_s"]})
    return predicted


def predicted_agreement(rows: list[dict]) -> dict:
    """``predict``'s model against the wall clock where the real pair ran (the
    none-accepted runs): tokens/s at each run's own measured acceptance vs its
    measured tokens/s (``cost.agreement_stats``; bias in tokens/s)."""
    pairs = [(predicted_tokens_per_s(row, row["acceptance"])[1], row["decode_tokens_per_s"])
             for row in rows if row["regime"] == "none-accepted"]
    return cost.agreement_stats(*zip(*pairs)) if pairs else cost.agreement_stats([], [])


# -- report --------------------------------------------------------------------------------

def _weights_line(settings: dict) -> str:
    if settings["random_weights"]:
        return "random weights of the exact shapes"
    if any(settings[role].startswith(resolver.RANDOM_PREFIX) for role in ("target", "drafter")):
        return "random weights for the random: names, real weights for the other"
    return "real weights"


def _agreement_line(stats: dict) -> str:
    if not stats["n"]:
        return "No none-accepted run to compare the prediction with."
    pearson = "–" if stats["pearson"] is None else f"{stats['pearson']:.3f}"
    runs = "run" if stats["n"] == 1 else "runs"
    return (f"The same model at the measured acceptance vs the measured tokens/s of the "
            f"{stats['n']} none-accepted {runs}: mean bias {stats['mean_bias']:+.2f} tokens/s, "
            f"mean ratio measured / modelled {stats['mean_ratio']:.3f}, Pearson r {pearson}.")


def _decoding_cells(row: dict, rows: list[dict]) -> list[str]:
    """One decoding run's cells, its tokens/s against the autoregressive run of its batch."""
    ar = autoregressive_row(rows, row)
    return [row["batch"], row["name"], f"{row['decode_tokens_per_s']:.2f}",
            f"{row['decode_tokens_per_s'] / ar['decode_tokens_per_s']:.2f}x",
            f"{1e3 * row['round_s']:.1f}", f"{row['tokens_per_round']:.2f}",
            f"{row['acceptance']:.2f}" if "acceptance" in row else "–",
            f"{100 * row['round_overhead']:+.1f}%", f"{row['first_call_s']:.1f}",
            row["recompiles_after_first_call"]]


def path_name(settings: dict) -> str:
    """The kernel path of a run: ``in_out``, ``out_in:fused`` or ``out_in:separate``
    (reports written before fused projections existed: ``out_in:separate``)."""
    layout = settings.get("kernel_layout", "in_out")
    if layout != OUT_IN:
        return layout
    return f"{layout}:{'fused' if settings.get('fused_projections') else 'separate'}"


def markdown(report: dict) -> str:
    env, s = report["environment"], report["settings"]
    lines = [f"{s['target']} <- {s['drafter']} ({_weights_line(s)}); prompt {s['prompt_len']} "
             f"tokens, {s['max_new_tokens']} new tokens, greedy; kernels "
             f"{path_name(s)}; "
             f"{env['machine']}, jax {env['jax']}.", ""]
    for dtype, sec in report["by_dtype"].items():
        lim = sec["limits"]
        lines += [f"### {dtype} ({report['backend']})", "",
                  f"Device: read {lim['read_gb_s']:.1f} GB/s, copy {lim['copy_gb_s']:.1f} GB/s, "
                  f"{dtype} matmul {lim['matmul_gflop_s']:.0f} GFLOP/s. Weights: " + ", ".join(
                      f"{r} {b / 1e9:.2f} GB" for r, b in sec["weight_bytes"].items()), ""]
        lines += tables.markdown_table(
            ("model", "batch", "K", "in-loop step ms", "weight GB/s", "of copy rate",
             "of read rate"),
            [(role, b, k, f"{1e3 * st['step_s']:.2f}", f"{st['weight_gb_s']:.1f}",
              f"{st['of_copy_bandwidth']:.2f}", f"{st.get('of_read_rate', float('nan')):.2f}")
             for role, by_b in sec["steps"].items() for b, by_k in by_b.items()
             for k, st in by_k.items()])
        if "max_gram" in sec:
            mg = sec["max_gram"]
            tries = "; ".join(f"{name} {1e3 * seconds:.3f} ms"
                              for name, seconds in mg["trie_s"].items())
            lines += ["", f"Max-Gram drafting, batch 1, {mg['context']} tokens of text (in-loop): "
                      f"one lookup {1e3 * mg['lookup_s']:.3f} ms; {tries}."]
        lines += [""] + tables.markdown_table(
            ("batch", "configuration", "tokens/s", "vs AR", "round ms", "tokens/round",
             "acceptance", "round overhead", "first call s", "recompiles"),
            [_decoding_cells(row, sec["decoding"]) for row in sec["decoding"]])
        if sec["predicted"]:
            lines += ["", "Predicted for the real pair at CPU-measured acceptance (none-accepted "
                      "round time, i.i.d. acceptance):", ""] + tables.markdown_table(
                ("batch", "method", "G", "acceptance", "tokens/round", "tokens/s", "vs AR"),
                [(p["batch"], p["method"] + ("" if p.get("rounds_per_sync", 1) == 1 else
                                             f" R={p['rounds_per_sync']}"),
                  p["gamma"], f"{p['acceptance']:.2f}",
                  f"{p['tokens_per_round']:.2f}", f"{p['tokens_per_s']:.2f}",
                  f"{p['speedup_vs_autoregressive']:.2f}x") for p in sec["predicted"]])
            if "predicted_agreement" in sec:  # reports written before it lack it
                lines += ["", _agreement_line(sec["predicted_agreement"])]
        if "peers" in sec:
            lines += [""] + peer_lib.accelerator_lines(sec["peers"])
        lines.append("")
    if report["backend"] == "cpu":
        lines.append("GPU: not measured in this run (no accelerator); the command in the "
                     "module docstring produces the same tables there.")
    return "\n".join(lines)
