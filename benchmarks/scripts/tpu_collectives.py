"""Compile one per-call program of the real pair for a TPU topology (shapes only, no
weights; libtpu: ``pip install -e ".[tpu]"``) and attribute each collective in its
optimised HLO to the operation it came from (the ``op_name`` metadata, layer numbers
folded), with the bytes each kind produces per chip.

    JAX_PLATFORMS=cpu python benchmarks/scripts/tpu_collectives.py v5e:4x4 target_k1 4 4 64

Arguments: topology, program name (``tpu_programs.PROGRAMS``), data, model, batch.
Counts take every computation of the module (entry, fusions): a collective inside an
asynchronous fusion is counted where it sits, so a kind's count can exceed the job's
(which counts the entry's). The HLO is written to ``/tmp/<program>.hlo``."""

import collections
import re
import sys
import time

from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import programs as tpu_programs

COLLECTIVE = re.compile(
    r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+|\(.*?\)) (all-reduce|all-gather|collective-permute|"
    r"all-reduce-start|all-gather-start|collective-permute-start|reduce-scatter|all-to-all)\(")


def main(topology: str, name: str, data: int, model: int, batch: int) -> None:
    shapes = tpu_programs.Shapes(target="qwen2.5-coder-1.5b", drafter="qwen2.5-coder-0.5b",
                                 batch=batch, cache_length=2048, data=data, model=model)
    mesh = tpu_aot.make_mesh(topology, data=data, model=model)
    models = {"target": tpu_programs.abstract_model(shapes.target),
              "drafter": tpu_programs.abstract_model(shapes.drafter)}
    program = tpu_programs.build(name, shapes, mesh, models)
    started = time.perf_counter()
    compiled, _, _ = tpu_aot.compile_abstract(program.fn, program.args,
                                              donate_argnums=program.donate_argnums)
    text = compiled.as_text()
    with open(f"/tmp/{name}.hlo", "w") as f:
        f.write(text)
    print(f"compiled in {time.perf_counter() - started:.1f} s")
    counts = collections.Counter()
    for line in text.splitlines():
        match = COLLECTIVE.match(line)
        if not match:
            continue
        op = re.search(r'op_name="([^"]*)"', line)
        op_name = re.sub(r"layers_\d+", "layers_N", op.group(1)) if op else "?"
        counts[(match.group(3), match.group(2)[:60], op_name[-120:])] += 1
    for (kind, shape, op_name), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(n, kind, shape, op_name)
    print("bytes per chip (entry):", tpu_aot.collective_bytes(text))


if __name__ == "__main__":
    topo, prog, d, m, b = sys.argv[1:6]
    main(topo, prog, int(d), int(m), int(b))
