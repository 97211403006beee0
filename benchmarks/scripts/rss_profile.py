"""Peak resident memory of a ``specdec-jax`` command, phase by phase.

    python benchmarks/scripts/rss_profile.py generate --max-new-tokens 32

runs the CLI in this process with a thread that reads ``/proc/self/status``
every 0.1 s, and marks phases by wrapping the functions the first command
goes through (checkpoint conversion and loading, the kernel layout, the
restricted head, compilation, timing, the cost model). At the end it prints,
per phase, the RSS on entry and exit and the peak inside it (anonymous and
file-backed parts at that peak), then the process's peak (``VmHWM``). Linux only.
"""

from __future__ import annotations

import functools
import sys
import threading
import time


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _mapped_files(suffix: str = ".safetensors") -> dict[str, int]:
    """Resident bytes of each mapped file whose name ends with ``suffix``."""
    out, name = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and "-" in fields[0]:  # a mapping's first line
                name = fields[5] if fields[5].endswith(suffix) else None
            elif name and fields[0] == "Rss:":
                key = "/".join(name.split("/")[-3:-2])
                out[key] = out.get(key, 0) + int(fields[1]) * 1024
    return out


class Profile:
    def __init__(self, period_s: float = 0.1):
        self.period_s, self.stack, self.rows = period_s, [], []
        self.peaks: dict[int, dict] = {}
        self.start = time.perf_counter()
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while not self._stop.wait(self.period_s):
            now = _status()
            for row in list(self.peaks.values()):
                if now["VmRSS"] > row["VmRSS"]:
                    row.update(now)

    def wrap(self, owner, attr: str, label: str):
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            entry, t0 = _status(), time.perf_counter()
            row = {"label": label, "depth": len(self.stack), "t": t0 - self.start,
                   "entry": entry["VmRSS"]}
            self.rows.append(row)
            self.peaks[id(row)] = peak = dict(entry)
            self.stack.append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()
                exit_ = _status()
                del self.peaks[id(row)]
                if exit_["VmRSS"] > peak["VmRSS"]:
                    peak = exit_
                row.update(exit=exit_["VmRSS"], peak=peak["VmRSS"], anon=peak["RssAnon"],
                           file=peak["RssFile"], seconds=time.perf_counter() - t0)

        setattr(owner, attr, wrapped)

    def report(self) -> str:
        gb = lambda b: f"{b / 1e9:6.2f}"  # noqa: E731
        lines = ["phase (nesting)                          start_s  secs  entry   exit   peak "
                 "(anon + file) GB"]
        for r in self.rows:
            if "exit" not in r:
                continue
            name = "  " * r["depth"] + r["label"]
            lines.append(f"{name:40s} {r['t']:7.1f} {r['seconds']:5.1f} {gb(r['entry'])} "
                         f"{gb(r['exit'])} {gb(r['peak'])} ({gb(r['anon'])} +{gb(r['file'])})")
        lines.append(f"process peak (VmHWM): {gb(_status()['VmHWM'])} GB")
        lines += [f"resident now of the mapped file {name}: {gb(rss)} GB"
                  for name, rss in _mapped_files().items()]
        return "\n".join(lines)


def main(argv: list[str]) -> int:
    from specdec_jax.checkpoints import converted, gguf, load  # noqa: PLC0415
    from specdec_jax.data import bigram  # noqa: PLC0415
    from specdec_jax.jobs import cli, resolver  # noqa: PLC0415
    from specdec_jax.jobs.cli import generate  # noqa: PLC0415
    from specdec_jax.models import decoder_only  # noqa: PLC0415
    from specdec_jax.runtime import timing  # noqa: PLC0415

    profile = Profile()
    for owner, attr, label in (
            (resolver, "resolve", "resolve"),
            (load, "load_model", "load_model"),
            (gguf, "gguf_entries", "gguf open (entries dequantised as written)"),
            (converted, "_write", "write converted copy"),
            (converted, "_read", "read converted copy"),
            (load, "with_kernel_layout", "with_kernel_layout"),
            (bigram, "restrict_head", "restrict_head"),
            (timing.Compiled, "__init__", "compile"),
            (timing.Compiled, "time", "timed generation"),
            (generate, "cost_model", "cost model")):
        if hasattr(owner, attr):
            profile.wrap(owner, attr, label)
    del decoder_only
    try:
        return cli.main(argv)
    finally:
        print(profile.report(), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
