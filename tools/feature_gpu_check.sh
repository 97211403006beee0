#!/usr/bin/env bash
# One-call GPU run of the feature-head step benchmark (benchmarks/configs/feature_steps.gin,
# benchmarks/feature_steps.py) on a GPU machine without network:
#   1. installs the carried wheels (.gpu_check/wheels, from tools/gpu_check_prepare.sh)
#      exactly as tools/gpu_check.sh does (tools/gpu_check_install.sh), the working tree
#      first on PYTHONPATH;
#   2. writes nvidia-smi and the versions into $OUT/env.txt;
#   3. runs the bench_feature_steps job with the full shapes (Qwen2.5-Coder 1.5B target,
#      0.5B drafter model, random weights, bf16, batch 1, cache fill 128, kernels out_in):
#      in-loop steps of the target (K = 1, 4..8), the drafter model (K = 1), the feature
#      head's draft step (full head, 32,768 and 16,384 ids; MLP 8,960 and 2,048), first
#      logits and window call (K = 6), and the predicted speedups; progress lines with
#      timestamps in $OUT/feature_steps.log. A failing step is recorded and the job goes
#      on; the job is cut (SIGINT, then SIGKILL) at the deadline, its report rewritten
#      after every step, so what it finished is kept;
#   4. leaves in $OUT: feature_steps.json, feature_steps.md, feature_steps.log, env.txt,
#      install.log.
# Exit status 0 when every step ran; 1 otherwise (a failed step, no report, a cut run).
#
# Usage:
#   bash tools/feature_gpu_check.sh          # on the GPU machine (OUT set by the device tool)
#   bash tools/feature_gpu_check.sh --tiny   # the same flow on CPU in about a minute:
#                                            # benchmarks/configs/feature_steps_tiny.gin
# Knobs (environment): OUT (default: a new temp folder), PYTHON (python3), GPU_CHECK_DIR
# (.gpu_check), GPU_CHECK_SITE (/tmp/site; tiny: a temp folder), FEATURE_CHECK_DEADLINE_S
# (the whole command; full 300, tiny 240), FEATURE_CHECK_BINDINGS (more gin bindings for
# the job, one a line).

set -uo pipefail  # no -e: the report is always checked

T0=$SECONDS
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

# shellcheck source=tools/gpu_check_common.sh
source "$ROOT/tools/gpu_check_common.sh"
gpu_check_args "${BASH_SOURCE[0]}" "$@"
gpu_check_dirs feature_check
trap 'rm -rf "$WORK"' EXIT

if (( TINY )); then
  MODE=tiny
  DEADLINE=${FEATURE_CHECK_DEADLINE_S:-240}
  SITE=${GPU_CHECK_SITE:-$WORK/site}
  GIN=benchmarks/configs/feature_steps_tiny.gin
else
  MODE=full
  DEADLINE=${FEATURE_CHECK_DEADLINE_S:-300}
  SITE=${GPU_CHECK_SITE:-/tmp/site}
  GIN=benchmarks/configs/feature_steps.gin
fi
GRACE_S=20

say "feature_gpu_check ($MODE): root $ROOT, OUT $OUT, deadline ${DEADLINE} s"

# -- 1. install ----------------------------------------------------------------------------
# shellcheck source=tools/gpu_check_install.sh
source "$ROOT/tools/gpu_check_install.sh"
if gpu_check_install "$CARRY" "$SITE" "$TINY" "$OUT/install.log"; then
  install_rc=0
else
  install_rc=$?
  say "install: rc $install_rc ($INSTALL_NOTE); going on with what this Python has"
fi

# -- 2. environment ------------------------------------------------------------------------
{
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1; else echo "(no nvidia-smi)"; fi
  echo "== versions"
  "$PY" - <<'EOF' 2>&1
import importlib.metadata as md, platform
print("python", platform.python_version())
for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax", "numpy",
             "gin-config", "specdec_jax"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "missing")
EOF
} >"$OUT/env.txt"
head -12 "$OUT/env.txt"

# -- 3. the job ----------------------------------------------------------------------------
args=(-m benchmarks.main "--gin_file=$GIN" "--gin_bindings=OUT_DIR = '$OUT'")
while IFS= read -r line; do
  [ -n "$line" ] && args+=("--gin_bindings=$line")
done <<<"${FEATURE_CHECK_BINDINGS:-}"
limit=$(( $(left) - GRACE_S - 5 ))
say "job: $GIN, limit ${limit} s (progress in $OUT/feature_steps.log)"
run_limited --tee "$limit" "$OUT/feature_steps.log" "$PY" "${args[@]}"
job_rc=$RC
sleep 1  # tee's last lines
say "job: rc $job_rc in ${ELAPSED} s$($TIMED_OUT && echo ' (TIMED OUT)')"

# -- 4. check the report ---------------------------------------------------------------------
status=$("$PY" - "$OUT/feature_steps.json" "$job_rc" "$MODE" <<'EOF'
import json, sys
path, job_rc, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    report = json.load(open(path))
except (OSError, ValueError) as error:
    print(f"no report ({error})", file=sys.stderr)
    print(1)
    sys.exit()
steps = report.get("steps", [])
bad = [s for s in steps if s.get("status") != "ok"]
for s in bad:
    print(f"  {s['name']}: {s.get('status', 'running')} {s.get('error', '')[:300]}",
          file=sys.stderr)
env = report.get("environment", {})
print(f"{mode}: {len(steps) - len(bad)}/{len(steps)} steps ok, "
      f"{len(report.get('predicted', []))} predictions; {env.get('device_kind')} "
      f"({env.get('backend')}), {report.get('dtype')}, jax {env.get('jax')}, "
      f"{report.get('elapsed_s')} s", file=sys.stderr)
print(1 if bad or job_rc or not steps else 0)
EOF
)
if (( job_rc )) && [ -f "$OUT/feature_steps.md" ]; then  # a finished job printed it
  echo "== $OUT/feature_steps.md (as far as the job got)"; cat "$OUT/feature_steps.md"; echo
fi
say "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
say "done in $((SECONDS - T0)) s; exit status ${status:-1}"
exit "${status:-1}"
