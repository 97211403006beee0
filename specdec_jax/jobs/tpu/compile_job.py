"""The TPU compile job: compile the library's programs for a TPU topology from
any machine, and report what the compiler says (``configs/runs/tpu_compile.gin``).

Before booking TPUs, check that a job's programs compile for the chips, fit in
their HBM, keep their loops free of host communication and run the collectives
a sharded model should. ``run_tpu_compile`` builds every named program from
shapes alone (``jobs.tpu_programs``: registry architectures, bfloat16, no
weights; or, with ``weights="stored"``, the registry models' GGUF blocks as
uint8 arguments, their shapes read from the files), compiles it with libtpu
for ``topology`` (``jobs.tpu_aot``; a CPU-only machine will do) and records
per program: compiled or the compiler's error, HBM use against the chip's,
flops, bytes accessed and the compiler's
``optimal_seconds``, the roofline floor (weights and KV cache read once at the
chip's HBM bandwidth), fusions, while loops, host communication inside loops,
collectives and asynchronous copies. Every time figure is a "TPU compiler
estimate": nothing here runs on a TPU.

Writes ``out`` (JSON) and its Markdown beside it after every program, and
resumes: programs already in ``out`` for the same topology and settings are
skipped (a compile of a 1.5B generate function takes minutes on 2 cores)::

    specdec-jax eval --gin_file=tpu_compile \\
        --gin_bindings="TOPOLOGY = 'v5e:2x2'"
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import pathlib
import tempfile
import time
from collections.abc import Mapping, Sequence

import jax

from specdec_jax.jobs import resolver, tables
from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import hlo_stats
from specdec_jax.jobs.tpu import programs as tpu_programs
from specdec_jax.runtime import jsonio, resume, timing

TARGET = "qwen2.5-coder-1.5b"
DRAFTER = "qwen2.5-coder-0.5b"
# libtpu's start-up lines on a machine that is not a TPU VM: expected, not news.
HARMLESS_LOG = ("TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "host bounds",
                "Logging before InitGoogle", "Source Location Trace", "libtpu_init_utils")
GIB = 1024 ** 3


def architecture(name: str) -> str:
    """A registry architecture from ``<architecture>`` or ``random:<architecture>[:<seed>]``
    (only shapes are used: the seed does not matter)."""
    if name.startswith(resolver.RANDOM_PREFIX):
        return resolver.parse_random(name)[0]
    resolver.registry.architecture(name)  # raises with the known names
    return name


def settings_of(*, topology: str, target: str, drafter: str, shapes: tpu_programs.Shapes,
                compiler_options: dict, training: bool = False) -> dict:
    """What a record depends on: a resumed run must match it (the training
    shapes only where training programs are asked for, so reports without
    them resume as before)."""
    train = {"train_batch": shapes.train_batch, "train_length": shapes.train_length}
    config = tpu_aot.chip_config(topology)  # v4: megacore (reports before it: one core)
    # Recorded only where it is not the default, so bfloat16 reports resume as before.
    stored = {"weights": shapes.weights} if shapes.weights != "bf16" else {}
    return {**(train if training else {}), **({"chip_config": config} if config else {}),
            **stored,
            "topology": topology, "target": target, "drafter": drafter,
            "dtype": tpu_programs.DTYPE, "batch": shapes.batch,
            "cache_length": shapes.cache_length, "prompt_len": shapes.prompt_len,
            "max_new_tokens": shapes.max_new_tokens, "gamma": shapes.gamma,
            "mesh": {"data": shapes.data, "model": shapes.model},
            "compiler_options": dict(compiler_options), "jax": jax.__version__,
            "libtpu": tpu_aot.libtpu_version()}


def load_report(path: str, settings: dict) -> dict:
    """The report at ``path`` to resume, or a new one; a report made with other
    settings is refused (its records would not be comparable)."""
    fresh = {"settings": settings, "programs": {}}
    if not os.path.exists(path):
        return fresh
    report = jsonio.read_json(path)
    differ = resume.differences(report.get("settings", {}), resume.as_json(settings))
    if differ:
        raise ValueError(f"{path} holds a compile report made with other settings "
                         f"({'; '.join(differ)}); write to another `out` or remove it.")
    report.setdefault("programs", {})
    return report


def interesting_log(text: str) -> str:
    """The compiler's stderr without libtpu's expected start-up lines (last 2000 chars)."""
    lines = [line for line in text.splitlines()
             if line.strip() and not any(mark in line for mark in HARMLESS_LOG)]
    return "\n".join(lines)[-2000:]


def compile_one(name: str, shapes: tpu_programs.Shapes, mesh, models: dict, chip,
                compiler_options: dict) -> dict:
    """One program's record: its figures, or the error that stopped it."""
    kind = ("generate" if name in tpu_programs.GENERATE else
            "round" if name in tpu_programs.ROUNDS else
            "training" if name in tpu_programs.TRAINING else "per_call")
    started = time.perf_counter()
    record = {"kind": kind}
    program = None
    try:
        program = tpu_programs.build(name, shapes, mesh, models)
        record["note"] = program.note
        with tempfile.TemporaryDirectory() as dump:
            # A decode program's temporaries are read from the compiler's buffer
            # assignment, which it writes only to a dump folder.
            options = compiler_options if kind not in ("generate", "round") else {
                **compiler_options, "xla_dump_to": dump, "xla_dump_hlo_pass_re": "^$"}
            compiled, seconds, log = tpu_aot.compile_abstract(
                program.fn, program.args, donate_argnums=program.donate_argnums,
                compiler_options=options)
            record.update(status="compiled", compile_s=round(seconds, 1),
                          **tpu_aot.program_record(
                              compiled, chip, data=shapes.data, model=shapes.model,
                              weight_bytes=program.weight_bytes,
                              cache_bytes=program.cache_bytes))
            assignment = sorted(pathlib.Path(dump).glob(
                "*after_optimizations-buffer-assignment.txt"))
            if assignment:
                text = assignment[-1].read_text()
                record["temp_buffers"] = hlo_stats.temp_buffers(text, compiled.as_text())
                record["hbm_temporaries"] = hlo_stats.hbm_temporaries(text)
        if interesting_log(log):
            record["compiler_log"] = interesting_log(log)
    except Exception as error:  # noqa: BLE001 - a program that does not compile is a result
        record.update(status="error", error=f"{type(error).__name__}: {error}"[:3000],
                      compile_s=round(time.perf_counter() - started, 1))
        if "RESOURCE_EXHAUSTED" in record["error"] and program is not None:
            # Why it does not fit: what the program materialises, largest first.
            try:
                record["largest_intermediates"] = tpu_aot.largest_intermediates(
                    program.fn, program.args)
            except Exception as trace_error:  # noqa: BLE001 - the compile error stands
                record["largest_intermediates_error"] = str(trace_error)[:500]
    return record


@functools.lru_cache(maxsize=4)
def _abstract_models(shapes: tpu_programs.Shapes) -> dict:
    return tpu_programs.abstract_models(shapes)


def _compile_by_name(name: str, shapes: tpu_programs.Shapes, topology: str,
                     compiler_options: dict) -> dict:
    """``compile_one`` from names alone (what a worker process receives)."""
    mesh = tpu_aot.make_mesh(topology, data=shapes.data, model=shapes.model)
    return compile_one(name, shapes, mesh, _abstract_models(shapes),
                       tpu_aot.chip_of(topology), compiler_options)


def compile_in_processes(names: Sequence[str], shapes: tpu_programs.Shapes, topology: str, *,
                         workers: int = 2, compiler_options: dict | None = None) -> dict:
    """Records of ``names`` (``compile_one``'s), compiled by ``workers`` fresh
    processes at once (the TPU compiler runs a program on one core, so this
    divides the wall time of many small compiles by the cores). ``shapes.target``
    and ``.drafter`` are registry architectures; the workers inherit the
    environment (``JAX_PLATFORMS``, libtpu's lock setting). Returns
    ``{name: record}`` in the order of ``names``."""
    tpu_aot.topology_devices(topology)  # fails here, not in a worker, without libtpu
    options = dict(compiler_options or {})
    context = multiprocessing.get_context("spawn")  # never fork a process that holds jax
    with concurrent.futures.ProcessPoolExecutor(max(1, workers), mp_context=context) as pool:
        futures = {name: pool.submit(_compile_by_name, name, shapes, topology, options)
                   for name in names}
        return {name: future.result() for name, future in futures.items()}


def run_tpu_compile(*, topology: str, programs: Sequence[str], out: str,
                    markdown_path: str | None = None, target: str = TARGET,
                    drafter: str = DRAFTER, batch: int = 1, cache_length: int = 2048,
                    prompt_len: int = 512, max_new_tokens: int = 128, gamma: int = 5,
                    data: int = 1, model: int = 1, train_batch: int = 32,
                    train_length: int = 1024, weights: str = "bf16",
                    compiler_options: dict | None = None) -> dict:
    """Compiles ``programs`` (names or groups of ``tpu_programs.PROGRAMS``:
    ``per_call``, ``generate``, ``training``) for ``topology`` (e.g.
    ``"v5e:2x2"``) and writes the report (module docstring). ``target`` /
    ``drafter``: registry architectures (or ``random:`` names of them).
    ``cache_length``: the KV-cache room of per-call programs; ``prompt_len`` /
    ``max_new_tokens`` / ``gamma``: the generate programs'. ``data`` x
    ``model``: the mesh (batch over ``data``, weights and KV heads over
    ``model``), on the topology's first ``data * model`` chips.
    ``train_batch`` / ``train_length``: rows per training step (split over
    ``data``) and tokens per row of the decoder-only training programs
    (``jobs.tpu_training``). ``weights``: ``"bf16"`` (every parameter in
    bfloat16) or ``"stored"`` (the models' matrices as their GGUF files' blocks,
    dequantised inside each product; ``tpu_programs.abstract_stored_model``).
    ``compiler_options``: XLA options for every
    compile (recorded; e.g. to compare a flag's effect). Returns the report."""
    names = tpu_programs.expand(programs)
    chip = tpu_aot.chip_of(topology)
    shapes = tpu_programs.Shapes(target=architecture(target), drafter=architecture(drafter),
                                 batch=batch, cache_length=cache_length,
                                 prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                                 gamma=gamma, data=data, model=model,
                                 train_batch=train_batch, train_length=train_length,
                                 weights=weights)
    compiler_options = dict(compiler_options or {})
    settings = settings_of(topology=topology, target=shapes.target, drafter=shapes.drafter,
                           shapes=shapes, compiler_options=compiler_options,
                           training=any(n in tpu_programs.TRAINING for n in names))
    markdown_path = markdown_path or str(pathlib.Path(out).with_suffix(".md"))
    report = load_report(out, settings)
    mesh = tpu_aot.make_mesh(topology, data=data, model=model)
    report["environment"] = {**timing.environment(), "libtpu": tpu_aot.libtpu_version(),
                             "chip": chip.name,
                             "chips_in_topology": len(tpu_aot.topology_devices(topology))}
    commit = report["environment"]["commit"]
    models = _abstract_models(shapes)
    todo = [n for n in names if n not in report["programs"]]
    print(f"tpu_compile {topology} ({chip.name}, mesh {data} x {model}): {len(todo)} to "
          f"compile, {len(names) - len(todo)} already in {out}", flush=True)
    for i, name in enumerate(todo):
        record = compile_one(name, shapes, mesh, models, chip, compiler_options)
        record["commit"] = commit  # a resumed report mixes programs of several commits
        report["programs"][name] = record
        _save(report, out, markdown_path)
        print(f"[{i + 1}/{len(todo)}] {name}: {_summary(record)}", flush=True)
    _save(report, out, markdown_path)
    return report


# --- reading reports (the prices read them) ---------------------------------------------------

def read_report(path: str) -> dict:
    """A JSON report with its ``path`` recorded (``program_seconds`` names it)."""
    report = jsonio.read_json(jsonio.existing(path))
    report["path"] = path
    return report


def program_seconds(reports: Sequence[Mapping], name: str) -> dict | None:
    """The first usable record of program ``name`` in ``reports`` (compile
    reports, in order of preference): compiled with a positive estimate.
    Returns ``{"estimate_s", "floor_s", "source", "compiler_options"}``, or
    None where no report has one."""
    for report in reports:
        record = report.get("programs", {}).get(name)
        if record and record.get("status") == "compiled" and (record.get("optimal_s") or 0) > 0:
            return {"estimate_s": float(record["optimal_s"]), "floor_s": float(record["floor_s"]),
                    "source": report.get("path", "?"),
                    "compiler_options": report.get("settings", {}).get("compiler_options", {})}
    return None


def _save(report: dict, out: str, markdown_path: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    jsonio.write_json(out, report, indent=1)
    tmp = pathlib.Path(markdown_path + ".tmp")
    tmp.write_text(markdown(report) + "\n")
    os.replace(tmp, markdown_path)


def _summary(record: dict) -> str:
    if record["status"] != "compiled":
        return f"ERROR {record['error'][:300]}"
    return (f"compiled in {record['compile_s']} s, HBM {record['hbm_bytes'] / GIB:.2f} GiB, "
            f"optimal_seconds {_ms(record['optimal_s'])} ms ({tpu_aot.ESTIMATE}), "
            f"floor {_ms(record['floor_s'])} ms")


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3f}"


def _estimate(seconds) -> str:
    """The compiler's ``optimal_seconds`` in ms; a negative one is not a time."""
    if seconds is not None and seconds < 0:
        return f"invalid ({_ms(seconds)})"
    return _ms(seconds)


def _gb(value) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def _collectives(record: dict) -> str:
    """Counts ``all-reduce/all-gather/reduce-scatter/collective-permute``, and the
    MB they produce per chip where recorded."""
    c = record["hlo"]["collectives"]
    text = (f"{c['all-reduce']}/{c['all-gather']}/{c['reduce-scatter']}/"
            f"{c.get('collective-permute', 0)}")
    moved = record.get("collective_bytes")
    if moved:
        text += " (" + "/".join(f"{moved.get(k, 0) / 1e6:.1f}" for k in (
            "all-reduce", "all-gather", "reduce-scatter", "collective-permute")) + " MB)"
    return text


def _loop_values(record: dict) -> str:
    """``none``, or each weight-sized value a loop writes: MB, type, opcode, source."""
    values = record.get("loop_values")
    if values is None:
        return "-"  # a record from before the field
    return "; ".join(f"{v['bytes'] / 1e6:.0f} MB {v['type']} {v['opcode']} at "
                     f"{(v['source'] or v['op_name'] or v['name']).rsplit('/', 1)[-1]}"
                     for v in values[:4]) + (" ..." if len(values) > 4 else "") or "none"


def _value(value: dict) -> str:
    where = value["source"] or value["op_name"] or value["name"]
    return f"{value['bytes'] / 1e6:.1f} MB {value['type']} at {where.rsplit('/', 1)[-1]}"


def _hbm_space(record: dict) -> str:
    space = record.get("hbm_temporaries")
    if not space:
        return "-"
    return (f"{space['bytes'] / 1e6:.1f} ({space['small_values']}, "
            f"{space['small_span_bytes'] / 1e6:.1f})")


def markdown(report: dict) -> str:
    """The report as Markdown: settings, then one table row per program."""
    s, env = report["settings"], report.get("environment", {})
    commits = sorted({r.get("commit") or "(not recorded)" for r in report["programs"].values()})
    lines = [f"# TPU compile report: {s['topology']} ({env.get('chip', '?')})", "",
             f"Compiled ahead of time with libtpu {s['libtpu']} and jax {s['jax']} on "
             f"{env.get('machine', '?')} from commit(s) {', '.join(commits) or '(none)'} "
             "(each program's in the JSON); "
             "**nothing ran on a TPU**. Every time below is a "
             f"**{tpu_aot.ESTIMATE}** (the compiler's `optimal_seconds`) or a roofline "
             "floor (weights + KV cache read once at the chip's HBM bandwidth), never a "
             "measurement.", "",
             f"Target {s['target']}, drafter {s['drafter']}, {s['dtype']}"
             + (" activations with the weights kept in their GGUF files' blocks (uint8, "
                "dequantised inside each product)" if s.get("weights") == "stored" else "")
             + f", batch {s['batch']}, "
             f"mesh {s['mesh']['data']} (data) x {s['mesh']['model']} (model); per-call "
             f"programs at a KV cache of {s['cache_length']} tokens; generate programs: "
             f"prompt {s['prompt_len']}, {s['max_new_tokens']} new tokens, G = {s['gamma']}."
             + (f" Compiler options: {s['compiler_options']}." if s["compiler_options"] else ""),
             ""]
    rows, errors = [], []
    for name, r in report["programs"].items():
        if r["status"] != "compiled":
            errors.append(f"- `{name}`: {r['error'][:500]}")
            errors += [f"  - {x['gib']:.2f} GiB {x['dtype']}{x['shape']} ({x['op']} in "
                       f"{x['where']}, x{x['count']})" for x in r.get("largest_intermediates", [])]
            rows.append([f"`{name}`", "error"] + ["-"] * 13)
            continue
        hlo = r["hlo"]
        ratio = r["bytes_accessed_over_floor_bytes"]
        rows.append([
            f"`{name}`", "compiled",
            f"{r['hbm_bytes'] / GIB:.2f} ({100 * r['hbm_fraction']:.1f}%)",
            f"{r['memory']['temp'] / GIB:.3f}", _loop_values(r),
            f"{r['flops'] / 1e9:.2f}" if r["flops"] is not None else "-",
            _gb(r["bytes_accessed"]), "-" if ratio is None else f"{ratio:.2f}",
            _estimate(r["optimal_s"]), _ms(r["floor_s"]), str(hlo["fusions"]),
            str(hlo["while_loops"]), str(len(hlo["host_ops_in_loops"])), _collectives(r),
            f"{hlo['async_copies']['copy-start']}/{hlo['async_copies']['slice-start']}"])
    lines += tables.markdown_table(
        ["program", "status", "HBM GiB (of chip)", "HBM temporaries GiB",
         f"values >= {tpu_aot.LOOP_VALUE_FRACTION:.0%} of weights written per loop iteration",
         "GFLOP", "bytes accessed GB",
         "accessed / (weights + cache)", f"optimal_seconds ms ({tpu_aot.ESTIMATE})",
         "roofline floor ms", "fusions", "while loops", "host ops in loops",
         "all-reduce/all-gather/reduce-scatter/permute (MB per chip)",
         "copy-start/slice-start"], rows)
    if errors:
        lines += ["", "Errors:", *errors]
    buffers = [(name, r["temp_buffers"]) for name, r in report["programs"].items()
               if r.get("temp_buffers")]
    if buffers:
        lines += ["", "The largest values behind each decode program's HBM temporaries (the "
                  "compiler's buffer assignment; values share their allocation over their "
                  "lifetimes, so they do not add up):", ""]
        lines += tables.markdown_table(
            ["program", "HBM-space temporaries MB (small values: count, MB they span)",
             "largest temporary values (MB, type, source)"],
            [[f"`{name}`", _hbm_space(report["programs"][name]),
              "; ".join(_value(v) for v in values[:3])] for name, values in buffers])
        lines += ["", "HBM-space temporaries: the buffer assignment's memory-space-0 "
                  "allocations beside arguments and outputs (`memory.temp`, the compiler's "
                  "`temp_size_in_bytes`, counts more on a TPU); small values: the async-copy "
                  "descriptors of weight prefetches and tuples of at most 4 KiB at the top of "
                  "the allocation, each in its own 16 KiB-aligned slot."]
    lines += ["", "HBM: arguments + outputs + temporaries + generated code, less donated "
              "(aliased) buffers, per chip; its temporaries are the compiler's buffers beside "
              "arguments and outputs. A weight-sized value written per loop iteration is a "
              "weight copied, converted or re-laid out every iteration (source line shown). "
              "`bytes accessed` is the compiler's cost analysis, "
              "not HBM traffic: it counts a weight prefetched into on-chip memory "
              "(`copy-start`/`copy-done`, `slice-start`/`slice-done` into memory space 1) "
              "in the copy and again in the kernel that reads it, so it exceeds the bytes a "
              "step reads from HBM. `optimal_seconds` came out negative for programs with "
              "sliced prefetches (`slice-start`); compiling with "
              "`compiler_options={'xla_tpu_sliced_prefetch_max_slices': 0}` gives a positive "
              "estimate (of a slightly different program). Whole generate programs count "
              "each loop body once: use the per-call programs for per-call cost. Training "
              "programs (`train_*`) are one optimizer step each (loss, gradients, update; "
              "the train state donated); their floor is only the weights (and frozen "
              "inputs) read once. Collective MB: the arrays each kind of collective "
              "produces per chip per call (a loop body once)."]
    return "\n".join(lines)
