"""Gin-configured jobs, t5x style: the launcher behind ``python -m eval.main``,
``python -m train.main`` and ``specdec-jax eval|train``.

Thin on purpose: parse flags, parse gin, call one library function. The
library carries no gin decorators; the functions a config may bind (the
*jobs*) are registered here under the names the configs use, and a run file
picks one with ``run.job = @run_study`` (each entry point has a default)::

    python -m eval.main --gin_file=configs/runs/cascades_humaneval.gin \\
        --gin_bindings="run_study.num_examples = 5"
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
from collections.abc import Callable, Sequence

import gin

from specdec_jax.checkpoints import fetch
from specdec_jax.runtime import cpu_kernels, devices, distributed

# job name -> "module:function" (imported when the launcher starts).
JOBS = {
    "run_study": "specdec_jax.jobs.studies.gin_jobs:run_study",
    "run_generate": "specdec_jax.jobs.studies.gin_jobs:run_generate",
    "run_benchmark": "specdec_jax.jobs.studies.gin_jobs:run_benchmark",
    "run_training": "specdec_jax.training.recipes:run_training",
    "run_distillation": "specdec_jax.training.recipes:run_distillation",
    "run_specdecpp_data": "specdec_jax.jobs.head_training:run_specdecpp_data",
    "run_specdecpp_train": "specdec_jax.jobs.head_training:run_specdecpp_train",
    "run_feature_head_data": "specdec_jax.jobs.head_training:run_feature_head_data",
    "run_feature_head_train": "specdec_jax.jobs.head_training:run_feature_head_train",
    "tpu_compile": "specdec_jax.jobs.tpu.compile_job:run_tpu_compile",
}
# Jobs that run across processes (sharded models, rows split by process, process 0
# writing; training: batches split along the data axis, orbax writing every
# process's shards). The others time one device or write files from every
# process: refused.
MULTI_PROCESS_JOBS = ("run_generate", "run_training")
# The folder that holds ``configs/``: the checkout in a source tree (or an editable
# install), the installed package otherwise (setup.py ships configs/ as
# ``specdec_jax/configs``), so ``configs/runs/<name>.gin`` resolves from any directory.
_CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
_PACKAGE = pathlib.Path(__file__).resolve().parents[1]
CONFIGS_PARENT = _CHECKOUT if (_CHECKOUT / "configs" / "runs").is_dir() else _PACKAGE


def resolve_gin_file(name: str, places: Sequence[str]) -> str:
    """A gin file as given (a path, or relative to ``places``), or a shipped
    config by name: ``generate`` or ``runs/generate.gin`` is
    ``configs/runs/generate.gin``, ``models/toy_bytes`` ``configs/models/toy_bytes.gin``."""
    if pathlib.Path(name).exists() or any((pathlib.Path(p) / name).exists() for p in places):
        return name
    stem = name.removesuffix(".gin")
    for candidate in (f"configs/{stem}.gin", f"configs/runs/{stem}.gin"):
        if (CONFIGS_PARENT / candidate).exists():
            return str(CONFIGS_PARENT / candidate)
    shipped = sorted(p.stem for p in (CONFIGS_PARENT / "configs" / "runs").glob("*.gin"))
    raise FileNotFoundError(f"gin file {name!r} does not exist (looked in "
                            f"{', '.join(places)}) and is no shipped config; the shipped "
                            f"jobs, by name: {', '.join(shipped)}.")

_registered: dict[str, Callable] = {}  # name -> the undecorated function


def _register_jobs(extra: dict[str, str] | None = None) -> None:
    """Makes every job a gin configurable once per process: ``JOBS``, and
    ``extra`` jobs of a launcher outside the package (the benchmarks')."""
    for name, where in {**JOBS, **(extra or {})}.items():
        if name in _registered:
            continue
        module, attribute = where.split(":")
        function = getattr(importlib.import_module(module), attribute)
        gin.external_configurable(function, name=name)
        _registered[name] = function


@gin.configurable("run")
def run(job=None):  # noqa: ARG001 (exists so that ``run.job = @...`` parses)
    """The configurable that holds the job a config selected."""


@gin.configurable("runtime")
def configure_runtime(cpu_kernel: bool = True) -> bool:
    """Process-wide settings every job shares. ``cpu_kernel``: few-row products
    on CPU through the project's kernel (``runtime.cpu_kernels``; built on
    first use, XLA's dot where it cannot be); ``runtime.cpu_kernel = False``
    keeps XLA's dot. Returns whether the kernel is on."""
    return cpu_kernels.enable(cpu_kernel, build_dir=fetch.cache_dir() / "kernels")


GIN_FLAG_PREFIX = "--gin."


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    """Flags; t5x's ``--gin.NAME=VALUE`` (VALUE a gin literal, strings quoted:
    ``--gin.WORKDIR="'results/run'"``) is the same as ``--gin_bindings="NAME = VALUE"``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gin_file", action="append", required=True,
                        help="gin config (repeatable): a path, or a shipped config by name "
                             "('generate', 'configs/runs/generate.gin'), found from any "
                             "directory")
    parser.add_argument("--gin_bindings", action="append", default=[],
                        help="extra gin bindings, e.g. \"run_study.num_examples = 5\"")
    parser.add_argument("--gin_search_path", action="append", default=[],
                        help="directories where gin looks for included files")
    multi = parser.add_argument_group(
        "many processes (specdec_jax.runtime.distributed; default: one process)")
    multi.add_argument("--coordinator_address", default=None,
                       help="HOST:PORT of process 0 (or $SPECDEC_JAX_COORDINATOR)")
    multi.add_argument("--num_processes", type=int, default=None,
                       help="processes in the job (or $SPECDEC_JAX_NUM_PROCESSES)")
    multi.add_argument("--process_id", type=int, default=None,
                       help="this process, 0..num_processes-1 (or $SPECDEC_JAX_PROCESS_ID)")
    multi.add_argument("--multihost_auto", action="store_true",
                       help="join using JAX's cluster detection (TPU pods, Slurm, Open MPI)")
    args, rest = parser.parse_known_args(argv)
    for flag in rest:
        name, equals, value = flag[len(GIN_FLAG_PREFIX):].partition("=")
        if not flag.startswith(GIN_FLAG_PREFIX) or not equals or not name:
            parser.error(f"unrecognised argument {flag!r} (gin bindings are "
                         "--gin_bindings=\"NAME = VALUE\" or --gin.NAME=VALUE)")
        args.gin_bindings.append(f"{name} = {value}")
    return args


def parse_config(files: list[str], bindings: list[str], search_paths: list[str],
                 extra_jobs: dict[str, str] | None = None) -> None:
    """Parses gin files and bindings; errors name the file that needs fixing."""
    _register_jobs(extra_jobs)
    gin.clear_config()  # a fresh configuration per job (tests run several in one process)
    places = [*search_paths, ".", str(CONFIGS_PARENT)]
    for path in places:
        gin.add_config_file_search_path(path)
    files = [resolve_gin_file(name, places) for name in files]
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    except Exception as error:  # gin raises several types; add the file to any of them
        raise ValueError(f"gin config {', '.join(files)} (bindings {bindings or 'none'}) "
                         f"failed to parse: {error}") from error


def selected_job(default: str) -> str:
    """The job ``run.job`` names, or the entry point's default."""
    try:
        chosen = repr(gin.query_parameter("run.job"))
    except ValueError:
        return default
    name = chosen.lstrip("@").removesuffix("()")
    if name not in _registered:
        raise ValueError(f"run.job = {chosen} is not a job; choose one of "
                         f"{', '.join('@' + j for j in _registered)}.")
    return name


def check_required(files: list[str], job: str) -> None:
    """gin only enforces ``%gin.REQUIRED`` on parameters; run files put it on
    macros (t5x style), so check the macros the job's parameters use."""
    missing = []
    for name in inspect.signature(_registered[job]).parameters:
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


def check_process_count(job: str, process_count: int | None = None) -> None:
    import jax  # noqa: PLC0415

    count = jax.process_count() if process_count is None else process_count
    if count > 1 and job not in MULTI_PROCESS_JOBS:
        raise ValueError(f"{job} runs on one process (it times one device or writes its files "
                         f"from every process); this launch has {count}. Run it without "
                         "--num_processes/--multihost_auto, or use a multi-process job: "
                         f"{', '.join(MULTI_PROCESS_JOBS)}.")


def main(argv: Sequence[str] | None = None, *, default_job: str = "run_study",
         description: str = "Runs a gin-configured job.",
         extra_jobs: dict[str, str] | None = None) -> int:
    """Runs the job a gin config selects. ``extra_jobs`` ("name" ->
    "module:function") adds jobs from outside the package: ``benchmarks.main``
    passes the benchmarks', which the package never imports."""
    args = parse_args(argv, description)
    devices.run_on_cpu_without_chips()  # no libtpu runtime where there is no TPU

    if args.multihost_auto:
        distributed.initialize_auto()
    else:
        distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    parse_config(args.gin_file, args.gin_bindings, args.gin_search_path, extra_jobs)
    job = selected_job(default_job)
    check_required(args.gin_file, job)
    check_process_count(job)
    configure_runtime()
    configured = gin.get_configurable(job)
    try:
        result = configured()
    except Exception as error:
        if "REQUIRED" in str(error) or "gin" in type(error).__module__:
            raise ValueError(f"gin config {', '.join(args.gin_file)}: {error}") from error
        raise
    done = (f"{len(result['records'])} records" if isinstance(result, dict)
            and "records" in result else "done")
    print(f"{job}: {done}; operative config:\n{gin.operative_config_str()}")
    return 0
