"""In-loop steps of both models for more kernel paths, in one process (tools/gpu_check.sh).

The accelerator benchmark job (``benchmarks/configs/accelerator.gin``) runs one kernel
path (``kernel_layout``, projections fused or separate) per call, decoding
included. The GPU check runs it once for the library's path (``out_in:fused``)
and this script for the others: the job's own functions (``check_settings``, ``build_models``,
``measure_steps``) at K = 1 and G + 1, without decoding, the device limits read
once. The JSON report is rewritten after every path, so a run cut at its time
limit keeps the paths it finished.

    python tools/gpu_check_bench.py --out /tmp/paths.json \\
        --paths out_in:separate in_out --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback


def _write(report: dict, path: pathlib.Path) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report, indent=1))
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--paths", nargs="+", default=["out_in:separate", "in_out"],
                        help="kernel paths: out_in:fused, out_in:separate or in_out")
    parser.add_argument("--target", default="random:qwen2.5-coder-1.5b:0")
    parser.add_argument("--drafter", default="random:qwen2.5-coder-0.5b:1")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--gamma", type=int, default=5, help="K = 1 and gamma + 1")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    import jax  # noqa: PLC0415

    from benchmarks import accelerator  # noqa: PLC0415
    from specdec_jax.runtime import devices, timing  # noqa: PLC0415

    devices.run_on_cpu_without_chips()  # --tiny on a CPU with libtpu: no runtime noise
    report = {"environment": timing.environment(), "backend": jax.default_backend(),
              "settings": {"target": args.target, "drafter": args.drafter,
                           "batch": args.batch, "gamma": args.gamma,
                           "prompt_len": args.prompt_len, "steps": args.steps,
                           "repeats": args.repeats},
              "paths": {}}
    failed = 0
    for path in args.paths:
        entry = report["paths"][path] = {"status": "running"}
        start = time.perf_counter()
        try:
            layout, _, projections = path.partition(":")
            if projections not in ("", "fused", "separate"):
                raise ValueError(f"kernel path {path!r}: out_in:fused, out_in:separate or "
                                 "in_out")
            settings = accelerator.check_settings(
                target=args.target, drafter=args.drafter, dtypes=[args.dtype],
                batch_sizes=[args.batch], gammas=[args.gamma], methods=["specdecode"],
                prompt_len=args.prompt_len, max_new_tokens=args.gamma + 1, steps=args.steps,
                repeats=args.repeats, kernel_layout=layout,
                fused_projections=projections == "fused",
                target_step_widths=[], acceptance=list(accelerator.MEASURED_ACCEPTANCE),
                peers=[], rounds_per_sync=[1],
                max_gram_context=0)  # Max-Gram is timed once, by the job
            dtype = settings.dtypes[0]
            report["dtype"] = dtype
            if "limits" not in report:
                report["limits"] = timing.device_limits(dtype)
                _write(report, args.out)
            models = accelerator.build_models(settings, dtype)
            entry["weight_bytes"] = {role: accelerator.weight_bytes(p)
                                     for role, (_, p) in models.items()}
            entry["steps"] = accelerator.measure_steps(models, settings, report["limits"])
            entry["status"] = "ok"
            del models
        except Exception as error:  # noqa: BLE001 - one path's failure is a result
            failed += 1
            entry["status"] = "error"
            entry["error"] = f"{type(error).__name__}: {error}"[:2000]
            traceback.print_exc()
        entry["seconds"] = round(time.perf_counter() - start, 1)
        _write(report, args.out)
        print(f"{path}: {entry['status']} in {entry['seconds']} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    sys.exit(main())
