"""What each drafter setting buys on the README's first command, timed interleaved.

The first command's pair (``specdec-jax generate``: Qwen2.5-Coder 0.5B drafting
for 1.5B, greedy) under drafter variants, each compiled once, then every prompt
timed under every variant in turn (``repeats`` passes), so the ratios come
from one run on one machine state. A variant (a dict in ``variants``) sets:

* ``gamma``: the draft length;
* ``head_vocab``: the drafter's output head cut to that many tokens
  (``drafting.head_vocab``; 0 keeps the full head);
* ``catch_up_widths``: ``[1]`` feeds a lagging draft by 1-token calls (the CPU
  default), ``[1, 2]`` by one 2-token call;
* ``draft_weights``: ``f32``, ``bf16`` or ``int8`` (``models.weight_storage``);
* ``kernel``: few-row products through the CPU kernel (``native.matmul``) or
  XLA's dot, fixed when the variant is compiled (the target too);
* ``tree`` (optional): a token tree per round instead of a chain of
  ``gamma`` drafts (``gamma = 0`` then): widths per depth or
  ``'dynamic:DEPTH,EXPAND,CHILDREN'`` drafted by the drafter model
  (``api.make_generate_fn(tree=...)``; the greedy tree verifier), or
  ``'trie:NODES,DEPTH'``, Max-Gram's best-first tree over the ``bigram_table``'s
  continuations (no drafter model: its weights fields are then unused).

Prompts: the first command's three, or the first ``num_prompts`` of a task
(``task = 'humaneval'``), each decoded alone (batch 1) at its own length
rounded up to a multiple of ``width_bucket`` tokens (one compiled program per
variant and width; 0 pads every prompt to the longest, one program per
variant, which charges every prompt the longest prompt's prefill: twice on
the speculative side, target and drafter). The speedup of each variant over
the target is the ratio of total seconds with a bootstrap 95% interval over
prompts. The outputs must equal the target's token for token (checked: every
variant is exact; the job fails after writing its report if one is not).

    python -m benchmarks.main --gin_file=benchmarks/configs/drafter_variants.gin \\
        --gin_bindings="bench_drafter_variants.out = 'results/variants.json'"
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import jax
import numpy as np

from benchmarks import shared
from benchmarks.trees import TRIE_PREFIX, parse_trie
from specdec_jax import api, precision
from specdec_jax.data import batching, bigram, metrics, tasks
from specdec_jax.decode.tree import TreeSpec
from specdec_jax.drafting import ModelDrafter
from specdec_jax.drafting.tree import MaxGramTrieDrafter
from specdec_jax.jobs import tables
from specdec_jax.jobs.cli.generate import DEFAULT_DRAFTER, DEFAULT_PROMPTS, DEFAULT_TARGET
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.models import weight_storage
from specdec_jax.native import matmul as native_matmul
from specdec_jax.runtime import cpu_kernels, timing
from specdec_jax.runtime.progress import tqdm

TARGET_VARIANT = "autoregressive target"
VARIANT_FIELDS = {"name": str, "gamma": int, "head_vocab": int, "catch_up_widths": list,
                  "draft_weights": str, "kernel": bool}
OPTIONAL_FIELDS = {"tree": ""}


def check_variants(variants: Sequence[dict]) -> list[dict]:
    """Every variant has exactly the fields of ``VARIANT_FIELDS``, unique names."""
    if not variants:
        raise ValueError("variants is empty; give at least one drafter variant.")
    checked = []
    for variant in variants:
        variant = {**OPTIONAL_FIELDS, **dict(variant)}
        if sorted(variant) != sorted({**VARIANT_FIELDS, **OPTIONAL_FIELDS}):
            raise ValueError(f"variant {variant!r}: give exactly the fields "
                             f"{sorted(VARIANT_FIELDS)} (and optionally "
                             f"{sorted(OPTIONAL_FIELDS)}).")
        weight_storage.check_format(variant["draft_weights"])
        if variant["tree"]:
            check_tree(variant)
        else:
            shared.check_at_least(1, gamma=variant["gamma"])
        variant["catch_up_widths"] = tuple(variant["catch_up_widths"])
        checked.append(variant)
    names = [v["name"] for v in checked]
    if len(set(names)) != len(names) or TARGET_VARIANT in names:
        raise ValueError(f"variant names must be unique and not {TARGET_VARIANT!r}: {names}.")
    return checked


def check_tree(variant: dict) -> None:
    """A tree variant: a well-formed tree, ``gamma = 0``, the full drafter head."""
    tree = variant["tree"]
    if tree.startswith(TRIE_PREFIX):
        parse_trie(tree)
    else:
        TreeSpec.parse(tree)  # raises on a malformed shape
    if variant["gamma"] != 0:
        raise ValueError(f"variant {variant['name']!r}: a tree sets its own size; give "
                         f"gamma = 0 with tree = {tree!r}.")
    if variant["head_vocab"]:
        raise ValueError(f"variant {variant['name']!r}: tree variants draft with the full "
                         "head; give head_vocab = 0.")


def run_bench_drafter_variants(*, target: str = DEFAULT_TARGET, drafter: str = DEFAULT_DRAFTER,
                               variants: Sequence[dict] = (), max_new_tokens: int = 64,
                               repeats: int = 2, task: str | None = None, num_prompts: int = 3,
                               out: str | None = None, markdown_path: str | None = None,
                               bigram_table: str = "qwen2.5-coder",
                               width_bucket: int = 32) -> dict:
    """Seconds, speedup over the target (95% CI over prompts) and tokens per
    target call of each drafter variant (module docstring); JSON at ``out`` if
    given, the Markdown printed (and written to ``markdown_path`` if given).
    ``bigram_table`` ranks the tokens a cut head keeps (``bigram.restrict_head``).
    Raises after writing the report if a variant's tokens differ from the
    target's."""
    variants = check_variants(variants)
    shared.check_at_least(1, max_new_tokens=max_new_tokens, repeats=repeats,
                          num_prompts=num_prompts)
    shared.check_at_least(0, width_bucket=width_bucket)
    settings = {"target": target, "drafter": drafter, "variants": variants, "task": task,
                "max_new_tokens": max_new_tokens, "repeats": repeats, "out": out,
                "width_bucket": width_bucket}
    if bigram_table != "qwen2.5-coder":
        settings["bigram_table"] = bigram_table
    texts = (list(DEFAULT_PROMPTS) if task is None
             else [ex.prompt for ex in tasks.get_task(task).load("test", num_prompts)])
    pair = load_pair(target=target, drafter=drafter)
    common = dict(target=pair.target, max_new_tokens=max_new_tokens, eos_ids=pair.eos_ids)
    sp = api.sampling_params(temperature=0.0)
    prompts = _prompts([pair.encode(text) for text in texts], width_bucket)
    key = jax.random.PRNGKey(0)
    target_params = pair.target_params
    kernel_built = any(v["kernel"] for v in variants) and cpu_kernels.enable()
    programs = {TARGET_VARIANT: (api.make_generate_fn(method="autoregressive", **common),
                                 pair.drafter_params, False)}
    for v in variants:
        model = pair.drafter
        params = weight_storage.store_weights(pair.drafter_params, v["draft_weights"],
                                              kernel_layout=model.config.kernel_layout)
        if v["head_vocab"]:
            model, params = bigram.restrict_head(model, params, v["head_vocab"],
                                                 eos_ids=pair.eos_ids, table=bigram_table)
        if v["kernel"] and not kernel_built:
            raise RuntimeError(f"variant {v['name']!r} asks for the CPU kernel, which could not "
                               "be built here (see the warning above).")
        if v["tree"].startswith(TRIE_PREFIX):
            nodes, depth = parse_trie(v["tree"])
            fn = api.make_generate_fn(
                drafter=MaxGramTrieDrafter(pair.target.vocab_size, num_nodes=nodes, depth=depth),
                method="specdecode", verifier="greedy", **common)
            params = np.asarray(bigram.load_table(
                bigram_table, pair.target.vocab_size, columns=bigram.TOP_K))
        elif v["tree"]:
            fn = api.make_generate_fn(drafter=ModelDrafter(model), method="specdecode",
                                      verifier="greedy", tree=v["tree"], **common)
        else:
            fn = api.make_generate_fn(
                drafter=ModelDrafter(model, catch_up_widths=v["catch_up_widths"]),
                method="specdecode", gamma=v["gamma"], **common)
        programs[v["name"]] = (fn, params, v["kernel"])
    compiled = {}  # (variant, prompt width) -> executable
    for name, (fn, params, kernel) in programs.items():
        native_matmul.set_enabled(kernel)  # fixed in the program when it is traced
        for prompt in prompts:
            width = prompt.tokens.shape[1]
            if (name, width) not in compiled:
                compiled[name, width] = timing.Compiled(fn, target_params, params, prompt,
                                                        key, sp)
    native_matmul.set_enabled(True)
    seconds = {name: [0.0] * len(prompts) for name in programs}
    tokens = dict.fromkeys(programs, 0)
    calls = dict.fromkeys(programs, 0)
    outputs: dict[str, list] = {name: [] for name in programs}
    passes = [(index, prompt) for _ in range(repeats) for index, prompt in enumerate(prompts)]
    for index, prompt in tqdm(passes, desc="prompts (every variant in turn)"):
        for name in programs:
            executable = compiled[name, prompt.tokens.shape[1]]
            run = executable.time(target_params, programs[name][1], prompt, key, sp)
            seconds[name][index] += run.median_s
            tokens[name] += int(np.asarray(run.output.lengths).sum())
            calls[name] += int(np.asarray(run.output.stats.target_calls).sum())
            outputs[name].append(np.asarray(run.output.tokens).tolist())
    reference = outputs[TARGET_VARIANT]
    same = {name: out == reference for name, out in outputs.items()}
    base = seconds[TARGET_VARIANT]
    speedup = {name: metrics.bootstrap_ci(list(zip(base, per_prompt)), _ratio_of_totals)
               for name, per_prompt in seconds.items()}
    env = timing.environment()
    source = f"{len(prompts)} {task} prompts" if task else f"{len(prompts)} prompts"
    widths = sorted({int(p.tokens.shape[1]) for p in prompts})
    lines = [f"{target} / {drafter}, greedy, {source} x {repeats}, {max_new_tokens} new tokens, "
             f"prompt widths {widths}, {env['machine']}, {precision.resolve_dtype('auto')}, "
             f"jax {env['jax']}"]
    lines += tables.markdown_table(
        ("variant", "seconds", "speedup vs target (95% CI)", "tokens per target call",
         "same tokens"),
        [(name, f"{sum(seconds[name]):.1f}",
          tables.format_ci(speedup[name][0], speedup[name][1:], digits=2, unit="x"),
          f"{tokens[name] / max(calls[name], 1):.2f}", same[name]) for name in programs])
    timing.print_markdown("\n".join(lines), markdown_path)
    report = {"settings": settings, "environment": env,
              "seconds": {name: sum(v) for name, v in seconds.items()},
              "seconds_per_prompt": seconds, "speedup_ci95": speedup, "tokens": tokens,
              "target_calls": calls, "same_tokens_as_target": same}
    if out:
        pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(out).write_text(json.dumps(report, indent=1))
    if not all(same.values()):
        raise RuntimeError(f"drafter variants {[n for n, s in same.items() if not s]} wrote "
                           "other tokens than the autoregressive target (every variant must be "
                           f"exact){'; report in ' + out if out else ''}.")
    return report


def _prompts(encoded: Sequence[Sequence[int]], width_bucket: int) -> list:
    """One batch-1 ``Prompt`` per text: at its own length rounded up to
    ``width_bucket``, or (0) every one padded to the longest."""
    if not width_bucket:
        return [p for _, p, _ in batching.fixed_shape_batches(encoded, 1)]
    return [batching.make_prompt([list(ids)], pad_to=batching.bucketed_width(
        len(ids), width_bucket)) for ids in encoded]


def _ratio_of_totals(pairs) -> float:
    """Target seconds over variant seconds, summed over the resampled prompts."""
    return sum(t for t, _ in pairs) / sum(v for _, v in pairs)
