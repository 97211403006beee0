"""The summaries of tools/gpu_check.sh: ``gpu_check.json`` and ``gpu_check.md`` in ``--out``.

Reads what the stages left in ``--work`` and ``--out`` (each may be missing or
partial: a stage cut at its time limit still counts):

* ``<work>/stages.jsonl``: one line a stage (name, rc, seconds, limit_s, timed_out);
* ``<work>/env.json`` and ``<out>/env.txt``: versions, devices, nvidia-smi;
* ``<out>/tests.jsonl`` (tests/gpu_check_plugin.py), else ``<out>/junit.xml``:
  pass / fail / error / skip per test file, plus collected tests that never ran;
* ``<work>/bench/main.json`` (+ ``main.md``): the accelerator benchmark job's report;
  ``<work>/bench/paths.json``: in-loop steps of the other kernel paths
  (tools/gpu_check_bench.py).

``--print`` also prints a short text summary (what a caller sees last).
No JAX import unless a benchmark report lacks its Markdown.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "not run")
_RANK = {"failed": 0, "error": 1, "xpassed": 2, "passed": 3, "xfailed": 4, "skipped": 5}


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by a kill
    return rows


def _read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def tests_from_jsonl(rows: list[dict]) -> tuple[dict, list[str], int | None]:
    """nodeid -> {outcome, duration, message}; collected nodeids; exit status (None: cut)."""
    tests: dict[str, dict] = {}
    collected: list[str] = []
    finished = None
    for row in rows:
        if "collected" in row:
            collected = row["collected"]
        elif "finished" in row:
            finished = row["finished"]
        elif "nodeid" in row:
            test = tests.setdefault(row["nodeid"], {"outcome": row["outcome"], "duration": 0.0,
                                                    "message": ""})
            test["duration"] += row.get("duration") or 0.0
            if _RANK.get(row["outcome"], 9) < _RANK.get(test["outcome"], 9) or \
                    row["when"] == "call" and test["outcome"] == "skipped":
                test["outcome"] = row["outcome"]
            if row.get("message") and not test["message"]:
                test["message"] = row["message"]
    return tests, collected, finished


def tests_from_junit(path: pathlib.Path, root: pathlib.Path) -> dict:
    """nodeid -> {...} from a JUnit XML (when the JSON lines are missing)."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return {}
    tests = {}
    for case in tree.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        file, rest = classname.replace(".", "/") + ".py", []
        for i in range(len(parts), 0, -1):  # tests.test_x.TestClass -> tests/test_x.py::TestClass
            candidate = "/".join(parts[:i]) + ".py"
            if (root / candidate).is_file():
                file, rest = candidate, parts[i:]
                break
        nodeid = "::".join([file, *rest, name])
        outcome, message = "passed", ""
        for tag, kind in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            child = case.find(tag)
            if child is not None:
                outcome = kind
                if tag == "skipped" and child.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                message = (child.get("message") or child.text or "")[-1500:]
                break
        tests[nodeid] = {"outcome": outcome, "duration": float(case.get("time") or 0),
                         "message": message}
    return tests


def per_file(tests: dict, collected: list[str]) -> dict:
    files: dict[str, Counter] = defaultdict(Counter)
    seconds: dict[str, float] = defaultdict(float)
    for nodeid, test in tests.items():
        files[_file_of(nodeid)][test["outcome"]] += 1
        seconds[_file_of(nodeid)] += test["duration"]
    for nodeid in collected:
        if nodeid not in tests:
            files[_file_of(nodeid)]["not run"] += 1
    return {f: {**{o: files[f][o] for o in OUTCOMES}, "seconds": round(seconds[f], 1)}
            for f in sorted(files)}


def _stage_line(stage: dict) -> str:
    state = ("TIMED OUT" if stage.get("timed_out") else
             "ok" if stage.get("rc") == 0 else f"rc {stage.get('rc')}")
    limit = f" of {stage['limit_s']} s" if stage.get("limit_s") else ""
    note = f" ({stage['note']})" if stage.get("note") else ""
    return f"{stage['stage']}: {state}, {stage.get('seconds', 0)} s{limit}{note}"


def _bench_markdown(report: dict, md_path: pathlib.Path) -> str:
    if md_path.is_file() and md_path.stat().st_size:
        return md_path.read_text()
    try:  # a report cut before its end has no Markdown: render what it has
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from benchmarks import accelerator  # noqa: PLC0415
        partial = json.loads(json.dumps(report))
        for section in partial.get("by_dtype", {}).values():
            section.setdefault("steps", {})
            section.setdefault("decoding", [])
            section.setdefault("predicted", [])
        return ("(partial: the job was cut before its end; what it finished)\n\n"
                + accelerator.markdown(partial))
    except Exception as error:  # noqa: BLE001 - a partial report lacks sections
        return (f"(partial report, not rendered: {type(error).__name__}: {error}; "
                "see gpu_check.json)")


def step_table(main: dict | None, paths: dict | None) -> tuple[list[str], list[dict]]:
    """In-loop step ms per (model, batch, K) and kernel path."""
    columns: dict[str, dict] = {}
    if main:
        s = main.get("settings", {})
        # the job's kernel path, named as tools/gpu_check_bench.py names the others
        name = s.get("kernel_layout", "out_in")
        if name == "out_in":
            name += ":fused" if s.get("fused_projections") else ":separate"
        for dtype, section in main.get("by_dtype", {}).items():
            if "steps" in section:
                columns[f"{name} {dtype}"] = section["steps"]
    if paths:
        for name, entry in paths.get("paths", {}).items():
            if "steps" in entry:
                columns[f"{name} {paths.get('dtype', '')}".strip()] = entry["steps"]
    rows: dict[tuple, dict] = {}
    for column, steps in columns.items():
        for role, by_b in steps.items():
            for b, by_k in by_b.items():
                for k, st in by_k.items():
                    rows.setdefault((role, int(b), int(k)), {})[column] = st
    out = [{"model": r, "batch": b, "K": k,
            **{c: {"step_ms": round(1e3 * v["step_s"], 3),
                   "weight_gb_s": round(v["weight_gb_s"], 1)} for c, v in cells.items()}}
           for (r, b, k), cells in sorted(rows.items(), key=lambda x: (x[0][0] != "target",
                                                                        x[0][1:]))]
    return list(columns), out


def summarise(work: pathlib.Path, out: pathlib.Path, mode: str, root: pathlib.Path) -> dict:
    stages = _read_jsonl(work / "stages.jsonl")
    env = _read_json(work / "env.json") or {}
    rows = _read_jsonl(out / "tests.jsonl")
    tests, collected, finished = tests_from_jsonl(rows)
    source = "tests.jsonl"
    if not tests and (out / "junit.xml").is_file():
        tests, source = tests_from_junit(out / "junit.xml", root), "junit.xml"
    files = per_file(tests, collected)
    totals = {o: sum(f[o] for f in files.values()) for o in OUTCOMES}
    problems = [{"nodeid": n, "outcome": t["outcome"], "message": t["message"]}
                for n, t in sorted(tests.items()) if t["outcome"] in ("failed", "error",
                                                                       "xpassed")]
    slowest = sorted(({"nodeid": n, "seconds": round(t["duration"], 2)}
                      for n, t in tests.items()), key=lambda x: -x["seconds"])[:15]
    bench_dir = work / "bench"
    main = _read_json(bench_dir / "main.json")
    paths = _read_json(bench_dir / "paths.json")
    columns, steps = step_table(main, paths)
    summary = {
        "mode": mode, "written_at": time.strftime("%Y-%m-%d %H:%M:%S"), "environment": env,
        "stages": stages,
        "suite": {"source": source, "collected": len(collected), "reported": len(tests),
                  "pytest_exit_status": finished, "totals": totals, "per_file": files,
                  "problems": problems, "slowest": slowest},
        "bench": {"main": main, "paths": paths, "step_columns": columns, "steps": steps},
    }
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
    (out / "gpu_check.md").write_text(markdown(summary, bench_dir, out))
    return summary


def _totals_line(totals: dict, collected: int) -> str:
    parts = [f"{totals[o]} {o}" for o in OUTCOMES if totals[o]]
    return ", ".join(parts or ["no test reported"]) + (f" (of {collected} collected)"
                                                      if collected else "")


def markdown(summary: dict, bench_dir: pathlib.Path, out: pathlib.Path) -> str:
    env, suite, bench = summary["environment"], summary["suite"], summary["bench"]
    lines = [f"# GPU check ({summary['mode']}), {summary['written_at']}", ""]
    if env:
        lines += [f"- {k}: {v}" for k, v in env.items()]
        lines.append("")
    smi = out / "env.txt"
    if smi.is_file():
        lines += ["```", smi.read_text().strip()[:3000], "```", ""]
    lines += ["## Stages", ""] + [f"- {_stage_line(s)}" for s in summary["stages"]] + [""]
    status = suite["pytest_exit_status"]
    lines += ["## Test suite", "",
              f"{_totals_line(suite['totals'], suite['collected'])}; pytest exit status "
              f"{'none (cut)' if status is None else status}; from {suite['source']}.", "",
              "| file | passed | failed | error | skipped | xfailed | not run | s |",
              "|---|---|---|---|---|---|---|---|"]
    for name, f in suite["per_file"].items():
        flag = " **!**" if f["failed"] or f["error"] or f["xpassed"] else ""
        lines.append(f"| {name}{flag} | {f['passed']} | {f['failed']} | {f['error']} | "
                     f"{f['skipped']} | {f['xfailed']} | {f['not run']} | {f['seconds']} |")
    if suite["problems"]:
        lines += ["", "### Failures and errors", ""]
        for p in suite["problems"]:
            lines += [f"- `{p['nodeid']}` ({p['outcome']})", "", "  ```",
                      *("  " + x for x in p["message"].splitlines()[-10:]), "  ```"]
    if suite["slowest"]:
        lines += ["", "### Slowest tests", "", "| test | s |", "|---|---|"]
        lines += [f"| `{t['nodeid']}` | {t['seconds']} |" for t in suite["slowest"]]
    lines += ["", "## Accelerator benchmark", ""]
    if bench["steps"]:
        cols = bench["step_columns"]
        lines += ["In-loop step ms (weight GB/s) per kernel path (layout:projections dtype):", "",
                  "| model | batch | K | " + " | ".join(cols) + " |",
                  "|---|---|---|" + "---|" * len(cols)]
        for row in bench["steps"]:
            cells = [f"{row[c]['step_ms']:.3f} ({row[c]['weight_gb_s']:.0f})" if c in row
                     else "–" for c in cols]
            lines.append(f"| {row['model']} | {row['batch']} | {row['K']} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    paths = bench["paths"]
    if paths:
        for name, entry in paths.get("paths", {}).items():
            if entry.get("status") != "ok":
                lines.append(f"- kernel path {name}: {entry.get('status')} "
                             f"{entry.get('error', '')}".rstrip())
        lines.append("")
    if bench["main"]:
        lines += ["### The benchmark job's report (main kernel path)", "",
                  _bench_markdown(bench["main"], bench_dir / "main.md"), ""]
    else:
        lines.append("No benchmark report (the stage did not run or wrote nothing).")
    return "\n".join(lines) + "\n"


def text(summary: dict) -> str:
    """Short, for the end of the console output."""
    suite, bench = summary["suite"], summary["bench"]
    lines = ["== GPU check summary (" + summary["mode"] + ")"]
    env = summary["environment"]
    if env:
        lines.append("   " + "; ".join(f"{k} {v}" for k, v in env.items()
                                      if k in ("backend", "devices", "jax", "torch")))
    lines += [f"   {_stage_line(s)}" for s in summary["stages"]]
    lines.append("   suite: " + _totals_line(suite["totals"], suite["collected"]))
    for name, f in suite["per_file"].items():
        if f["failed"] or f["error"] or f["not run"] or f["xpassed"]:
            lines.append(f"     {name}: {f['passed']} passed, {f['failed']} failed, "
                         f"{f['error']} error, {f['skipped']} skipped, {f['not run']} not run")
    for p in suite["problems"][:40]:
        last = next((x for x in reversed(p["message"].splitlines()) if x.startswith("E ")),
                    (p["message"].splitlines() or [""])[-1])
        lines.append(f"     {p['outcome'].upper()} {p['nodeid']}: {last.strip()[:160]}")
    if bench["steps"]:
        cols = bench["step_columns"]
        lines.append("   in-loop step ms: model/batch/K | " + " | ".join(cols))
        for row in bench["steps"]:
            lines.append(f"     {row['model']}/{row['batch']}/{row['K']} | " + " | ".join(
                f"{row[c]['step_ms']:.3f}" if c in row else "–" for c in cols))
    main = bench["main"]
    for dtype, section in (main or {}).get("by_dtype", {}).items():
        for row in section.get("decoding", []):
            lines.append(f"   {dtype} b{row['batch']} {row['name']}: "
                         f"{row['decode_tokens_per_s']:.1f} tokens/s, round "
                         f"{1e3 * row['round_s']:.2f} ms, overhead "
                         f"{100 * row['round_overhead']:+.1f}%, recompiles "
                         f"{row['recompiles_after_first_call']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--mode", default="full")
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path.cwd())
    parser.add_argument("--print", action="store_true", help="print the short summary")
    args = parser.parse_args(argv)
    summary = summarise(args.work, args.out, args.mode, args.root)
    if args.print:
        print(text(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
