#!/usr/bin/env bash
# Prepares, on a machine with network, what tools/gpu_check.sh needs on a GPU machine
# without one (issue 36), in one folder to carry (default .gpu_check/, ignored by git
# through .git/info/exclude):
#   .gpu_check/wheels/    the packages the GPU image lacks (its list:
#                         /work/.library/device/KINDS.md), as cp312 manylinux wheels at
#                         the versions installed here, and the project's own wheel;
#   .gpu_check/data.tar.xz  exactly the corpus files the default suite reads
#                         (tools/gpu_check_data.py; runs `specdec-jax fetch data` first).
# Prints the sizes and fails if the working tree plus the folder would pass
# GPU_CHECK_LIMIT_MIB (60; the device tool's limit is 64 MiB).
#
# Usage: bash tools/gpu_check_prepare.sh [--no-data]   (PYTHON, GPU_CHECK_DIR as in gpu_check.sh)

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
DEST=${GPU_CHECK_DIR:-.gpu_check}
LIMIT_MIB=${GPU_CHECK_LIMIT_MIB:-60}
DATA=1
for arg in "$@"; do
  case "$arg" in
    --no-data) DATA=0 ;;
    -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu_check_prepare.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

# Not in the GPU image (KINDS.md, read 2026-11-17) but needed by setup.py's install
# requirements or by the default suite's dev/eval extras. The image has jax, flax, optax,
# orbax-checkpoint, numpy, safetensors, tokenizers, sentencepiece, tqdm, jinja2, pytest,
# pytest-xdist, pytest-timeout, torch, transformers, accelerate, scipy, psutil, sacrebleu,
# matplotlib, tensorboard, absl-py, six, click, rich, joblib, regex, requests, pyyaml.
# ruff (~11 MB) is left out: tests/test_lint.py skips without it (lint is machine-independent).
BINARY=(gin-config gguf import-linter grimp nltk defusedxml)
SDIST=(rouge-score)  # no wheel on PyPI: built here (pure Python)

quiet() {  # drops pip's notes on this machine's unused local indexes
  grep -v "is ignored: it is neither a file nor a directory" || true
}

pin() {  # NAME -> NAME==VERSION installed here (CI's versions), else NAME
  "$PY" - "$1" <<'EOF'
import importlib.metadata as md, sys
try:
    print(f"{sys.argv[1]}=={md.version(sys.argv[1])}")
except md.PackageNotFoundError:
    print(sys.argv[1])
EOF
}

# Ignored by git, so that the working tree that travels holds it only when carried.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$DEST/" "$exclude" 2>/dev/null || echo "/$DEST/" >>"$exclude"

rm -rf "$DEST/wheels"
mkdir -p "$DEST/wheels"
specs=()
for name in "${BINARY[@]}"; do specs+=("$(pin "$name")"); done
echo "== wheels for the GPU machine (cp312, manylinux x86_64): ${specs[*]}"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST/wheels" "${specs[@]}" 2>&1 \
  | quiet
for name in "${SDIST[@]}"; do
  spec=$(pin "$name")
  echo "== building $spec (pure Python, no wheel on PyPI)"
  "$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$DEST/wheels" "$spec" 2>&1 | quiet
done

echo "== the project's wheel (built from a copy of the tracked sources)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git ls-files -co --exclude-standard -z setup.py specdec_jax | xargs -0 cp --parents -t "$tmp"
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$DEST/wheels" "$tmp" >/dev/null

# One version of each: two stop the whole install there.
dups=$(ls "$DEST/wheels" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then echo "two versions of: $dups" >&2; exit 1; fi
echo "== what they require (check that the GPU image has each):"
for w in "$DEST"/wheels/*.whl; do
  reqs=$(unzip -p "$w" '*.dist-info/METADATA' | { grep '^Requires-Dist' || true; } \
         | { grep -v 'extra ==' || true; } | sed 's/Requires-Dist: //' | paste -sd, - \
         | sed 's/,/, /g')
  echo "  $(basename "$w"): ${reqs:-(none)}"
done

if (( DATA )); then
  echo "== test data (fetches missing corpora into the cache first)"
  "$PY" tools/gpu_check_data.py pack "$DEST/data.tar.xz"
fi

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
wheels=$(du -cb "$DEST"/wheels/*.whl | tail -1 | cut -f1)
data=$(stat -c %s "$DEST/data.tar.xz" 2>/dev/null || echo 0)
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$((wheels + data + tree))
echo "== sizes: wheels $(mib "$wheels") MiB, data $(mib "$data") MiB, working tree $(mib "$tree") MiB;" \
     "total $(mib "$total") MiB (limit ${LIMIT_MIB} MiB here, 64 MiB on the device tool)"
if (( total > LIMIT_MIB * 1048576 )); then
  echo "too big: $(mib "$total") MiB > ${LIMIT_MIB} MiB" >&2
  exit 1
fi
echo "== carry: [\"$DEST\"]"
echo "== run:   bash tools/gpu_check.sh   (timeout_s 540; try: bash tools/gpu_check.sh --tiny)"
