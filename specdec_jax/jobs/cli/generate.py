"""``specdec-jax generate``: speculative generation on real models, with the
speedup over autoregressive target decoding measured in the same run.

    specdec-jax generate --target qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b \\
        --method token-v3 --alpha 0.3 --gamma 5 --prompt "def quicksort(xs):"

Drafting strategies (``--draft``, default: the --drafter model alone):
    --draft mag --gamma 8                                   Max-Gram alone
    --draft qwen2.5-coder-0.5b+mag --k-matrix "[[2,10],[0,10]]"   CS Drafting
    --draft feature:<dir>                   a feature head trained for --target
    --draft feature:<dir>+mag --k-matrix "[[3,4],[0,0]]"    and composed like a model

Token trees (``--tree``: several continuations per round, one target call):
    --tree 3,2,1,1 --verifier rrs             a static tree from the drafter model
    --tree dynamic:5,2,2                      EAGLE-2's dynamic tree (2 + 4 * 4 nodes)
    --draft mag --tree 4,2,1                  a Max-Gram tree
With the cost model (no --no-cost-model; ``decode.cost``) a tree's round is
priced before the run (its calls timed here, the tokens its shape should earn,
the best chain beside it) and after it (the run's counters), as a chain's is.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import sys
import threading
from collections.abc import Callable

import jax
import numpy as np

from specdec_jax import api, drafting, precision, verify
from specdec_jax.checkpoints import feature_head_io, fetch, load, registry
from specdec_jax.data import batching, bigram
from specdec_jax.decode import cost, methods
from specdec_jax.decode.tree import TreeSpec
from specdec_jax.drafting import head_vocab
from specdec_jax.jobs import resolver
from specdec_jax.models import weight_storage
from specdec_jax.models.layers import KERNEL_LAYOUTS, OUT_IN
from specdec_jax.native import matmul as native_matmul
from specdec_jax.runtime import calibration, cpu_kernels, timing

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFTER = "qwen2.5-coder-0.5b"
# The 0.5B drafter's tied head is 136 M of its 494 M parameters; 32,768 rows
# cover every token of the ranking corpus (drafting.head_vocab).
DEFAULT_HEAD_VOCAB = 32768
# --dtype: auto is float32 on CPU and bfloat16 on accelerators (precision.resolve_dtype).
DTYPE_CHOICES = (precision.AUTO, "float32", "bfloat16")
# Code completions: the default pair is a code model pair.
DEFAULT_PROMPTS = (
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
    "def is_palindrome(text: str) -> bool:\n"
    '    """Return True if text reads the same backwards, ignoring case."""\n',
    'def flatten(nested: list) -> list:\n    """Flatten a nested list of lists."""\n',
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help=__doc__.splitlines()[0],
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=DEFAULT_TARGET, help="registry name, .gguf or HF dir")
    p.add_argument("--drafter", default=DEFAULT_DRAFTER)
    p.add_argument("--draft", default=None,
                   help="drafting strategy: model names, 'mag' and 'feature:<dir>' (a feature "
                        "head saved for --target) joined by '+', largest first (default: the "
                        "--drafter model alone)")
    p.add_argument("--k-matrix", default=None,
                   help="CS Drafting K-matrix as JSON, e.g. '[[2,10],[0,10]]' (needed when "
                        "--draft lists several drafters)")
    p.add_argument("--lenience", type=float, default=1.0,
                   help="CS Drafting lenience between drafters (>= 1; never the target)")
    p.add_argument("--bigram", default=bigram.AUTO,
                   help="Max-Gram's bigram table: a packaged name, a .npz/.npy path, or "
                        "'auto' (default: the packaged table of the target's tokenizer, else "
                        "one built from the standard library on first use and cached); its "
                        "corpus counts also rank --drafter-head-vocab")
    p.add_argument("--drafter-head-vocab", type=int, default=DEFAULT_HEAD_VOCAB,
                   help="neural drafters score only this many of the most frequent tokens "
                        "(FR-Spec; the output stays exact, a drafting step gets cheaper); 0 "
                        f"keeps the full head (default {DEFAULT_HEAD_VOCAB})")
    p.add_argument("--method", default="specdecode", choices=methods.METHOD_NAMES)
    p.add_argument("--alpha", type=float, default=0.0)
    p.add_argument("--beta", type=float, default=1.0, help="Lossy's beta")
    p.add_argument("--gamma", type=int, default=None,
                   help="draft block length G (default: for one drafter model, the G the "
                        "cost model predicts fastest from steps timed here, else 5 (also "
                        "with --no-cost-model); a K-matrix fixes its own)")
    p.add_argument("--verifier", default=None, choices=verify.ALL_VERIFIERS,
                   help="chains: token (default), block, block-seed; trees (--tree): "
                        "traversal (default), rrs, rrs-replacement (children drawn with "
                        "replacement), greedy (temperature 0 only); token = rrs, block = "
                        "traversal. At temperature 0 every tree is verified greedily")
    p.add_argument("--tree", default=None,
                   help="draft a token tree per round instead of a chain: widths per depth "
                        "('3,2,1,1': 3 + 6 + 6 + 6 nodes), 'dynamic:DEPTH,EXPAND,CHILDREN' "
                        "(EAGLE-2's expansion) or any shape by its parents "
                        "('parents:-1,-1,0,0'); from one drafter model or --draft mag")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="one prompt per line, or a .jsonl with 'prompt'")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--width-bucket", type=int, default=64,
                   help="pad each batch's prompts to a multiple of this many tokens, at most "
                        "the longest prompt (one compiled program per width; a short prompt "
                        "does not pay for the longest one's prefill); 0 pads every batch to "
                        "the longest prompt (one program)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=0,
                   help="times each method runs every batch, in turn, for the median; 0 "
                        f"(default): until each method has been timed for {AUTO_TIMED_S:g} s, "
                        f"at most {AUTO_MAX_REPEATS} times (once for a slow float32 target)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the autoregressive baseline (no speedup is printed)")
    p.add_argument("--dtype", default=precision.AUTO, choices=DTYPE_CHOICES,
                   help="number format of the models' weights and activations: auto "
                        "(default) is float32 on CPU and bfloat16 on GPU/TPU; probabilities "
                        "and logits stay float32 in every format")
    p.add_argument("--kernel-layout", default=OUT_IN, choices=KERNEL_LAYOUTS,
                   help="how dense kernels are stored while decoding: out_in (default, "
                        "faster) or in_out (the checkpoint tree; to measure the difference)")
    p.add_argument("--draft-weights", default="auto",
                   choices=("auto", *weight_storage.WEIGHT_FORMATS, STORED),
                   help="how drafter models store their weights: f32, bf16, int8 with a "
                        "scale per output row, or stored (a GGUF file's own blocks; the "
                        "output stays exact: the verifier is given the drafter's own law). "
                        "auto: stored for a GGUF drafter where the CPU kernel runs in "
                        "float32, else int8 where the kernel runs, else as loaded")
    p.add_argument("--target-weights", default="auto", choices=("auto", *TARGET_WEIGHTS),
                   help="how the target stores its weights: stored (the GGUF file's own "
                        "blocks, multiplied by the CPU block kernel with int8 activations; "
                        "a row's logits are the same bits in a step and in a scoring call) "
                        "or f32 (the file dequantised once into the cache). auto (default): "
                        "stored for a GGUF target where the CPU kernel runs in float32 "
                        "(about 7x the float32 copy's tokens/s on 2 cores), else f32; "
                        "docs/cli.md")
    p.add_argument("--cpu-kernel", default="auto", choices=("auto", "off"),
                   help="few-row products on CPU through the project's kernel (built on first "
                        "use with the C++ compiler, a few seconds; XLA's dot where it cannot "
                        "be built); off: XLA's dot everywhere")
    p.add_argument("--no-cost-model", action="store_true",
                   help="skip timing the model steps that explain the speedup (saves "
                        "three compilations)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=run)


def read_prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as f:
            if args.prompts_file.endswith(".jsonl"):
                prompts += [json.loads(line)["prompt"] for line in f if line.strip()]
            else:
                prompts += [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
    if not prompts and not args.prompt and not args.prompts_file:
        prompts = list(DEFAULT_PROMPTS)
    if not prompts or any(not p.strip() for p in prompts):
        raise SystemExit("error: got an empty prompt; pass text with --prompt or "
                         "--prompts-file.")
    return prompts


def _summary(outputs, batch_seconds: list[float], gamma: int, method: str,
             real_rows: list[int] | None = None) -> dict:
    """The run's figures: only those that mean something for ``method``.
    ``batch_seconds[i]``: the timed seconds of batch ``i`` (kept with its
    token count, so a benchmark can put intervals on per-prompt figures).
    ``real_rows[i]``: how many leading rows of ``outputs[i]`` are prompts (the
    rest pad the last batch to the static shape and are not counted)."""
    if real_rows is not None:
        outputs = [jax.tree_util.tree_map(lambda x, n=n: np.asarray(x)[:n], o)
                   for o, n in zip(outputs, real_rows, strict=True)]
    batch_tokens = [int(np.asarray(o.lengths).sum()) for o in outputs]
    tokens, seconds = sum(batch_tokens), sum(batch_seconds)
    calls = int(sum(int(np.asarray(o.stats.target_calls).sum()) for o in outputs))
    summary = {"tokens": tokens, "target_calls": calls, "seconds": round(seconds, 3),
               "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
               "block_efficiency": round(tokens / max(calls, 1), 3),
               "batch_seconds": [round(s, 4) for s in batch_seconds],
               "batch_tokens": batch_tokens}
    if gamma:
        summary["drafter_calls"] = int(sum(int(np.asarray(o.stats.drafter_calls).sum())
                                           for o in outputs))
        hist = sum(np.asarray(o.stats.accepted_histogram).sum(0) for o in outputs)
        mean_accepted = float((hist * np.arange(gamma + 1)).sum() / max(hist.sum(), 1))
        summary.update(mean_accepted=round(mean_accepted, 3),
                       acceptance_rate=round(mean_accepted / gamma, 3),
                       accepted_histogram=hist.tolist())
    if methods.get_method(method).defers:
        deferred = sum(float(np.asarray(o.stats.deferred_mass).sum()) for o in outputs)
        summary["deferral_rate"] = round(deferred / max(tokens, 1), 3)
    return summary


# Summary entries a list per batch or draft position: in the JSON only.
PER_BATCH_KEYS = ("accepted_histogram", "batch_seconds", "batch_tokens")
# --repeats 0: repeat the timed runs until each method has run this long in all,
# at most AUTO_MAX_REPEATS times. The stored pair's three prompts take ~4 s a
# method (3 repeats); the float32 target's ~35 s (1).
AUTO_TIMED_S = 10.0
AUTO_MAX_REPEATS = 5


def _more_repeats(repeats: int, done: int, runs_s: dict) -> bool:
    """Whether the timed runs go round once more after ``done`` rounds."""
    if repeats:
        return done < repeats
    least = min(sum(sum(r) for r in per_batch) for per_batch in runs_s.values())
    return done < AUTO_MAX_REPEATS and least < AUTO_TIMED_S


def drafting_strategy(args, spec: str, gamma: int, tree, gamma_choice,
                      tree_by_cost_model: bool = False) -> str:
    """What drafts each round, in words (printed before the run, kept in the
    report): the target alone, a chain of G drafts from one model (G chosen
    by the cost model or given), a token tree (given, or chosen by the cost
    model over the chain), or a strategy of several drafters (``--draft``),
    with the flag that changes it."""
    kind = methods.get_method(args.method).kind
    if kind == methods.AUTOREGRESSIVE:
        return "none: the target alone, a token a step"
    weights = f"{args.draft_weights} weights"
    if tree is not None:
        how = ("chosen by the cost model over a chain; --gamma keeps a chain"
               if tree_by_cost_model else "--tree")
        return f"a token tree {tree} a round from {spec} ({weights}; {how})"
    if kind == methods.DRAFT_UNTIL:
        return (f"{spec} token by token until the {args.method} rule defers, at most "
                f"{gamma} a round ({weights})")
    if kind == methods.ORACLE:
        return f"{spec} at every position beside the target ({weights})"
    if len(drafting.parse_spec(spec)) > 1 or spec == drafting.spec.MAG:
        return f"the strategy {spec}, {gamma} drafts a round (--draft, --k-matrix)"
    how = ("G chosen by the cost model" if gamma_choice is not None
           else "--gamma" if args.gamma is not None else "the default G; --gamma")
    return f"a chain of {gamma} drafts a round from {spec} ({weights}; {how}; --tree for trees)"


def explain_gamma(choice: dict) -> str:
    steps, widest = choice["target_steps_s"], max(choice["target_steps_s"])
    by_gamma = ", ".join(f"G={g}: {row['predicted_speedup']:.2f}x"
                         for g, row in choice["candidates"].items())
    return (f"draft length G = {choice['gamma']}, chosen by the cost model (--gamma "
            f"overrides): target step {1e3 * steps[1]:.0f} ms, {widest}-token call "
            f"{1e3 * steps[widest]:.0f} ms, drafter step {1e3 * choice['drafter_step_s']:.0f} "
            f"ms, acceptance {choice['alpha']:.2f} per draft ({choice['alpha_source']}); "
            f"predicted {by_gamma}")


def explain_tree_choice(choice: dict) -> str:
    """Why the run drafts a chain or a tree (``calibration.choose_tree``)."""
    chain = f"the chain of G = {choice['chain_gamma']}'s {choice['chain_speedup']:.2f}x"
    if choice["best_nodes"] is None:
        return (f"token trees: at this acceptance every tree of up to "
                f"{max(calibration.TREE_NODE_COUNTS)} nodes that earns the most is a chain; "
                "the chain is kept (--tree drafts one)")
    best = choice["screen"][choice["best_nodes"]]
    widths = ",".join(str(w) for w in best["level_widths"])
    screened = (f"token trees: the best, {choice['best_nodes']} nodes ({widths} a depth), "
                f"predicted {best['predicted_speedup']:.2f}x on the calls timed above, against "
                f"{chain}")
    if choice["timed"] is None:
        return (f"{screened}: not {1 + choice['margin']:.2f}x it, the chain is kept (--tree "
                "drafts one)")
    kept = "the tree is kept" if choice["tree"] else "the chain is kept"
    return f"{screened}; timed: {explain_tree_prediction(choice['timed'])}: {kept}"


def explain_tree_prediction(choice: dict) -> str:
    c = choice
    step, n = c["target_step_s"], c["num_nodes"]
    levels = ", ".join(f"{w}: {1e3 * s:.0f}" for w, s in zip(c["level_widths"],
                                                             c["drafter_level_s"], strict=True))
    drafter = (f"; drafter step {1e3 * c['drafter_step_s']:.0f} ms, a call per depth of nodes "
               f"(nodes: ms) {levels}" if c["drafter_step_s"] else "")
    chain = c["best_chain"]
    return (f"token tree {c['tree']} ({n} nodes, depth {c['depth']}), priced by the cost model: "
            f"target step {1e3 * step:.0f} ms, tree call of {n + 1} nodes "
            f"{1e3 * c['tree_call_s']:.0f} ms{drafter}; acceptance {c['alpha']:.2f} per draft "
            f"({c['alpha_source']}) -> {c['tokens_per_round']:.2f} tokens per round, predicted "
            f"{c['predicted_speedup']:.2f}x (the best chain on the same calls: G = "
            f"{chain['gamma']}, {chain['predicted_speedup']:.2f}x)")


def _cost_model_head(m: dict, measured: float | None) -> tuple[str, list[str]]:
    """The measured-speedup note and the first lines shared by ``explain``
    (chains) and ``explain_tree``."""
    measured_text = (f" (measured {measured}x: prefill and the loop included)"
                     if measured is not None else "")
    return measured_text, [
        "cost model (model steps timed inside jitted loops on this machine):",
        f"  tokens per target call    {m['tokens_per_target_call']:.2f}",
        f"  target step, 1 token      {1e3 * m['target_step_s']:.0f} ms"]


def explain_tree(model: dict, measured: float | None) -> str:
    """The tree's cost model as a small table (as ``explain`` for chains)."""
    m = model
    step, n = m["target_step_s"], m["num_nodes"]
    measured_text, lines = _cost_model_head(m, measured)
    lines += [
        f"  tree call, {n + 1} nodes{' ' * max(12 - len(str(n + 1)), 1)}"
        f"{1e3 * m['tree_call_s']:.0f} ms ({m['tree_call_s'] / step:.2f}x a step)"]
    if m["drafter_step_s"]:
        levels = ", ".join(f"{w} nodes {1e3 * s:.0f} ms" for w, s in
                           zip(m["level_widths"], m["drafter_level_s"], strict=True))
        catch_ups = (f"; {m['catch_ups_per_round']:.2f} of them {m['depth'] + 1}-token "
                     f"catch-ups, {1e3 * m['drafter_catch_up_s']:.0f} ms each"
                     if m["catch_ups_per_round"] else "")
        lines.append(f"  drafter calls per round   {m['drafter_calls_per_round']:.2f}: a step "
                     f"{1e3 * m['drafter_step_s']:.0f} ms, then one per depth ({levels})"
                     f"{catch_ups}")
    lines.append(f"  round                     {1e3 * m['round_s']:.0f} ms for "
                 f"{m['tokens_per_target_call']:.2f} tokens -> predicted speedup "
                 f"{m['predicted_speedup']:.2f}x{measured_text}")
    lines += _verdict(
        m, measured, f"this token tree does not pay on this machine: a round would need "
        f"{m['break_even_tokens_per_call']:.2f} tokens per target call to break even (it "
        f"got {m['tokens_per_target_call']:.2f}). A smaller tree, a cheaper drafter "
        "(--draft mag), or an accelerator (where a call of many nodes costs about one "
        "step) changes that.")
    return "\n".join(lines)


def _verdict(m: dict, measured: float | None, loses: str) -> list[str]:
    """``loses`` where the run lost (or, unmeasured, where the prediction does);
    a note where the prediction loses and the run paid: the priced calls were
    timed apart from the run (before it, or after for a width the draft-length
    choice did not time), and a CPU's speed can change between the two."""
    if measured is not None and measured >= 1 > m["predicted_speedup"]:
        return [f"the run paid ({measured}x) where its priced calls predict "
                f"{m['predicted_speedup']:.2f}x: the calls were timed apart from the run, so "
                "a machine whose speed changes (a shared CPU) can price them high (run again "
                "to price them again)."]
    if (measured if measured is not None else m["predicted_speedup"]) < 1:
        return [loses]
    return []


def explain(model: dict, measured: float | None, gamma: int) -> str:
    """The cost model as a small table, and plainly whether speculation pays here."""
    m = model
    step = m["target_step_s"]
    if m["catch_ups_per_round"]:
        catch_ups = (f"; {m['catch_ups_per_round']:.2f} of them 2-token catch-ups, "
                     f"{1e3 * m['drafter_catch_up_s']:.0f} ms each")
    elif m.get("catch_up") == "1-token call":
        catch_ups = "; catch-ups are 1-token calls"
    else:
        catch_ups = ""
    measured_text, lines = _cost_model_head(m, measured)
    lines += [
        f"  scoring call, {gamma + 1} tokens    {1e3 * m['scoring_call_s']:.0f} ms "
        f"({m['scoring_call_s'] / step:.2f}x a step)",
        f"  drafter calls per round   {m['drafter_calls_per_round']:.2f}, a step "
        f"{1e3 * m['drafter_step_s']:.0f} ms ({m['drafter_step_s'] / step:.2f}x a target step)"
        f"{catch_ups}",
        f"  round                     {1e3 * m['round_s']:.0f} ms for "
        f"{m['tokens_per_target_call']:.2f} tokens -> predicted speedup "
        f"{m['predicted_speedup']:.2f}x{measured_text}"]
    lines += _verdict(
        m, measured, f"speculative decoding does not pay on this machine in this configuration: "
        f"a round would need {m['break_even_tokens_per_call']:.2f} tokens per target call to "
        f"break even (it got {m['tokens_per_target_call']:.2f}). A cheaper drafter (--draft "
        "mag), another --gamma, or an accelerator (where a scoring call costs about one step) "
        "changes that.")
    return "\n".join(lines)


def check_feature_head(item: str, target: str | None = None) -> dict:
    """A ``feature:<dir>`` item names a saved head, trained for ``target``
    (when given): checked from its metadata, before any weights are loaded.
    Returns the metadata."""
    path = pathlib.Path(drafting.feature_path(item)).expanduser()
    if not path.is_dir():
        raise ValueError(f"--draft {item!r}: {path} is not a directory; name the directory "
                         "of a saved feature head (checkpoints.feature_head_io.save_feature_head)."
                         )
    if not feature_head_io.is_feature_head(path):
        raise ValueError(f"--draft {item!r}: {path} holds no feature head "
                         f"({feature_head_io.META_FILE} missing); train one for the target first.")
    meta = json.loads((path / feature_head_io.META_FILE).read_text())
    if target is not None and meta.get("target") != target:
        raise ValueError(f"--draft {item!r}: the head was trained for target "
                         f"{meta.get('target')!r}, not --target {target!r}; it predicts that "
                         "target's hidden states. Pass that target or a head trained for this "
                         "one.")
    return meta


def check_spec(spec: str, k_matrix: str | None, target: str | None = None) -> None:
    """Rejects a bad --draft / --k-matrix before any weights are loaded
    (``target``: the --target a feature head must have been trained for)."""
    names = drafting.parse_spec(spec)
    for name in names:
        if name == drafting.spec.MAG:
            continue
        if drafting.feature_path(name) is not None:
            check_feature_head(name, target)
            continue
        try:
            resolver.family_of(name)
        except ValueError as error:
            raise ValueError(f"unknown drafter {name!r} in --draft {spec!r}; use 'mag' or a "
                             f"model: {error}") from error
    if k_matrix is not None:
        drafting.parse_k_matrix(k_matrix, len(names))
    elif len(names) > 1:
        raise ValueError(f"--draft {spec!r} lists {len(names)} drafters: pass --k-matrix, e.g. "
                         "'[[2,10],[0,10]]' (the CS Drafting paper's decoder-only setting).")


STORED = "stored"
TARGET_WEIGHTS = load.WEIGHTS  # f32, stored


def is_gguf(name: str) -> bool:
    """Whether ``name`` loads from a GGUF file (a registry model or a path)."""
    if name in registry.MODELS:
        return registry.get_spec(name).filename.endswith(".gguf")
    return name.endswith(".gguf") and pathlib.Path(name).expanduser().is_file()


def load_drafter_models(args, names, kernel: bool) -> dict:
    """``{name: (model, params, tokenizer, format)}`` for every drafter model a
    spec names, its weights already stored as ``--draft-weights`` asks. Called
    before the target loads: the float32 copy of a drafter stored in fewer
    bytes is gone before the target's weights arrive, so the two float32
    trees never sit in memory together."""
    loaded = {}
    for name in names:
        if name == drafting.spec.MAG or drafting.feature_path(name) is not None:
            continue
        if args.draft_weights == STORED or (args.draft_weights == "auto" and stored_by_default(
                args, name, kernel and native_matmul.blocks_active())):
            model, params, tok = resolver.resolve(name, dtype=args.dtype,
                                                  kernel_layout=args.kernel_layout,
                                                  weights=STORED)
            loaded[name] = (model, params, tok, STORED)
            continue
        model, params, tok = resolver.resolve(name, dtype=args.dtype,
                                              kernel_layout=args.kernel_layout)
        stored_as = resolve_draft_weights(args.draft_weights, kernel, model)
        params = weight_storage.store_weights(params, stored_as,
                                              kernel_layout=model.config.kernel_layout)
        model = weight_storage.with_prefill_for(model, stored_as, on_kernel=kernel)
        loaded[name] = (model, params, tok, stored_as)
        # The float32 leaves just replaced may sit in reference cycles (jitted
        # conversions); collected now, their memory is free before the target loads.
        gc.collect()
    return loaded


def _load_drafter(args, spec: str, names, target, target_params, tokenizer, drafter_models):
    """Every model (from ``drafter_models``) and feature head a draft spec
    names, as one strategy; returns (strategy, its params)."""
    models, heads, named = {}, {}, {}
    model_names = [n for n in names
                   if n != drafting.spec.MAG and drafting.feature_path(n) is None]
    needs_table = drafting.spec.MAG in names or bool(args.drafter_head_vocab and model_names)
    table = (bigram.table_for(args.bigram, tokenizer, target.vocab_size) if needs_table
             else args.bigram)
    for name in names:
        if name == drafting.spec.MAG:
            named[name] = bigram.load_table(table, target.vocab_size)
            continue
        if drafting.feature_path(name) is not None:
            # Refuses a head trained for another target (by name or weights);
            # its params share the target's embedding and output head.
            head, named[name], _ = feature_head_io.load_feature_head(
                drafting.feature_path(name), target_name=args.target, target=target,
                target_params=target_params, name=name)
            heads[name] = head.head
            continue
        model, params, tok, _ = drafter_models[name]
        if tok.fingerprint != tokenizer.fingerprint:
            raise SystemExit(f"error: {name} and {args.target} use different tokenizers; "
                             "speculative decoding needs a shared vocabulary.")
        try:
            model, params = bigram.restrict_head(model, params, args.drafter_head_vocab,
                                                 eos_ids=tokenizer.eos_token_ids,
                                                 table=table)
        except ValueError as error:
            raise SystemExit(f"error: --drafter-head-vocab {args.drafter_head_vocab} for "
                             f"{name}: {error} (--drafter-head-vocab 0 keeps its full "
                             "head)") from error
        models[name], named[name] = model, params
    drafter = drafting.make_drafter(spec, models=models, vocab_size=target.vocab_size,
                                    k_matrix=args.k_matrix, feature_heads=heads, target=target)
    if isinstance(drafter, drafting.ModelDrafter):
        return drafter.model, named[drafter.name]  # the classic path, same as before
    return drafter, drafter.select_params(named)


def takes_trees(args, spec: str) -> bool:
    """Whether the method and drafter of this run could draft a token tree in
    place of their chain (what the cost model may choose)."""
    try:
        api.decoder_spec(args.method, drafter=draft_facts(spec, args.k_matrix), gamma=None,
                         tree="2,1", temperature=args.temperature, alpha=args.alpha,
                         beta=args.beta, names=api.CLI_NAMES)
    except ValueError:
        return False
    return True


def stored_by_default(args, name: str, blocks: bool) -> bool:
    """``auto`` weights: a GGUF model keeps its file's blocks where the block
    kernel multiplies them (``blocks``: ``native.matmul.blocks_active``, the
    CPU kernel on with a SIMD block path; float32 activations, the ``out_in``
    layout); elsewhere its float32 copy is the faster and the one every
    layout and dtype supports (a build with only the scalar reference would
    dequantise the blocks before every product)."""
    return (blocks and is_gguf(name) and args.kernel_layout == OUT_IN
            and precision.resolve_dtype(args.dtype) == "float32")


def resolve_draft_weights(choice: str, kernel: bool, model) -> str:
    """``--draft-weights auto``: int8 for a decoder in the decode layout where
    the CPU kernel reads it (a drafting step reads a quarter of the bytes),
    else the weights as loaded (elsewhere XLA widens them before every
    product, and int8 needs the ``out_in`` layout)."""
    if choice != "auto":
        return weight_storage.check_format(choice)
    layout = getattr(getattr(model, "config", None), "kernel_layout", None)
    return "int8" if kernel and layout == OUT_IN else "f32"


def draft_facts(spec: str, k_matrix: str | None) -> api.DrafterFacts:
    """What ``api.decoder_spec`` needs to know of a ``--draft`` spec before
    anything loads: a strategy (Max-Gram, a cascade, a feature head) or one
    model, the block length a K-matrix fixes, and whether it can draft trees
    (one model or Max-Gram)."""
    names = drafting.parse_spec(spec)
    one_model = (len(names) == 1 and names[0] != drafting.spec.MAG
                 and drafting.feature_path(names[0]) is None)
    fixed = (sum(drafting.parse_k_matrix(k_matrix, len(names))[0])
             if k_matrix is not None else None)
    return api.DrafterFacts(
        strategy=not one_model, fixed_gamma=fixed, max_gram=spec == drafting.spec.MAG,
        drafts_tree_shapes=len(names) == 1 and drafting.feature_path(names[0]) is None)


def check_args(args) -> None:
    """Every argument that can be checked without weights, checked before any
    model is fetched or compiled (a bad flag must not cost a 1.6 GB download)."""
    for flag, value, low in (("--max-new-tokens", args.max_new_tokens, 1),
                             ("--batch-size", args.batch_size, 1), ("--top-k", args.top_k, 0),
                             ("--width-bucket", args.width_bucket, 0)):
        if value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}.")
    if args.repeats < 0:
        raise ValueError(f"--repeats {args.repeats}: pass 0 (automatic) or a number of runs.")
    spec = args.draft or args.drafter
    for flag, value, names in (("--target-weights", args.target_weights, [args.target]),
                               ("--draft-weights", args.draft_weights,
                                drafting.parse_spec(spec))):
        for name in names:
            if (value == STORED and name != drafting.spec.MAG and not is_gguf(name)
                    and drafting.feature_path(name) is None):
                raise ValueError(f"{flag} stored keeps a GGUF file's blocks; {name} is not a "
                                 f"GGUF checkpoint: pass {flag} f32.")
    api.sampling_params(temperature=args.temperature, top_p=args.top_p, alpha=args.alpha,
                        beta=args.beta, lenience=args.lenience)
    check_spec(spec, args.k_matrix, args.target)
    head_vocab.check_size(args.drafter_head_vocab,
                          f"--drafter-head-vocab {args.drafter_head_vocab}")
    api.decoder_spec(args.method, drafter=draft_facts(spec, args.k_matrix), gamma=args.gamma,
                     verifier=args.verifier, tree=args.tree, temperature=args.temperature,
                     alpha=args.alpha, beta=args.beta, names=api.CLI_NAMES)
    names = drafting.parse_spec(spec)
    if args.method != "autoregressive":
        target_vocab = resolver.known_vocab_size(args.target)
        for name in names:
            vocab = (check_feature_head(name)["config"]["vocab_size"]
                     if drafting.feature_path(name) is not None
                     else resolver.known_vocab_size(name))
            if name != drafting.spec.MAG and None not in (vocab, target_vocab) \
                    and vocab != target_vocab:
                raise ValueError(f"drafter {name} ({vocab} tokens) and target {args.target} "
                                 f"({target_vocab}) do not share a vocabulary; speculative "
                                 "decoding needs one. Pick a drafter of the target's family, "
                                 "or --draft mag.")


def fetch_in_background(names) -> Callable[[], None]:
    """Starts fetching the registry models among ``names`` that are not in the
    cache yet, on a thread of their own; returns a function that waits for it
    and raises what it raised. The CPU kernel's first build (~20 s of a
    compiler on 2 cores) then runs while the first command's pair downloads
    (~35 s), not before it."""
    missing = [n for n in dict.fromkeys(names)
               if n in registry.MODELS and not registry.cached_path(n).is_file()]
    if not missing:
        return lambda: None
    errors: list[BaseException] = []

    def fetch_all():
        try:
            for name in missing:
                registry.local_path(name)
        except BaseException as err:  # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(err)

    thread = threading.Thread(target=fetch_all, name="specdec-jax-fetch", daemon=True)
    thread.start()

    def wait():
        thread.join()
        if errors:
            raise errors[0]

    return wait


def run(args) -> int:
    prompts = read_prompts(args)
    check_args(args)
    sp = api.sampling_params(temperature=args.temperature, top_p=args.top_p, alpha=args.alpha,
                             beta=args.beta, lenience=args.lenience)
    spec = args.draft or args.drafter
    names = drafting.parse_spec(spec)
    fetched = fetch_in_background([args.target, *names])
    kernel = cpu_kernels.enable(args.cpu_kernel != "off",
                                build_dir=fetch.cache_dir() / "kernels")
    fetched()
    speculative = args.method != "autoregressive"
    drafter_models = load_drafter_models(args, names, kernel) if speculative else {}
    # What each drafter model is stored as (auto resolves per model).
    args.draft_weights = ",".join(sorted({m[3] for m in drafter_models.values()})) or "f32"
    if args.target_weights == "auto":
        args.target_weights = STORED if stored_by_default(
            args, args.target, kernel and native_matmul.blocks_active()) else "f32"
    target, target_params, tokenizer = resolver.resolve(args.target, dtype=args.dtype,
                                                         kernel_layout=args.kernel_layout,
                                                         weights=args.target_weights)
    drafter = drafter_params = None
    if speculative:
        drafter, drafter_params = _load_drafter(args, spec, names, target, target_params,
                                                tokenizer, drafter_models)
        # Holds the drafters as loaded: a full head replaced by a restricted
        # one (--drafter-head-vocab) is freed only once this goes.
        drafter_models.clear()
    timer, gamma_choice = calibration.CallTimer(batch_size=args.batch_size), None
    if (args.gamma is None and args.k_matrix is None and hasattr(drafter, "extend")
            and args.tree is None
            and methods.get_method(args.method).kind == methods.CHAIN
            and not args.no_cost_model):
        gamma_choice = calibration.choose_gamma(
            target_name=args.target, drafter_name=names[0], target=target,
            target_params=target_params, drafter=drafter, drafter_params=drafter_params,
            timer=timer)
        args.gamma = gamma_choice["gamma"]
        if not args.json:
            print(explain_gamma(gamma_choice), flush=True)
    tree_auto = None
    if gamma_choice is not None and args.verifier is None and args.batch_size == 1 \
            and takes_trees(args, spec):
        tree_auto = calibration.choose_tree(
            gamma_choice=gamma_choice, target_name=args.target, drafter_name=names[0],
            target=target, target_params=target_params, drafter=drafter,
            drafter_params=drafter_params, timer=timer,
            with_next=cost.tree_scores_leaves(args.method))
        if not args.json:
            print(explain_tree_choice(tree_auto), flush=True)
    gamma = api.resolve_gamma(drafter, args.gamma) if drafter is not None else 0
    tree = tree_choice = None
    if tree_auto is not None and tree_auto["tree"] is not None:
        tree, tree_choice = tree_auto["tree"], tree_auto["timed"]
        gamma = TreeSpec.parse(tree).depth
    elif args.tree is not None and args.method != "autoregressive":
        # A tree's accepted path is at most its depth: the histograms' G.
        tree, gamma = args.tree, TreeSpec.parse(args.tree).depth
        if hasattr(drafter, "extend") and not args.no_cost_model:
            tree_choice = calibration.predict_tree(
                tree=tree, target_name=args.target, drafter_name=names[0], target=target,
                target_params=target_params, drafter=drafter, drafter_params=drafter_params,
                timer=timer, with_next=cost.tree_scores_leaves(args.method))
            if not args.json:
                print(explain_tree_prediction(tree_choice), flush=True)
    strategy = drafting_strategy(args, spec, gamma, tree, gamma_choice,
                                 tree_by_cost_model=tree_choice is not None and args.tree is None)
    if not args.json:
        print(f"drafting: {strategy}", flush=True)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}]) if args.chat
             else p for p in prompts]
    token_lists = [tokenizer.encode(t) for t in texts]
    common = dict(target=target, max_new_tokens=args.max_new_tokens, top_k=args.top_k,
                  eos_ids=tuple(tokenizer.eos_token_ids))
    runs = {args.method: api.make_generate_fn(
        drafter=drafter, method=args.method, gamma=None if tree else gamma or None,
        verifier=args.verifier, tree=tree,
        **common)}
    if not args.no_baseline and args.method != "autoregressive":
        runs["autoregressive"] = api.make_generate_fn(method="autoregressive", **common)

    results, texts = {}, {name: [] for name in runs}
    # A shape per width bucket: one compiled program per method and width.
    batches, real_rows = [], []
    for _, prompt, rows in batching.fixed_shape_batches(token_lists, args.batch_size,
                                                        args.width_bucket or None):
        batches.append(prompt)
        real_rows.append(len(rows))
    programs = {}

    def compiled(name: str, prompt):
        key = (name, prompt.tokens.shape)
        if key not in programs:
            programs[key] = timing.Compiled(runs[name], target_params, drafter_params, prompt,
                                            jax.random.PRNGKey(0), sp)
        return programs[key]

    outputs = {name: [] for name in runs}
    runs_s = {name: [[] for _ in batches] for name in runs}  # [batch][repeat]
    # Interleaved, batch by batch and repeat by repeat: a drift of this
    # machine's speed during the run (common on shared CPUs) then hits both
    # methods alike, and the median of the repeats drops a single slow call.
    repeat = 0
    while repeat == 0 or _more_repeats(args.repeats, repeat, runs_s):
        for batch_index, prompt in enumerate(batches):
            key = jax.random.PRNGKey(args.seed + batch_index)
            for name in runs:
                timed = compiled(name, prompt).time(target_params, drafter_params, prompt, key,
                                                    sp)
                runs_s[name][batch_index].append(timed.median_s)
                if repeat == 0:  # the same key: every repeat decodes the same tokens
                    outputs[name].append(timed.output)
                    out = timed.output
                    texts[name] += [tokenizer.decode(np.asarray(out.tokens[b, : out.lengths[b]]))
                                    for b in range(args.batch_size)]
        repeat += 1
    seconds = {name: [float(np.median(r)) for r in per_batch] for name, per_batch in runs_s.items()}
    for name in runs:
        results[name] = _summary(outputs[name], seconds[name],
                                 0 if name == "autoregressive" else gamma, name, real_rows)
    texts_out = texts[args.method][: len(prompts)]
    report = {"target": args.target, "draft": spec, "k_matrix": args.k_matrix,
              "repeats": repeat,
              "lenience": args.lenience, "method": args.method,
              "alpha": args.alpha, "gamma": gamma, "tree": tree,
              "verifier": args.verifier or (verify.DEFAULT_TREE_VERIFIER if tree
                                            else verify.VERIFIERS[0]),
              "temperature": args.temperature, "kernel_layout": args.kernel_layout,
              "drafter_head_vocab": args.drafter_head_vocab,
              "draft_weights": args.draft_weights, "target_weights": args.target_weights,
              "cpu_kernel": kernel,
              "results": results,
              "environment": timing.environment(),
              "precision": str(getattr(getattr(target, "config", None), "dtype", "float32"))}
    if "autoregressive" in results and args.method != "autoregressive":
        report["speedup_vs_autoregressive"] = round(
            results["autoregressive"]["seconds"] / results[args.method]["seconds"], 3)
    if gamma and not args.no_cost_model and tree is not None:
        report["cost_model"] = calibration.price_tree_run(
            tree=tree, target=target, target_params=target_params, drafter=drafter,
            drafter_params=drafter_params, run=results[args.method], timer=timer,
            with_next=cost.tree_scores_leaves(args.method),
            alpha=tree_choice["alpha"] if tree_choice else cost.DEFAULT_ALPHA)
    elif gamma and not args.no_cost_model:
        report["cost_model"] = calibration.price_chain_run(
            target=target, target_params=target_params, drafter=drafter,
            drafter_params=drafter_params, gamma=gamma, run=results[args.method],
            timer=timer)
    report["drafting"] = strategy
    if gamma_choice is not None:
        report["gamma_choice"] = gamma_choice
    if tree_auto is not None:
        report["tree_choice"] = {k: v for k, v in tree_auto.items() if k != "timed"}
    if tree_choice is not None:
        report["tree_prediction"] = tree_choice
    if args.json:
        report["completions"] = texts_out
        if "autoregressive" in texts and args.method != "autoregressive":
            # The target alone's: at T = 0 with a row-independent (stored, CPU) target,
            # equal to the completions above, which a user can check.
            report["autoregressive_completions"] = texts["autoregressive"][: len(prompts)]
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    for prompt, text in zip(prompts, texts_out):
        print(f"--- prompt ---\n{prompt}\n--- completion ---\n{text}\n")
    for name, summary in results.items():
        print(f"[{name}] " + ", ".join(f"{k}={v}" for k, v in summary.items()
                                        if k not in PER_BATCH_KEYS))
    if "speedup_vs_autoregressive" in report:
        machine = report["environment"]["machine"]
        print(f"speedup over autoregressive {args.target}: "
              f"{report['speedup_vs_autoregressive']}x (same run, timed prompt by prompt in "
              f"turn, median of {repeat}; {machine}, "
              f"{report['precision']}, compile time excluded)")
        print(f"  target weights {args.target_weights}, drafter weights "
              f"{args.draft_weights}; CPU kernel {'on' if kernel else 'off'} "
              "(--target-weights, --draft-weights, --cpu-kernel)")
    if report.get("cost_model"):
        measured_speedup = report.get("speedup_vs_autoregressive")
        print(explain_tree(report["cost_model"], measured_speedup) if tree is not None
              else explain(report["cost_model"], measured_speedup, gamma))
    return 0
