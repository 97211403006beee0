"""The T5 pair as a job: build (or find) a pair's members and report their
held-out quality (``training.t5_pair`` holds the recipe and trains members on
first use)::

    python -m specdec_jax.jobs.studies.t5_quality t5-cpu translation_en_de   # builds all three
    python -m specdec_jax.jobs.studies.t5_quality t5-cpu translation_en_de \\
        --report results/t5_cpu_translation_en_de.md                  # + held-out quality
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from specdec_jax.data import metrics, tasks
from specdec_jax.jobs import resolver, tables
from specdec_jax.jobs.studies import sweep
from specdec_jax.training.t5_pair import PAIRS, ROLES, ensure_member, parse_member


def held_out_quality(name: str, *, split: str = "test", num_examples: int = 500,
                     batch_size: int = 50, progress: bool = True) -> dict:
    """Greedy quality of one member on a task split: the task's metric (BLEU,
    ROUGE-2) with its bootstrap 95% CI, as the evaluation sweeps score it."""
    pair, _, task_name = parse_member(name)
    task = tasks.get_task(task_name)
    examples = task.load(split, num_examples)
    models = resolver.load_pair(target=name, drafter=name)
    point = sweep.Point("target", None, None, 0.0)
    rows = sweep.generate_point(models, point, examples,
                                max_new_tokens=PAIRS[pair].new_tokens[task_name],
                                batch_size=batch_size, width=sweep.prompt_width(models, examples),
                                seed=0, progress=progress)
    sweep.score_rows(task, rows, examples)
    record = sweep.summarise(task, point, rows, None)
    return {"metric": task.metric.name, "split": split, "num_examples": len(rows),
            **record["quality"], "outputs": [r["text"] for r in rows[:5]],
            "items": [r["item"] for r in rows]}


def quality_difference(task_name: str, better: dict, worse: dict) -> dict:
    """The paired bootstrap of ``better - worse`` (``held_out_quality`` results
    on the same examples): is one member clearly ahead of the other."""
    items = lambda q: [tuple(i) if isinstance(i, list) else i for i in q["items"]]  # noqa: E731
    diff, low, high = metrics.paired_difference_ci(items(better), items(worse),
                                                   tasks.get_task(task_name).metric.aggregate)
    return {"difference": diff, "low": low, "high": high, "clearly_ahead": low > 0}


def report(pair: str, task: str, *, num_examples: int = 500, progress: bool = True) -> dict:
    """Every member of a pair and task: size, training budget, held-out quality,
    and (for the distilled drafter) block efficiency before/after distillation."""
    rows = {}
    for role in ROLES:
        name = f"{pair}-{role}:{task}"
        summary = json.loads((ensure_member(name, progress=progress) / "summary.json").read_text())
        row = {"member": name, "summary": summary,
               "quality": held_out_quality(name, num_examples=num_examples, progress=progress)}
        rows[role] = row
    for role in ("small", "small-distilled"):
        rows[role]["large_minus_this"] = quality_difference(
            task, rows["large"]["quality"], rows[role]["quality"])
    return rows


def report_markdown(rows: dict) -> str:
    quality = next(iter(rows.values()))["quality"]
    lines = [f"Held-out quality: greedy, first {quality['num_examples']} examples of the "
             f"{quality['split']} split, {quality['metric']} with bootstrap 95% CI.", ""]
    members = []
    for role, row in rows.items():
        s, q = row["summary"], row["quality"]
        if role == "small-distilled":
            params = rows["small"]["summary"]["parameters"]
            budget = f"+{s['steps']} x {s.get('batch_size', '?')} distillation"
            tokens = "(teacher samples)"
        else:
            params = s["parameters"]
            budget = f"{s['steps']} x {s['batch_size']}"
            tokens = f"{s['training_tokens'] / 1e6:.2f} M ({s['epochs']:.1f} epochs)"
        resumed = " (resumed)" if s.get("resumed_from") else ""
        members.append((row["member"], f"{params / 1e6:.2f} M", budget, tokens,
                        f"{s['seconds_this_invocation'] / 60:.0f} min{resumed}",
                        tables.format_ci(q["score"], (q["low"], q["high"]), digits=2)))
    lines += tables.markdown_table(("member", "parameters", "steps x batch",
                                    "training tokens (targets)", "time",
                                    f"{quality['metric']} [95% CI]"), members)
    differences = [(role, row["large_minus_this"]) for role, row in rows.items()
                   if "large_minus_this" in row]
    lines += [""] if differences else []
    for role, d in differences:
        verdict = "clearly ahead" if d["clearly_ahead"] else "not clearly ahead"
        diff = tables.format_ci(d["difference"], (d["low"], d["high"]), digits=2, sign=True)
        lines.append(f"Large minus {role}: {diff} {quality['metric']} (paired bootstrap 95% CI "
                     f"over the same examples): the large model is {verdict}.")
    distilled = rows.get("small-distilled", {}).get("summary")
    if distilled:
        change = lambda key: " -> ".join(  # noqa: E731
            tables.format_ci(m[key], m.get(f"{key}_ci")) for m in (distilled["before"],
                                                                  distilled["after"]))
        lines += ["", "Distillation (speculative decoding, large target, held-out validation "
                  f"inputs): block efficiency {change('block_efficiency')}; acceptance rate "
                  f"{change('acceptance_rate')}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Builds (or finds) a T5 pair's members.")
    parser.add_argument("pair", choices=sorted(PAIRS))
    parser.add_argument("task", choices=["translation_en_de", "summarisation_debian"])
    parser.add_argument("--report", metavar="MARKDOWN",
                        help="also score every member on held-out inputs and write a Markdown "
                             "report here (and the same as JSON beside it)")
    parser.add_argument("--examples", type=int, default=500,
                        help="held-out examples the report scores (default 500)")
    args = parser.parse_args(argv)
    for role in ROLES:
        print(f"{args.pair}-{role}:{args.task}: "
              f"{ensure_member(f'{args.pair}-{role}:{args.task}')}")
    if args.report:
        rows = report(args.pair, args.task, num_examples=args.examples)
        path = pathlib.Path(args.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# The {args.pair} pair on {args.task}\n\n" + report_markdown(rows))
        path.with_suffix(".json").write_text(json.dumps(rows, indent=1))
        print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
