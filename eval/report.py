"""Reports from a stored sweep, without generating anything.

    python -m eval.report benchmarks/reports/cascades_humaneval.json

Writes ``<stem>.md`` and the two trade-off PNGs next to the JSON, plain or
gzip-compressed (``<stem>.json.gz``): useful while a long sweep is still
running, or after it was stopped. Not a benchmark, so not a gin job: it
generates nothing and takes one path.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from specdec_jax.jobs.studies import report
from specdec_jax.runtime import jsonio


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_json", type=pathlib.Path)
    parser.add_argument("--latency", choices=("cost_model", "wallclock"), default="cost_model")
    args = parser.parse_args(argv)
    if not args.sweep_json.exists():
        raise FileNotFoundError(f"{args.sweep_json} does not exist; run a sweep first "
                                "(python -m eval.main --gin_file=configs/runs/...).")
    _, records = report.load_sweep(args.sweep_json)
    paths = report.write_reports(records, args.sweep_json.parent,
                                 stem=jsonio.stem_of(args.sweep_json),
                                 latency=args.latency)
    for path in paths.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
