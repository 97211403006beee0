"""Gin-configured jobs, t5x style: ``python -m eval.main --gin_file=... --gin_bindings=...``.

Thin on purpose: parse flags, parse gin, call one library function. The
library carries no gin decorators; the functions a config may bind are
registered here. Example::

    python -m eval.main --gin_file=configs/runs/cascades_humaneval.gin \\
        --gin_bindings="run_study.num_examples = 5"
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import gin

from specdec_jax.evaluation import study

# The functions a run config may bind, under the names the configs use. A run
# file picks one with ``run.job = @run_study`` (the default) or ``@run_generate``.
JOBS = {name: gin.external_configurable(getattr(study, name), name=name)
        for name in ("run_study", "run_generate")}


@gin.configurable("run", denylist=())
def run(job=JOBS["run_study"]):
    """The job a config selected (the entry point's only configurable of its own)."""
    return job()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", required=True,
                        help="gin config (repeatable); paths relative to the repository root "
                             "or absolute")
    parser.add_argument("--gin_bindings", action="append", default=[],
                        help="extra gin bindings, e.g. \"run_study.num_examples = 5\"")
    parser.add_argument("--gin_search_path", action="append", default=[],
                        help="directories where gin looks for included files")
    return parser.parse_args(argv)


def parse_config(files: list[str], bindings: list[str], search_paths: list[str]) -> None:
    """Parses gin files and bindings; errors name the file that needs fixing."""
    gin.clear_config()  # a fresh configuration per job (tests run several in one process)
    root = pathlib.Path(__file__).resolve().parents[1]
    for path in [*search_paths, str(root), "."]:
        gin.add_config_file_search_path(path)
    for name in files:
        if not any((pathlib.Path(p) / name).exists() for p in [*search_paths, str(root), "."]) \
                and not pathlib.Path(name).exists():
            raise FileNotFoundError(f"gin file {name!r} does not exist (looked in "
                                    f"{', '.join([*search_paths, str(root), '.'])}); "
                                    "see configs/runs/ for the shipped jobs.")
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    except Exception as error:  # gin raises several types; add the file to any of them
        raise ValueError(f"gin config {', '.join(files)} (bindings {bindings or 'none'}) "
                         f"failed to parse: {error}") from error


def _selected_job() -> str:
    try:
        chosen = repr(gin.query_parameter("run.job"))
    except ValueError:
        return "run_study"
    name = chosen.lstrip("@").removesuffix("()")
    if name not in JOBS:
        raise ValueError(f"run.job = {chosen} is not a job; choose one of "
                         f"{', '.join('@' + j for j in JOBS)}.")
    return name


def check_required(files: list[str]) -> None:
    """gin only enforces ``%gin.REQUIRED`` on parameters; run files put it on
    macros (t5x style), so check the macros the job's parameters use."""
    import inspect  # noqa: PLC0415

    missing = []
    job = _selected_job()
    for name in inspect.signature(getattr(study, job)).parameters:
        try:
            value = gin.query_parameter(f"{job}.{name}")
        except ValueError:
            continue  # not bound: the function's default applies
        text = repr(value)
        if text.startswith("%") and repr(gin.query_parameter(text)) == "%gin.REQUIRED":
            missing.append(text[1:])
    if missing:
        raise ValueError(f"gin config {', '.join(files)} leaves required macro(s) "
                         f"{', '.join(missing)} unset (%gin.REQUIRED); set them in the file "
                         "or with --gin_bindings, e.g. --gin_bindings=\"TASK = 'humaneval'\".")


def main(argv=None) -> int:
    args = parse_args(argv)
    parse_config(args.gin_file, args.gin_bindings, args.gin_search_path)
    check_required(args.gin_file)
    try:
        result = run()
    except Exception as error:
        if "REQUIRED" in str(error) or "gin" in type(error).__module__:
            raise ValueError(f"gin config {', '.join(args.gin_file)}: {error}") from error
        raise
    done = f"{len(result['records'])} sweep points" if "records" in result else "1 record"
    print(f"wrote {done}; operative config:\n{gin.operative_config_str()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
