#!/usr/bin/env bash
# One-call GPU check (issue 36): on a GPU machine without network, in one command,
#   1. installs the carried wheels (.gpu_check/wheels, from tools/gpu_check_prepare.sh)
#      with pip --no-index --no-deps --target /tmp/site, and restores the test data
#      (.gpu_check/data.tar.xz) into a fresh cache that SPECDEC_JAX_CACHE points at;
#   2. prints nvidia-smi, the jax/flax/torch versions and jax.devices();
#   3. runs the whole default test suite (pytest.ini: not -m slow; never -x), in
#      parallel with pytest-xdist where installed (XLA_PYTHON_CLIENT_PREALLOCATE=false),
#      under a hard time limit, each test's outcome written as it happens;
#   4. runs the accelerator benchmark subset: the job of benchmarks/configs/accelerator.gin
#      (bf16, batch 1, in-loop steps of both models at K = 1 and 6, autoregressive,
#      specdecode G = 5 all-accept and none-accepted; kernels out_in with fused
#      projections), then the in-loop steps of the other kernel paths (out_in:separate,
#      in_out; tools/gpu_check_bench.py): fused against separate projections;
#   5. writes into $OUT: gpu_check.md and gpu_check.json (pass/fail/error/skip/not-run
#      per test file, failures, slowest tests, step table per kernel path, the
#      benchmark's report), junit.xml, tests.jsonl, suite.log, bench.log, env.txt.
#      The summaries are rewritten after every stage and on exit: a stage cut at its
#      limit still reports what it finished.
#
# Usage:
#   bash tools/gpu_check.sh           # on the GPU machine (OUT set by the device tool)
#   bash tools/gpu_check.sh --tiny    # the same flow on CPU in about two minutes: a few
#                                     # test files, benchmarks/configs/accelerator_tiny.gin
# The whole command keeps within GPU_CHECK_DEADLINE_S (full: 420 s, so that a call
# with a cold start stays under 9 minutes; tiny: 300 s). The suite gets what is left
# after the benchmark's reserves (full: 150 s for the job, 90 s for the other kernel
# paths; at most GPU_CHECK_SUITE_S), and the benchmark whatever the suite leaves.
# Knobs (environment): OUT (default: a new temp folder), PYTHON (python3),
# GPU_CHECK_DIR (.gpu_check), GPU_CHECK_SITE (/tmp/site), GPU_CHECK_DEADLINE_S,
# GPU_CHECK_SUITE_S (cap; full 300, tiny 120), GPU_CHECK_MAIN_RESERVE_S (full 150,
# tiny 60), GPU_CHECK_PATHS_RESERVE_S (full 90, tiny 45), GPU_CHECK_TESTS (test paths;
# default: the whole suite; tiny: a few quick files), GPU_CHECK_PYTEST_ARGS (more
# pytest arguments), GPU_CHECK_WORKERS (xdist workers; full 12, tiny 0 = serial),
# GPU_CHECK_TEST_TIMEOUT_S (per test, with pytest-timeout; 150), GPU_CHECK_STAGES
# ("suite bench"; either alone, or "bench suite"), GPU_CHECK_PATHS (the other kernel
# paths, "out_in:separate in_out"; "" for none), GPU_CHECK_BENCH_BINDINGS (more gin
# bindings for the benchmark job, one a line), GPU_CHECK_KEEP_WORK (1: keep the work
# folder, with the restored cache and the benchmark's own reports; else removed on exit).

set -uo pipefail  # no -e: every stage runs and the summaries are always written

T0=$SECONDS
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

# shellcheck source=tools/gpu_check_common.sh
source "$ROOT/tools/gpu_check_common.sh"
gpu_check_args "${BASH_SOURCE[0]}" "$@"
gpu_check_dirs gpu_check
mkdir -p "$WORK/bench"

if (( TINY )); then
  MODE=tiny
  DEADLINE=${GPU_CHECK_DEADLINE_S:-300}
  SUITE_S=${GPU_CHECK_SUITE_S:-120}
  MAIN_RESERVE=${GPU_CHECK_MAIN_RESERVE_S:-60}
  TESTS=${GPU_CHECK_TESTS-"tests/test_precision.py tests/test_pretraining_data.py::test_pretraining_corpora_have_their_recorded_sizes tests/test_text_tasks.py::test_deb_hash_mismatch_names_file_hashes_and_fix tests/test_text_tasks.py::test_snapshot_hash_mismatch_is_reported tests/test_layers.py::test_import_linter_contracts_are_kept"}
  WORKERS=${GPU_CHECK_WORKERS:-0}
  SITE=${GPU_CHECK_SITE:-$WORK/site}
  GIN=benchmarks/configs/accelerator_tiny.gin
  DTYPE=auto
  PATHS_RESERVE=${GPU_CHECK_PATHS_RESERVE_S:-45}
  MAIN_MIN_S=20
  BENCH_MODELS=(--target random:tiny-target:0 --drafter random:tiny-drafter:1)
  BENCH_SIZES=(--prompt-len 8 --steps 2 --repeats 2)
  JOB_BINDINGS=("bench_accelerator.max_new_tokens = 12")
else
  MODE=full
  DEADLINE=${GPU_CHECK_DEADLINE_S:-420}
  SUITE_S=${GPU_CHECK_SUITE_S:-300}
  MAIN_RESERVE=${GPU_CHECK_MAIN_RESERVE_S:-150}
  TESTS=${GPU_CHECK_TESTS-}
  WORKERS=${GPU_CHECK_WORKERS:-12}
  SITE=${GPU_CHECK_SITE:-/tmp/site}
  GIN=benchmarks/configs/accelerator.gin
  DTYPE=bfloat16
  PATHS_RESERVE=${GPU_CHECK_PATHS_RESERVE_S:-90}
  MAIN_MIN_S=60
  BENCH_MODELS=()
  BENCH_SIZES=(--prompt-len 128 --steps 32 --repeats 5)
  # 126 new tokens: a multiple of G + 1 = 6, every all-accept round whole.
  JOB_BINDINGS=("bench_accelerator.max_new_tokens = 126" "bench_accelerator.prompt_len = 128"
                "bench_accelerator.steps = 32" "bench_accelerator.repeats = 3")
fi
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT_S:-150}
STAGES=${GPU_CHECK_STAGES:-suite bench}
PATHS=${GPU_CHECK_PATHS-out_in:separate in_out}
SUMMARY_RESERVE=10
GRACE_S=25

# STAGE RC SECONDS LIMIT TIMED_OUT NOTE: one line of $WORK/stages.jsonl (NOTE: no quotes).
record() {
  printf '{"stage": "%s", "rc": %d, "seconds": %d, "limit_s": %d, "timed_out": %s, "note": "%s"}\n' \
    "$1" "$2" "$3" "$4" "$5" "${6:-}" >>"$WORK/stages.jsonl"
}

summarise() {
  "$PY" tools/gpu_check_summary.py --work "$WORK" --out "$OUT" --mode "$MODE" --root "$ROOT" "$@" \
    2>>"$WORK/summary.err" || { say "summary failed:"; tail -5 "$WORK/summary.err"; }
}

FINAL_DONE=0
finish() {
  if (( FINAL_DONE )); then return; fi
  FINAL_DONE=1
  echo
  summarise --print
  say "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}
on_exit() {
  finish
  if [ "${GPU_CHECK_KEEP_WORK:-0}" = 1 ]; then say "work folder kept: $WORK"; else rm -rf "$WORK"; fi
}
trap on_exit EXIT
CHILD=  # the process group run_limited is waiting on
on_signal() {
  say "interrupted"
  if [ -n "$CHILD" ]; then kill -KILL -- "-$CHILD" 2>/dev/null; fi
  exit 130
}
trap on_signal INT TERM

say "gpu_check ($MODE): root $ROOT, OUT $OUT, work $WORK, deadline ${DEADLINE} s"

# -- 1. install and restore ---------------------------------------------------------------
start=$SECONDS
# shellcheck source=tools/gpu_check_install.sh
source "$ROOT/tools/gpu_check_install.sh"
if gpu_check_install "$CARRY" "$SITE" "$TINY" "$WORK/install.log"; then rc=0; else rc=$?; fi
record install "$rc" $((SECONDS - start)) 0 false "$INSTALL_NOTE"

start=$SECONDS
CACHE=$WORK/cache
if [ -f "$CARRY/data.tar.xz" ]; then
  if "$PY" tools/gpu_check_data.py restore "$CARRY/data.tar.xz" "$CACHE" >"$WORK/restore.log" 2>&1; then
    rc=0
  else
    rc=$?
  fi
  say "$(tail -1 "$WORK/restore.log")"
  record data "$rc" $((SECONDS - start)) 0 false
else
  say "no $CARRY/data.tar.xz: the corpus tests will fail (no network)"
  record data 1 0 0 false "no data archive"
fi
mkdir -p "$CACHE"
export SPECDEC_JAX_CACHE=$CACHE

# -- 2. environment ------------------------------------------------------------------------
start=$SECONDS
{
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1; else echo "(no nvidia-smi)"; fi
} >"$OUT/env.txt"
head -15 "$OUT/env.txt"
env_py='
import importlib.metadata as md, json, os, platform
env = {"python": platform.python_version(), "cpus": os.cpu_count()}
for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "torch", "transformers",
             "numpy", "gin-config", "specdec_jax"):
    try:
        env[name] = md.version(name)
    except md.PackageNotFoundError:
        env[name] = "missing"
import jax
env["backend"] = jax.default_backend()
env["devices"] = str(jax.devices())
try:
    import torch
    env["torch_cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no"
except Exception as error:
    env["torch_cuda"] = f"{type(error).__name__}: {error}"
print(json.dumps(env))
'
if timeout 180 "$PY" -c "$env_py" >"$WORK/env.json" 2>"$WORK/env.err"; then
  rc=0
  "$PY" -c 'import json, sys; print("\n".join(f"  {k}: {v}" for k, v in json.load(open(sys.argv[1])).items()))' "$WORK/env.json"
else
  rc=$?
  say "environment probe failed (rc $rc):"; tail -20 "$WORK/env.err"
  rm -f "$WORK/env.json"
fi
if [ -s "$WORK/env.err" ]; then
  { echo; echo "== environment probe stderr"; cat "$WORK/env.err"; } >>"$OUT/env.txt"
fi
record environment "$rc" $((SECONDS - start)) 180 false

bench_after_suite() {  # does the benchmark stage come after the suite in STAGES?
  local stage seen=0
  for stage in $STAGES; do
    [ "$stage" = suite ] && seen=1
    [ "$stage" = bench ] && (( seen )) && return 0
  done
  return 1
}

# -- 3. the test suite ---------------------------------------------------------------------
run_suite() {
  local args=(-m pytest -q -p no:cacheprovider -rfE --tb=short --junitxml="$OUT/junit.xml"
              -p tests.gpu_check_plugin)
  local note="serial"
  if (( WORKERS > 1 )) && "$PY" -c 'import xdist' 2>/dev/null; then
    local dist=load  # worksteal (xdist >= 3.2) rebalances uneven test files
    if "$PY" -c 'import sys, xdist; sys.exit(tuple(map(int, xdist.__version__.split(".")[:2])) < (3, 2))' 2>/dev/null; then
      dist=worksteal
    fi
    args+=(-n "$WORKERS" --dist "$dist"); note="xdist -n $WORKERS --dist $dist"
  elif "$PY" -c 'import xdist' 2>/dev/null; then
    args+=(-n 0)  # pytest.ini asks for two workers; serial means this process
  fi
  if "$PY" -c 'import pytest_timeout' 2>/dev/null; then
    args+=(--timeout="$TEST_TIMEOUT"); note="$note, --timeout $TEST_TIMEOUT"
  fi
  # shellcheck disable=SC2206 - word splitting of the lists is meant
  args+=(${GPU_CHECK_PYTEST_ARGS:-} $TESTS)
  local limit=$SUITE_S
  local keep=$SUMMARY_RESERVE
  # keep the benchmark's time, and the grace a cut suite takes to stop
  if bench_after_suite; then keep=$((keep + GRACE_S + MAIN_RESERVE + PATHS_RESERVE)); fi
  (( limit > $(left) - keep )) && limit=$(( $(left) - keep ))
  if (( limit < 10 )); then
    say "suite: no time left"; record suite 1 0 0 false "no time left"; return
  fi
  say "suite: ${TESTS:-the whole default suite} ($note), limit ${limit} s"
  run_limited "$limit" "$OUT/suite.log" env GPU_CHECK_RESULTS="$OUT/tests.jsonl" \
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" XLA_PYTHON_CLIENT_PREALLOCATE=false \
    "$PY" "${args[@]}"
  say "suite: rc $RC in ${ELAPSED} s$($TIMED_OUT && echo ' (TIMED OUT)')"
  tail -3 "$OUT/suite.log"
  record suite "$RC" "$ELAPSED" "$limit" "$TIMED_OUT" "$note"
  summarise
}

# -- 4. the accelerator benchmark subset ----------------------------------------------------
run_bench() {
  local reserve=0 limit paths=()
  # shellcheck disable=SC2206
  paths=($PATHS)
  (( ${#paths[@]} )) && reserve=$PATHS_RESERVE
  limit=$(( $(left) - reserve - SUMMARY_RESERVE ))
  if (( limit < MAIN_MIN_S )); then
    say "bench: only ${limit} s left for the job (needs ${MAIN_MIN_S}): skipped"
    record "bench out_in:fused" 1 0 "$limit" false "no time left"
  else
    local bindings=("bench_accelerator.dtypes = ['$DTYPE']" "bench_accelerator.batch_sizes = [1]"
                    "bench_accelerator.gammas = [5]" "bench_accelerator.methods = ['specdecode']"
                    "bench_accelerator.kernel_layout = 'out_in'"
                    "bench_accelerator.fused_projections = True"
                    "bench_accelerator.rounds_per_sync = [1, 8]"
                    "bench_accelerator.target_step_widths = []" "bench_accelerator.peers = []"
                    "${JOB_BINDINGS[@]}"
                    "OUT_PATH = '$WORK/bench/main.json'" "MARKDOWN_PATH = '$WORK/bench/main.md'")
    local line args=(-m benchmarks.main "--gin_file=$GIN")
    while IFS= read -r line; do
      [ -n "$line" ] && bindings+=("$line")
    done <<<"${GPU_CHECK_BENCH_BINDINGS:-}"
    for line in "${bindings[@]}"; do args+=("--gin_bindings=$line"); done
    say "bench: $GIN (out_in:fused, $DTYPE, batch 1, K = 1 and 6, AR + specdecode G = 5), limit ${limit} s"
    echo "== $GIN (out_in:fused)" >>"$OUT/bench.log"
    run_limited "$limit" "$OUT/bench.log" "$PY" "${args[@]}"
    say "bench out_in:fused: rc $RC in ${ELAPSED} s$($TIMED_OUT && echo ' (TIMED OUT)')"
    (( RC )) && tail -5 "$OUT/bench.log"
    record "bench out_in:fused" "$RC" "$ELAPSED" "$limit" "$TIMED_OUT"
    summarise
  fi
  if (( ${#paths[@]} )); then
    limit=$(( $(left) - SUMMARY_RESERVE ))
    if (( limit < 10 )); then
      say "bench paths: no time left"; record "bench ${paths[*]}" 1 0 "$limit" false "no time left"
      return
    fi
    say "bench: in-loop steps of ${paths[*]} ($DTYPE, batch 1, K = 1 and 6), limit ${limit} s"
    echo "== tools/gpu_check_bench.py ${paths[*]}" >>"$OUT/bench.log"
    run_limited "$limit" "$OUT/bench.log" "$PY" tools/gpu_check_bench.py \
      --out "$WORK/bench/paths.json" --paths "${paths[@]}" --dtype "$DTYPE" --batch 1 --gamma 5 \
      "${BENCH_MODELS[@]}" "${BENCH_SIZES[@]}"
    say "bench ${paths[*]}: rc $RC in ${ELAPSED} s$($TIMED_OUT && echo ' (TIMED OUT)')"
    (( RC )) && tail -5 "$OUT/bench.log"
    record "bench ${paths[*]}" "$RC" "$ELAPSED" "$limit" "$TIMED_OUT"
    summarise
  fi
}

for stage in $STAGES; do
  case "$stage" in
    suite) run_suite ;;
    bench) run_bench ;;
    *) say "unknown stage '$stage' (suite, bench)" ;;
  esac
done

finish
status=$("$PY" - "$OUT/gpu_check.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
bad = any(st["rc"] or st["timed_out"] for st in s["stages"])
t = s["suite"]["totals"]
print(1 if bad or t["failed"] or t["error"] or t["not run"] else 0)
EOF
)
say "done in $((SECONDS - T0)) s; exit status ${status:-1}"
exit "${status:-1}"
