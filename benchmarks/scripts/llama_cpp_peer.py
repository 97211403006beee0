"""llama.cpp beside us on the same GGUF file, threads and machine: a step and a 9-token call.

llama.cpp is what users run on a CPU. This builds it once from the source that
the package index carries (the ``llama-cpp-python`` sdist vendors llama.cpp;
cached under the project's cache), then times, interleaved ``--rounds``
times with nothing else running:

- llama.cpp's ``llama-bench`` on the file: ``tg`` (a token at a time, its
  autoregressive speed) and ``pp9`` (a 9-token batch: what a scoring call of
  G = 8 costs it);
- ours, the same file loaded with ``weights="stored"`` (the block kernel) and
  with ``weights="f32"``: in-loop seconds of a 1-token step and a 9-token call
  (``timing.in_loop_step``, cache filled with 128 tokens).

    python benchmarks/scripts/llama_cpp_peer.py --threads 2 \\
        --out benchmarks/reports/llama_cpp_peer_cpu.json

Needs cmake and a C/C++ compiler (``apt-get install cmake g++``); the build
takes several minutes on 2 cores, once. Not done here yet: whole generations
(llama.cpp's speculative example against our decoders on HumanEval prompts).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tarfile

from specdec_jax.checkpoints import fetch, load, registry
from specdec_jax.runtime import cpu_kernels, timing

SDIST = "llama-cpp-python"
VERSION = "0.3.36"
TARGETS = ("llama-bench",)


def build(version: str = VERSION) -> pathlib.Path:
    """The directory of the built llama.cpp binaries (built on first use)."""
    root = fetch.cache_dir() / "llama.cpp" / version
    binaries = root / "build" / "bin"
    if all((binaries / t).exists() for t in TARGETS):
        return binaries
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama.cpp needs {tool}: apt-get install cmake g++")
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    ":all:", f"{SDIST}=={version}", "-d", str(root)], check=True)
    with tarfile.open(next(root.glob("*.tar.gz"))) as archive:
        archive.extractall(root, filter="data")
    source = next(root.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
    subprocess.run(["cmake", "-S", str(source), "-B", str(root / "build"),
                    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(root / "build"), "--target", *TARGETS, "-j",
                    str(os.cpu_count() or 1)], check=True)
    return binaries


def llama_bench(binaries: pathlib.Path, model: pathlib.Path, threads: int) -> dict:
    """Seconds per token of tg (64 tokens) and seconds per 9-token batch (pp9)."""
    out = subprocess.run([str(binaries / "llama-bench"), "-m", str(model), "-t", str(threads),
                          "-p", "9", "-n", "64", "-r", "3", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    found = {}
    for row in rows:
        seconds = row["avg_ns"] / 1e9
        if row["n_gen"]:
            found["step_s"] = seconds / row["n_gen"]
        else:
            found["call9_s"] = seconds
        found["build"] = f"{row.get('build_commit')} ({row.get('build_number')})"
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/reports/llama_cpp_peer_cpu.json")
    args = parser.parse_args(argv)
    binaries = build()
    cpu_kernels.enable()
    path = registry.local_path(args.model)
    ours = {name: load.load_for_decoding(args.model, "float32", weights=name)[:2]
            for name in ("stored", "f32")}
    runs: dict[str, list[float]] = {}
    build_id = None
    for _ in range(args.rounds):  # interleaved: a drift hits every contender alike
        peer = llama_bench(binaries, path, args.threads)
        build_id = peer.pop("build")
        for key, value in peer.items():
            runs.setdefault(f"llama.cpp_{key}", []).append(value)
        for name, (model, params) in ours.items():
            for k, key in ((1, "step_s"), (9, "call9_s")):
                timed = timing.in_loop_step(model, params, k, steps=16, repeats=3)
                runs.setdefault(f"{name}_{key}", []).append(timed.median_s)
    med = {key: statistics.median(values) for key, values in runs.items()}
    report = {"model": args.model, "file": path.name, "threads": args.threads,
              "llama.cpp": {"sdist": f"{SDIST}=={VERSION}", "build": build_id},
              "commit": timing.checkout_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "environment": timing.environment(), "runs_s": runs, "median_s": med,
              "tokens_per_s": {who: round(1 / med[f"{who}_step_s"], 2)
                               for who in ("llama.cpp", "stored", "f32")},
              "call9_over_step": {who: round(med[f"{who}_call9_s"] / med[f"{who}_step_s"], 2)
                                  for who in ("llama.cpp", "stored", "f32")},
              "stored_step_over_llama.cpp": round(med["stored_step_s"]
                                                  / med["llama.cpp_step_s"], 2)}
    timing.write_report(report, args.out)
    print(json.dumps({k: report[k] for k in ("tokens_per_s", "call9_over_step",
                                             "stored_step_over_llama.cpp")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
