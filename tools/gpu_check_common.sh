# Sourced by tools/gpu_check.sh and tools/feature_gpu_check.sh (not run alone): what the
# two one-call checks share besides the install (tools/gpu_check_install.sh).
#
#   gpu_check_args SCRIPT ARG...   parses --tiny (sets TINY to 1, else 0) and --help (prints
#                                  SCRIPT's header comment and exits 0); exits 2 on others
#   gpu_check_dirs NAME            sets PY ($PYTHON, python3), CARRY ($GPU_CHECK_DIR,
#                                  .gpu_check), OUT ($OUT, else a new NAME_out.XXXXXX temp
#                                  folder; made and absolute) and WORK (a new NAME_work.XXXXXX
#                                  temp folder); exports PYTHONUNBUFFERED=1
#   say TEXT...                    prints a line stamped with the seconds since T0
#   left                           prints the seconds left before DEADLINE (from T0)
#   run_limited [--tee] LIMIT LOG CMD...
#                                  runs CMD in its own process group, output appended to LOG
#                                  (--tee: also to stdout). At LIMIT seconds: SIGINT to CMD
#                                  (the jobs write what they have), after GRACE_S SIGKILL to
#                                  its group; the group is killed when CMD ends too. Sets RC
#                                  (124 when cut), ELAPSED and TIMED_OUT (true/false); CHILD
#                                  holds CMD's pid while it runs.
# The caller sets T0 (=$SECONDS at its start), DEADLINE and GRACE_S.

gpu_check_args() {
  local script=$1 arg
  shift
  TINY=0
  for arg in "$@"; do
    case "$arg" in
      --tiny) TINY=1 ;;
      -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$script"; exit 0 ;;
      *) echo "$(basename "$script"): unknown argument '$arg' (--tiny, --help)" >&2; exit 2 ;;
    esac
  done
}

gpu_check_dirs() {
  local name=$1
  PY=${PYTHON:-python3}
  CARRY=${GPU_CHECK_DIR:-.gpu_check}
  if [ -z "${OUT:-}" ]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/${name}_out.XXXXXX")
  fi
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/${name}_work.XXXXXX")
  export PYTHONUNBUFFERED=1
}

say() { printf '[%4ds] %s\n' $((SECONDS - T0)) "$*"; }
left() { echo $((DEADLINE - (SECONDS - T0))); }

run_limited() {
  local tee=0
  if [ "$1" = --tee ]; then tee=1; shift; fi
  local limit=$1 log=$2 start=$SECONDS waited pid
  shift 2
  TIMED_OUT=false
  set -m
  if (( tee )); then
    "$@" > >(tee -a "$log") 2>&1 &
  else
    "$@" >>"$log" 2>&1 &
  fi
  pid=$!
  CHILD=$pid
  set +m
  while kill -0 "$pid" 2>/dev/null; do
    if (( SECONDS - start >= limit )); then
      TIMED_OUT=true
      say "time limit of ${limit} s reached: SIGINT, then SIGKILL after ${GRACE_S} s"
      kill -INT "$pid" 2>/dev/null
      waited=0
      while kill -0 "$pid" 2>/dev/null && (( waited < GRACE_S )); do sleep 1; waited=$((waited + 1)); done
      kill -KILL -- "-$pid" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$pid" 2>/dev/null
  RC=$?
  kill -KILL -- "-$pid" 2>/dev/null  # whatever it left in its group (xdist workers)
  CHILD=
  if $TIMED_OUT; then RC=124; fi
  ELAPSED=$((SECONDS - start))
}
