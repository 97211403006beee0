"""Chains against token trees on a real pair: tokens per target call, the tree
verifiers compared on the same trees, and predicted accelerator speedups.

The pair (Qwen2.5-Coder 1.5B target, 0.5B drafter by default) on the first
``num_prompts`` prompts of a task (HumanEval), each prompt decoded at batch 1
by the jitted decoding loops (``decode.chain`` for chains, ``decode.tree`` for
trees; one compiled program per configuration, the prompts right-padded to
one width). A configuration (a dict in ``configs``) is:

* ``drafter``: ``'model'`` (the drafter model) or ``'mag'`` (Max-Gram over the
  ``bigram_table``: chains and static trees read its one continuation per
  token, best-first trees its ``bigram.TOP_K`` continuations, ``bigram.load_table``);
* ``tree``: ``'chain:G'`` (the chain decoder, G drafts), static widths per
  depth (``'3,2,1,1'``), ``'dynamic:DEPTH,EXPAND,CHILDREN'`` (EAGLE-2's
  dynamic tree, model drafters only; ``decode.tree.TreeSpec``), or
  ``'trie:NODES,DEPTH'`` (Max-Gram only: ``drafting.tree.MaxGramTrieDrafter``,
  a best-first tree of NODES nodes, at most DEPTH deep);
* ``temperature``;
* ``verifiers``: a chain takes one chain verifier (``token``, ``block``); a
  tree takes tree verifiers (``verify.TREE_VERIFIERS``), the first drives
  the decoding and, at T > 0, every other one is run on the *same* trees and
  laws in the same rounds (``PairedTreeDecoder``), so their acceptance lengths
  are paired round by round;
* ``name`` (optional): the row's label.

With ``replay`` (a file path), the T = 0 Max-Gram configurations are counted
by replaying their rounds against the target's greedy output
(``tree_replay``: exact at T = 0, no target call; the output is computed once
by autoregressive decoding and stored in that file); ``replay_check`` runs
them in the real loop too and records whether every prompt's accepted
histogram equals the replay's.

Figures, per configuration (95% intervals: percentile bootstrap over prompts,
``metrics.bootstrap_ci``):

* tokens per target call = mean accepted drafts per round + 1 (from the
  accepted histogram: the last round's truncation at ``max_new_tokens`` is not
  counted against it), and tokens emitted / target calls beside it;
* at T = 0, whether every prompt's output equals the first T = 0
  configuration's (greedy decoding of the target: they must all agree);
* at T > 0 with several verifiers, each one's tokens per target call on the
  same trees and the paired difference to the driving verifier;
* predicted speedup over the autoregressive target at batch 1 on each GPU of
  ``gpu_steps`` (in-loop step costs measured on that GPU from random weights of
  the real shapes: ``bench_feature_steps`` or ``bench_accelerator`` reports):
  ``sum(accepted + 1) x t_target(1) / (rounds x t_target(W) + drafter calls)``
  (``decode.cost.CostModel``), ``W`` the target call's width (``G + 1`` for a
  chain, ``N + 1`` for a tree of N nodes). A width the report did not measure
  is priced by the least-squares line through its K >= 2 steps, labelled
  *fit* inside the measured range and *extrapolated* beyond it; drafter calls
  wider than the widths measured likewise. Max-Gram is priced by the
  report's timed drafting where it has it (``bench_accelerator``'s
  ``max_gram``: one lookup per chain draft, one best-first tree per trie
  round of a timed budget, other Max-Gram trees unpriced), else at zero (the
  H100 / H200 reports so far). Modelled, not measured;
* the same on each TPU chip of ``tpu_reports`` (``jobs.tpu_compile``'s
  reports, by chip: the compiler's ``optimal_seconds`` of the per-call
  programs, read as ``tpu_compile.program_seconds`` reads them: **TPU compiler
  estimates**, nothing ran on a TPU): the target's ``target_k<K>`` and
  ``target_tree_w<W>`` programs, the drafter's ``drafter_k1`` and
  ``drafter_tree_w<W>``; Max-Gram is priced there, one ``maxgram_step`` per
  chain draft and one ``maxgram_trie`` per best-first tree of the compiled
  budget (``tpu_programs.TREE_TRIE``); a Max-Gram tree without a program is
  left unpriced.

Prices are recomputed from the stored rows on every run, so a new step report
reprices a finished run without decoding again (nothing is loaded when every
configuration is stored).

    python -m benchmarks.main --gin_file=benchmarks/configs/trees.gin
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import shared, tree_replay
from specdec_jax import api, precision
from specdec_jax.data import bigram, metrics, tasks
from specdec_jax.decode import cost as cost_lib
from specdec_jax.decode.tree import TreeDecoder, TreeSpec
from specdec_jax.drafting import MaxGramDrafter, ModelDrafter
from specdec_jax.drafting.tree import MaxGramTreeDrafter, MaxGramTrieDrafter, TreeShape
from specdec_jax.jobs import tables
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import compile_job as tpu_compile
from specdec_jax.jobs.tpu import programs as tpu_programs
from specdec_jax.models import weight_storage
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm
from specdec_jax.verify import VERIFIERS, get_verifier

DRAFTERS = ("model", "mag")
CONFIG_FIELDS = ("drafter", "tree", "temperature", "verifiers")
CHAIN_PREFIX = "chain:"
TRIE_PREFIX = "trie:"  # Max-Gram's best-first tree: 'trie:NODES,DEPTH'
DRAFTER_NAME = "drafter"  # the drafter model's name in the pair's params and counters
DEFAULT_GPU_STEPS = {"H100": "benchmarks/reports/bench_feature_steps_gpu_h100.json",
                     "H200": "benchmarks/reports/bench_accelerator_gpu_h200.json"}


# --- configurations (checked before anything loads) ------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    drafter: str
    tree: str
    temperature: float
    verifiers: tuple[str, ...]

    @property
    def is_chain(self) -> bool:
        return self.tree.startswith(CHAIN_PREFIX)

    @property
    def gamma(self) -> int:
        return int(self.tree[len(CHAIN_PREFIX):])

    @property
    def is_trie(self) -> bool:
        return self.tree.startswith(TRIE_PREFIX)

    @property
    def trie(self) -> tuple[int, int]:
        """(nodes, depth) of a ``'trie:NODES,DEPTH'`` tree."""
        nodes, depth = parse_trie(self.tree)
        return nodes, depth

    @property
    def spec(self) -> TreeSpec:
        return TreeSpec.parse(self.tree)

    @property
    def num_nodes(self) -> int:
        if self.is_trie:
            return self.trie[0]
        return self.gamma if self.is_chain else self.spec.num_nodes

    @property
    def depth(self) -> int:
        if self.is_trie:
            return self.trie[1]
        return self.gamma if self.is_chain else self.spec.depth

    @property
    def kind(self) -> str:
        if self.is_chain:
            return "chain"
        if self.is_trie:
            return "best-first"
        return "dynamic" if self.spec.dynamic is not None else "static"

    @property
    def bigram_columns(self) -> int:
        """Continuations per token a Max-Gram configuration reads from the
        table: ``bigram.TOP_K`` for a best-first tree, else 1."""
        return bigram.TOP_K if self.is_trie else 1

    def as_dict(self) -> dict:
        config = {"name": self.name, "drafter": self.drafter, "tree": self.tree,
                  "temperature": self.temperature, "verifiers": list(self.verifiers)}
        if self.is_trie:  # rows stored before the trees read K columns are counted again
            config["bigram_columns"] = self.bigram_columns
        return config


def parse_trie(tree: str) -> tuple[int, int]:
    """``'trie:NODES,DEPTH'`` -> (NODES, DEPTH), both >= 1."""
    parts = tree[len(TRIE_PREFIX):].split(",")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"tree {tree!r}: a Max-Gram best-first tree is 'trie:NODES,DEPTH' "
                         "(e.g. 'trie:32,8').")
    return int(parts[0]), int(parts[1])


def max_gram_tree_drafter(config: Config, vocab: int):
    """The tree drafter a Max-Gram configuration decodes with: the best-first
    tree, or the static one (a chain is the static tree of width 1, which
    proposes the chain drafter's tokens: what the replay runs)."""
    if config.is_trie:
        nodes, depth = config.trie
        return MaxGramTrieDrafter(vocab, num_nodes=nodes, depth=depth)
    widths = (1,) * config.gamma if config.is_chain else config.spec.widths
    return MaxGramTreeDrafter(vocab, TreeShape.from_widths(widths))


def max_gram_tables(bigram_table: str, vocab: int, configs: Sequence[Config]) -> dict:
    """The Max-Gram configurations' bigram tables by the columns they read
    (``Config.bigram_columns``): int32 [V] for chains and static trees,
    [V, ``bigram.TOP_K``] for best-first trees (``bigram.load_table``)."""
    return {c.bigram_columns: jnp.asarray(bigram.load_table(bigram_table, vocab,
                                                            columns=c.bigram_columns))
            for c in configs if c.drafter == "mag"}


def check_configs(configs: Sequence[dict]) -> list[Config]:
    """Every configuration well formed (module docstring), names unique."""
    if not configs:
        raise ValueError("configs is empty; give at least one configuration.")
    checked = []
    for raw in configs:
        raw = dict(raw)
        fields = sorted(set(raw) - {"name"})
        if fields != sorted(CONFIG_FIELDS):
            raise ValueError(f"configuration {raw!r}: give exactly the fields "
                             f"{list(CONFIG_FIELDS)} (and an optional 'name').")
        shared.check_choices("a configuration's drafter", raw["drafter"], DRAFTERS)
        shared.check_temperatures("a configuration's temperature", raw["temperature"])
        tree = str(raw["tree"]).replace(" ", "")
        verifiers = raw["verifiers"]
        verifiers = (verifiers,) if isinstance(verifiers, str) else tuple(verifiers)
        if not verifiers:
            raise ValueError(f"configuration {raw!r}: verifiers is empty.")
        temperature = float(raw["temperature"])
        if tree.startswith(CHAIN_PREFIX):
            gamma = tree[len(CHAIN_PREFIX):]
            if not gamma.isdigit() or int(gamma) < 1:
                raise ValueError(f"configuration {raw!r}: a chain is 'chain:G' with G >= 1.")
            if len(verifiers) != 1 or verifiers[0] not in VERIFIERS:
                raise ValueError(f"configuration {raw!r}: a chain takes one chain verifier, "
                                 f"one of {', '.join(VERIFIERS)}.")
        elif tree.startswith(TRIE_PREFIX):
            parse_trie(tree)
            if raw["drafter"] != "mag":
                raise ValueError(f"configuration {raw!r}: 'trie:' trees are Max-Gram's; give "
                                 "a model drafter widths or 'dynamic:...'.")
            for name in verifiers:
                get_verifier(name, tree=True)
            if temperature == 0 and len(verifiers) > 1:
                raise ValueError(f"configuration {raw!r}: at T = 0 every tree verifier is "
                                 "the greedy one; compare verifiers at T > 0.")
        else:
            spec = TreeSpec.parse(tree)  # raises on a malformed shape
            if raw["drafter"] == "mag" and spec.dynamic is not None:
                raise ValueError(f"configuration {raw!r}: Max-Gram trees are static (its "
                                 "children carry no probability to rank); give widths.")
            for name in verifiers:
                get_verifier(name, tree=True)  # raises on an unknown name
            if len(set(verifiers)) != len(verifiers):
                raise ValueError(f"configuration {raw!r}: a verifier is named twice.")
            if temperature == 0 and len(verifiers) > 1:
                raise ValueError(f"configuration {raw!r}: at T = 0 every tree verifier is "
                                 "the greedy one; compare verifiers at T > 0.")
        name = raw.get("name") or f"{raw['drafter']} {tree} T={temperature:g} {verifiers[0]}"
        checked.append(Config(name=name, drafter=raw["drafter"], tree=tree,
                              temperature=temperature, verifiers=verifiers))
    names = [c.name for c in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique: {names}.")
    return checked


# --- GPU step costs --------------------------------------------------------------------------

def load_gpu_steps(path: str) -> dict:
    """In-loop step seconds by width, ``{"target": {K: s}, "drafter": {K: s},
    "device": str}``, from a ``bench_feature_steps`` report (``steps``: rows
    named ``target K=..`` / ``drafter model K=..``) or a ``bench_accelerator``
    report (``by_dtype[dtype].steps[role][batch 1][K]``; the first dtype), with
    Max-Gram's timed drafting (``mag_step_s``, ``mag_trie_s``) where the
    report has it (``bench_accelerator``'s ``max_gram``)."""
    data = json.loads(pathlib.Path(path).read_text())
    env = data.get("environment", {})
    device = env.get("device_kind") or env.get("machine", "?")
    steps: dict = {"target": {}, "drafter": {}, "device": device}
    if isinstance(data.get("steps"), list):
        for row in data["steps"]:
            if row.get("status") != "ok" or row.get("part") != "extend":
                continue
            role = {"target": "target", "drafter model": "drafter"}.get(row.get("role"))
            if role:
                steps[role][int(row["k"])] = row["step_ms"] / 1e3
    elif "by_dtype" in data:
        section = next(iter(data["by_dtype"].values()))
        for role in ("target", "drafter"):
            for k, row in section["steps"].get(role, {}).get("1", {}).items():
                steps[role][int(k)] = row["step_s"]
        if "max_gram" in section:  # reports since Max-Gram's drafting is timed there
            steps.update(mag_step_s=section["max_gram"]["lookup_s"],
                         mag_trie_s=dict(section["max_gram"]["trie_s"]))
    for role in ("target", "drafter"):
        if 1 not in steps[role]:
            raise ValueError(f"{path}: no one-token {role} step at batch 1; give a "
                             "bench_feature_steps or bench_accelerator report.")
    return steps


def load_tpu_steps(paths: Sequence[str]) -> dict:
    """Per-call seconds from TPU compile reports of one chip (in order of
    preference; module docstring), in ``load_gpu_steps``' form plus the
    Max-Gram programs: ``{"target": {K: s}, "drafter": {K: s}, "mag_step_s":
    s | None, "mag_trie_s": {tree: s}, "device": str, "estimate": True}``."""
    reports = [tpu_compile.read_report(path) for path in paths]
    seconds = lambda name: (tpu_compile.program_seconds(reports, name) or {}).get(  # noqa: E731
        "estimate_s")
    topology = reports[0].get("settings", {}).get("topology", "?")
    steps: dict = {"target": {}, "drafter": {}, "estimate": True,
                   "device": f"TPU {topology}, one chip ({tpu_aot.ESTIMATE})"}
    widths = {"target": [(k, f"target_k{k}") for k in range(1, tpu_programs.MAX_SCORING_WIDTH + 1)]
              + [(w, f"target_tree_w{w}") for w in tpu_programs.TREE_TARGET_WIDTHS],
              "drafter": [(1, "drafter_k1")]
              + [(w, f"drafter_tree_w{w}") for w in tpu_programs.TREE_DRAFTER_WIDTHS]}
    for role, programs in widths.items():
        for width, name in programs:
            if (s := seconds(name)) is not None:
                steps[role][width] = s
        if 1 not in steps[role]:
            raise ValueError(f"{', '.join(paths)}: no positive {tpu_aot.ESTIMATE} of the "
                             f"{role}'s one-token step; compile the per-call programs "
                             "(configs/runs/tpu_compile.gin).")
    steps["mag_step_s"] = seconds("maxgram_step")
    trie = seconds("maxgram_trie")
    steps["mag_trie_s"] = {} if trie is None else {tpu_programs.TREE_TRIE: trie}
    return steps


def max_gram_round_s(config: Config, steps: dict) -> float | None:
    """Seconds of one round's Max-Gram drafting: ``G`` lookups for a chain,
    the timed (or compiled) best-first tree for a trie of its budget, else
    None (not priced); 0 where the steps have no Max-Gram figures at all (a
    GPU report from before they were timed: Max-Gram free, module docstring)."""
    if config.drafter != "mag" or "mag_step_s" not in steps:
        return 0.0
    if config.is_chain and steps.get("mag_step_s") is not None:
        return config.gamma * steps["mag_step_s"]
    return steps.get("mag_trie_s", {}).get(config.tree)


def width_status(steps_by_width: dict, width: int) -> str:
    """How a width is priced: measured, fit (inside the measured range) or
    extrapolated (beyond it)."""
    if width in steps_by_width:
        return "measured"
    return "fit" if width < max(steps_by_width) else "extrapolated"


def cost_model(steps: dict, drafter_names: Sequence[str]) -> cost_lib.CostModel:
    drafter = cost_lib.CallCost.from_steps(steps["drafter"])
    return cost_lib.CostModel(target=cost_lib.CallCost.from_steps(steps["target"]),
                              drafter=drafter,
                              models={name: drafter for name in drafter_names})


# --- decoding --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PairedTreeDecoder(TreeDecoder):
    """A ``TreeDecoder`` whose rounds also run ``others`` (tree verifiers) on the
    round's tree and laws, with the same key; the configured verifier still
    drives the decoding. Each round hands ``sink`` the accepted depths
    (int32 [1 + len(others), B]: the driving verifier's first) through a host
    callback. Only at T > 0 (at T = 0 the driving verdict is greedy's, which
    the others' are not)."""

    others: tuple = ()
    sink: Callable | None = None

    def run_verifier(self, key, tree, q_BxN1xV, pi_BxN1xV, sp):
        verdict = super().run_verifier(key, tree, q_BxN1xV, pi_BxN1xV, sp)
        if self.others and self.sink is not None:
            accepted = jnp.stack([verdict.num_accepted] + [
                other(key, tree, q_BxN1xV, pi_BxN1xV).num_accepted for other in self.others])
            jax.debug.callback(self.sink, accepted)
        return verdict


def build_decoder(config: Config, *, pair, drafter_name: str, vocab: int,
                  max_new_tokens: int, sink: Callable | None = None):
    """The configuration's decoder (``api.make_decoder``; a ``PairedTreeDecoder``
    when it compares verifiers)."""
    chain = (ModelDrafter(pair.drafter, name=drafter_name) if config.drafter == "model"
             else MaxGramDrafter(vocab))
    common = dict(target=pair.target, drafter=chain, verifier=config.verifiers[0],
                  max_new_tokens=max_new_tokens, eos_ids=pair.eos_ids)
    if config.is_chain:
        return api.make_decoder(gamma=config.gamma, **common)
    if config.is_trie:
        decoder = api.make_decoder(**{**common, "drafter": max_gram_tree_drafter(config, vocab)})
    else:
        decoder = api.make_decoder(tree=config.tree, **common)
    if len(config.verifiers) > 1:
        fields = {f.name: getattr(decoder, f.name) for f in dataclasses.fields(TreeDecoder)}
        decoder = PairedTreeDecoder(
            **fields, others=tuple(get_verifier(v, tree=True) for v in config.verifiers[1:]),
            sink=sink)
    return decoder


def run_config(config: Config, decoder, target_params, drafter_params, prompts, width,
               received: list, seed: int = 0) -> list[dict]:
    """Per-prompt counters of one configuration (batch 1, one compiled program)."""
    sp = api.sampling_params(temperature=config.temperature)
    fn = jax.jit(decoder.generate)
    rows = []
    for index, tokens in enumerate(tqdm(prompts, desc=config.name)):
        received.clear()
        out = fn(target_params, drafter_params, make_prompt([tokens], pad_to=width),
                 jax.random.PRNGKey(1000 * seed + index), sp)
        out = jax.device_get(out)
        jax.effects_barrier()  # every round's host callback has run
        stats = out.stats
        histogram = np.asarray(stats.accepted_histogram[0], np.int64)
        length = int(out.lengths[0])
        row = {"prompt": index, "tokens": np.asarray(out.tokens[0, :length]).tolist(),
               "rounds": int(histogram.sum()),
               "accepted": int((histogram * np.arange(len(histogram))).sum()),
               "histogram": histogram.tolist(),
               "nan_logits": int(stats.nan_logits[0])}
        for name in cost_lib.PRICED_FIELDS:
            value = np.asarray(getattr(stats, name))[0]
            row[name] = value.tolist() if value.ndim else int(value)
        if len(config.verifiers) > 1:
            accepted = np.stack(received) if received else np.zeros((0, len(config.verifiers)))
            row["paired_rounds"] = int(accepted.shape[0])
            row["paired_accepted"] = {v: int(accepted[:, i].sum())
                                      for i, v in enumerate(config.verifiers)}
        rows.append(row)
    return rows


# --- figures ---------------------------------------------------------------------------------

def _per_call(items) -> float:
    """Tokens per target call of (accepted, rounds) items: mean accepted + 1."""
    rounds = sum(r for _, r in items)
    return (sum(a for a, _ in items) + rounds) / max(rounds, 1)


def summarize(config: Config, rows: list[dict], gpu: dict, drafter_names: Sequence[str],
              reference: list[dict] | None) -> dict:
    items = [(r["accepted"], r["rounds"]) for r in rows]
    summary = {
        "config": config.as_dict(), "kind": config.kind, "num_nodes": config.num_nodes,
        "depth": config.depth, "target_width": config.num_nodes + 1,
        "tokens_per_target_call_ci95": metrics.bootstrap_ci(items, _per_call),
        "emitted_per_target_call": sum(len(r["tokens"]) for r in rows) /
        max(sum(r["target_calls"] for r in rows), 1),
        "rounds": sum(r["rounds"] for r in rows), "accepted": sum(r["accepted"] for r in rows),
        "histogram": np.sum([r["histogram"] for r in rows], axis=0).tolist(),
        "nan_logits": sum(r["nan_logits"] for r in rows)}
    if reference is not None:
        summary["identical_to_reference"] = all(
            a["tokens"] == b["tokens"] for a, b in zip(rows, reference))
    if len(config.verifiers) > 1:
        lead = config.verifiers[0]
        paired = {}
        for v in config.verifiers:
            v_items = [(r["paired_accepted"][v], r["paired_rounds"]) for r in rows]
            paired[v] = {"tokens_per_target_call_ci95": metrics.bootstrap_ci(v_items, _per_call)}
            if v != lead:
                lead_items = [(r["paired_accepted"][lead], r["paired_rounds"]) for r in rows]
                paired[v][f"{lead}_minus_this_ci95"] = metrics.paired_difference_ci(
                    lead_items, v_items, _per_call)
        summary["paired_verifiers"] = paired
        summary["paired_rounds_match"] = all(r["paired_rounds"] == r["rounds"] for r in rows)
    names = drafter_names if config.drafter == "model" else ()
    width = config.num_nodes + 1
    predicted = {}
    for label, steps in gpu.items():
        model = cost_model(steps, names)
        mag_s = max_gram_round_s(config, steps)
        if mag_s is None:
            continue
        # Per prompt: (AR seconds of its tokens, priced seconds of its calls).
        priced = [((r["accepted"] + r["rounds"]) * model.target.call_s(1),
                   model.price(r, drafters=names, widths={cost_lib.TARGET: width})
                   + r["rounds"] * mag_s)
                  for r in rows]

        drafter_widths = sorted({w for r in rows for w in _drafter_widths(r)})
        predicted[label] = {
            "speedup_ci95": metrics.bootstrap_ci(priced, _ratio_of_totals),
            "target_width_status": width_status(steps["target"], width),
            "target_call_s": model.target.call_s(width),
            "drafter_priced": bool(names), "max_gram_round_s": mag_s}
        if names:
            predicted[label]["drafter_extrapolated"] = any(
                w > max(steps["drafter"]) for w in drafter_widths)
    summary["predicted"] = predicted
    return summary


def _counted_by(summary: dict) -> str:
    """'loop', 'replay', or 'loop (replay equal k/n)' (module docstring)."""
    equal = summary.get("replay_equal_per_prompt")
    if equal is not None:
        return f"loop (replay equal on {sum(equal)}/{len(equal)})"
    return summary.get("counted_by", "loop")


def _ratio_of_totals(pairs) -> float:
    return sum(a for a, _ in pairs) / sum(b for _, b in pairs)


def _drafter_widths(row: dict) -> list[int]:
    """The widest drafter call a row can have made (fed / calls rounded up, a
    bound used only to say whether drafter calls were priced beyond the
    measured widths)."""
    calls, fed, single = (np.asarray(row[k]) for k in cost_lib.PRICED_FIELDS[3:])
    multi = calls - single
    return [int(-(-(f - s) // m)) for m, f, s in zip(multi, fed, single) if m > 0]


def markdown(report: dict) -> str:
    proto = report["protocol"]
    gpu = report.get("gpu", {})
    tpu = report.get("tpu", {})
    lines = [f"# Chains vs token trees: {proto['target']} / {proto['drafter']}, "
             f"{proto['task']} prompts 0-{proto['num_prompts'] - 1} x "
             f"{proto['max_new_tokens']} tokens, batch 1", ""]
    if report.get("note"):
        lines += [report["note"], ""]
    lines += [f"Machine (counts): {report.get('environment', {}).get('machine', '?')}; precision "
              f"{report.get('precision')}; drafter weights {proto['draft_weights']}; "
              f"decoding: {report.get('decoding')}.", ""]
    configs = report.get("configs", {})
    labels = [*gpu, *tpu]
    rows = []
    for s in configs.values():
        c = s["config"]
        ident = s.get("identical_to_reference")
        cells = [f"{c['temperature']:g}", c["drafter"], s["kind"], c["tree"], s["num_nodes"],
                 s["depth"], c["verifiers"][0], _counted_by(s),
                 tables.format_ci(s["tokens_per_target_call_ci95"][0],
                                  s["tokens_per_target_call_ci95"][1:], digits=2),
                 f"{s['emitted_per_target_call']:.2f}",
                 "" if ident is None else ("yes" if ident else "NO")]
        for label in labels:
            p = s["predicted"].get(label)
            if p is None:
                cells.append("not priced" if label in tpu else "")
                continue
            note = "" if p["target_width_status"] == "measured" else \
                f" ({p['target_width_status']})"
            cells.append(tables.format_ci(p["speedup_ci95"][0], p["speedup_ci95"][1:],
                                          digits=2, unit="x") + note)
        rows.append(cells)
    lines += tables.markdown_table(
        ("T", "drafter", "kind", "tree", "nodes N", "depth", "verifier", "counted by",
         "tokens / target call (95% CI)", "emitted / call", "same output (T=0)",
         *[f"predicted {label} speedup (95% CI)" for label in labels]), rows)
    ref = report.get("reference")
    if ref:
        lines += ["", f"Same output: each prompt's tokens equal those of `{ref}` (the first "
                  "T = 0 configuration; greedy decoding must give the target's output)."]
    paired_rows = []
    for name, s in configs.items():
        for v, p in s.get("paired_verifiers", {}).items():
            lead = s["config"]["verifiers"][0]
            diff = p.get(f"{lead}_minus_this_ci95")
            paired_rows.append((name, v + (" (drives)" if v == lead else ""),
                                tables.format_ci(p["tokens_per_target_call_ci95"][0],
                                                 p["tokens_per_target_call_ci95"][1:], digits=3),
                                "" if diff is None else
                                tables.format_ci(diff[0], diff[1:], digits=3, sign=True)))
    if paired_rows:
        lines += ["", "Verifiers on the same trees (every round's tree and laws verified by "
                  "each; the first verifier drives the decoding); difference = driving verifier "
                  "minus this one, paired by prompt (bootstrap 95% CI):", ""]
        lines += tables.markdown_table(("configuration", "verifier",
                                        "tokens / target call (95% CI)",
                                        "difference in acceptance length (95% CI)"),
                                       paired_rows)
    if gpu:
        lines += ["", "Predicted speedup: the counted calls priced at batch 1 with in-loop "
                  "steps measured on a GPU from random weights of the same shapes (modelled, "
                  "not measured); the target call of a tree of N nodes at width N + 1, of a "
                  "chain at G + 1; Max-Gram at its timed drafting where the report has it, else "
                  "free. Widths the report lacks: *fit* (least-squares "
                  "line through the K >= 2 steps, inside the measured range) or *extrapolated* "
                  "(beyond it).", ""]
        lines += tables.markdown_table(
            ("GPU", "report", "device", "target widths measured", "drafter widths measured",
             "Max-Gram"),
            [(label, g["path"], g["device"], ", ".join(map(str, g["target_widths"])),
              ", ".join(map(str, g["drafter_widths"])) +
              " (a drafter call of several nodes priced as the widest measured: "
              "extrapolated)", "timed" if g.get("max_gram_timed") else "not timed: free")
             for label, g in gpu.items()])
    if tpu:
        lines += ["", "TPU columns: the same counted calls priced with the compiled per-call "
                  "programs' `optimal_seconds` (TPU compiler estimates: nothing ran on a TPU), "
                  "Max-Gram included (one lookup per chain draft, one compiled best-first tree "
                  "per round; a Max-Gram tree without a compiled program is not priced); "
                  "widths without a program are fit or extrapolated as above.", ""]
        lines += tables.markdown_table(
            ("chip", "compile reports", "device", "target widths compiled",
             "drafter widths compiled", "Max-Gram programs"),
            [(label, ", ".join(t["paths"]), t["device"], ", ".join(map(str, t["target_widths"])),
              ", ".join(map(str, t["drafter_widths"])), ", ".join(t["max_gram"]) or "none")
             for label, t in tpu.items()])
    return "\n".join(lines)


# --- the job ---------------------------------------------------------------------------------

def load_or_make_reference(path: str, pair, target: str, task: str, prompts, length: int
                           ) -> list[list[int]]:
    """The target's greedy continuations (``length`` tokens) of ``prompts``
    from ``path``, computed (and stored there) for the prompts it lacks."""
    protocol = {"target": target, "task": task, "length": length,
                "eos_ids": [int(e) for e in pair.eos_ids]}
    done: list = []
    try:
        stored = tree_replay.load_reference(path)
    except FileNotFoundError:
        stored = None
    if stored is not None:
        same = stored["protocol"]["target"] == target and stored["protocol"]["task"] == task
        count = min(len(stored["prompts"]), len(prompts))
        if not same or stored["prompts"][:count] != [list(p) for p in prompts[:count]]:
            raise ValueError(f"{path} holds greedy continuations of other prompts or another "
                             "target; give another replay path.")
        if stored["protocol"]["length"] >= length:
            done = [c[:length] for c in stored["continuations"][:len(prompts)]]
            protocol["length"] = length
        else:
            print(f"{path}: continuations of {stored['protocol']['length']} tokens, "
                  f"{length} needed: computing them again.")
    if len(done) < len(prompts):
        save = lambda conts: tree_replay.write_reference(  # noqa: E731
            path, protocol, prompts[:len(conts)], conts)
        done = tree_replay.greedy_reference(pair.target, pair.target_params, prompts, length,
                                            done=done, save=save)
    return done


def run_bench_trees(*, target: str = "qwen2.5-coder-1.5b", drafter: str = "qwen2.5-coder-0.5b",
                    configs: Sequence[dict] = (), task: str = "humaneval",
                    num_prompts: int = 40, max_new_tokens: int = 128,
                    bigram_table: str = "qwen2.5-coder", draft_weights: str = "f32",
                    gpu_steps: dict | None = None, tpu_reports: dict | None = None,
                    seed: int = 0, note: str = "",
                    replay: str | None = None, replay_check: bool = False,
                    replay_length: int = 32, out: str = "results/bench_trees.json",
                    markdown_path: str | None = None) -> dict:
    """Runs every configuration into ``out`` (written after each; a rerun with
    the same protocol skips the configurations stored) and prints the tables.
    ``note`` (e.g. the command and how a run departs from the protocol) heads
    the Markdown. ``replay``: the greedy reference file (module docstring;
    made when missing, ``replay_length`` tokens past ``max_new_tokens``).
    ``gpu_steps``: label -> a GPU step report; ``tpu_reports``: chip label ->
    its compile reports, in order of preference (module docstring)."""
    checked = check_configs(configs)
    shared.check_at_least(1, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                          replay_length=replay_length)
    replayed = {c.name for c in checked if replay and c.drafter == "mag" and
                c.temperature == 0}
    deepest = max((c.depth for c in checked if c.name in replayed), default=0)
    if deepest > replay_length:
        raise ValueError(f"replay_length={replay_length} is below the deepest replayed tree "
                         f"({deepest}); raise it.")
    shared.check_at_least(0, seed=seed)
    weight_storage.check_format(draft_weights)
    tasks.get_task(task)  # raises on an unknown task
    gpu_steps = DEFAULT_GPU_STEPS if gpu_steps is None else dict(gpu_steps)
    gpu = {label: load_gpu_steps(path) for label, path in gpu_steps.items()}
    tpu_reports = {label: [paths] if isinstance(paths, str) else list(paths)
                   for label, paths in (tpu_reports or {}).items()}
    tpu = {label: load_tpu_steps(paths) for label, paths in tpu_reports.items()}
    if set(gpu) & set(tpu):
        raise ValueError(f"labels {sorted(set(gpu) & set(tpu))} name both a GPU and a TPU; "
                         "give each accelerator its own label.")
    prices = {**gpu, **tpu}
    protocol = {"target": target, "drafter": drafter, "task": task, "num_prompts": num_prompts,
                "max_new_tokens": max_new_tokens, "bigram_table": bigram_table,
                "draft_weights": draft_weights, "seed": seed}
    try:
        report = shared.read_report(out)
    except FileNotFoundError:
        report = {}
    if report.get("protocol") != protocol:
        report = {}
    report.update(protocol=protocol, note=note, precision=precision.resolve_dtype("auto"),
                  decoding="the jitted loops (decode.chain / decode.tree), batch 1",
                  gpu={label: {"path": gpu_steps[label], "device": g["device"],
                               "target_widths": sorted(g["target"]),
                               "drafter_widths": sorted(g["drafter"]),
                               "max_gram_timed": "mag_step_s" in g}
                       for label, g in gpu.items()},
                  tpu={label: {"paths": tpu_reports[label], "device": t["device"],
                               "target_widths": sorted(t["target"]),
                               "drafter_widths": sorted(t["drafter"]),
                               "max_gram": sorted(t["mag_trie_s"]) +
                               (["chain lookups"] if t["mag_step_s"] is not None else [])}
                       for label, t in tpu.items()})
    stored = report.setdefault("configs", {})
    for name in list(stored):
        if name not in {c.name for c in checked}:
            del stored[name]
    report.setdefault("rows", {})
    reference = next((c.name for c in checked if c.temperature == 0), None)
    report["reference"] = reference

    def counted_by(config: Config) -> str:
        if config.name not in replayed:
            return "loop"
        return "loop, replay checked" if replay_check else "replay"

    def is_stored(config: Config) -> bool:
        previous = stored.get(config.name)
        return bool(previous and previous["config"] == config.as_dict() and
                    config.name in report["rows"] and
                    # reports from before replays were all counted by the loop
                    previous.get("counted_by", "loop") == counted_by(config))

    def summarize_stored(config: Config) -> None:
        """The configuration's figures from its stored rows, at today's prices."""
        ref_rows = (report["rows"].get(reference)
                    if config.temperature == 0 and reference != config.name else None)
        kept = {k: stored[config.name][k] for k in ("seconds", "counted_by",
                                                    "replay_equal_per_prompt")
                if k in stored[config.name]}
        stored[config.name] = {**summarize(config, report["rows"][config.name], prices,
                                           (DRAFTER_NAME,), ref_rows),
                               "counted_by": "loop", **kept}

    todo = [c for c in checked if not is_stored(c)]
    for config in checked:
        if config not in todo:
            summarize_stored(config)
    if todo:
        run_configs(todo, report, replayed=replayed, counted_by=counted_by,
                    summarize_stored=summarize_stored, target=target, drafter=drafter,
                    task=task, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                    bigram_table=bigram_table, draft_weights=draft_weights, seed=seed,
                    replay=replay, replay_length=replay_length, out=out)
    report["configs"] = {c.name: stored[c.name] for c in checked}
    shared.write_report(report, out)
    timing.print_markdown(markdown(report), markdown_path)
    return report


def run_configs(todo: Sequence[Config], report: dict, *, replayed, counted_by,
                summarize_stored, target, drafter, task, num_prompts, max_new_tokens,
                bigram_table, draft_weights, seed, replay, replay_length, out) -> None:
    """Decodes (or replays) the configurations ``todo``, storing each one's rows
    and figures in ``report`` and writing it after each."""
    stored = report["configs"]
    report["environment"] = timing.environment()  # the machine that counts
    pair = load_pair(target=target, drafter=drafter, draft_weights=draft_weights)
    vocab = pair.target.vocab_size
    texts = [ex.prompt for ex in tasks.get_task(task).load("test", num_prompts)]
    prompts = [pair.encode(text) for text in texts]
    width = max(len(p) for p in prompts)
    bigram_tables = max_gram_tables(bigram_table, vocab, todo)
    received: list = []
    sink = lambda accepted: received.append(np.asarray(accepted)[:, 0])  # noqa: E731 (batch 1)
    references = (load_or_make_reference(replay, pair, target, task, prompts,
                                         max_new_tokens + replay_length)
                  if replayed else None)
    for config in todo:
        decoder = build_decoder(config, pair=pair, drafter_name=DRAFTER_NAME, vocab=vocab,
                                max_new_tokens=max_new_tokens, sink=sink)
        table = bigram_tables.get(config.bigram_columns)
        params = pair.drafter_params if config.drafter == "model" else table
        start = time.perf_counter()
        replay_equal = None
        if counted_by(config) == "replay":
            rows = tree_replay.replay_rows(max_gram_tree_drafter(config, vocab), table, prompts,
                                           references, max_new_tokens=max_new_tokens,
                                           eos_ids=pair.eos_ids, progress=True)
        else:
            rows = run_config(config, decoder, pair.target_params, params, prompts, width,
                              received, seed=seed)
            if config.name in replayed:
                again = tree_replay.replay_rows(
                    max_gram_tree_drafter(config, vocab), table, prompts, references,
                    max_new_tokens=max_new_tokens, eos_ids=pair.eos_ids)
                replay_equal = [a["histogram"] == b["histogram"] and a["tokens"] == b["tokens"]
                                for a, b in zip(rows, again, strict=True)]
        report["rows"][config.name] = rows
        stored[config.name] = {"seconds": time.perf_counter() - start,
                               "counted_by": counted_by(config)}
        if replay_equal is not None:
            stored[config.name]["replay_equal_per_prompt"] = replay_equal
        summarize_stored(config)
        shared.write_report(report, out)
