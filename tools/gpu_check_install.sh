# Sourced by tools/gpu_check.sh and tools/feature_gpu_check.sh (not run alone): the
# install of the carried wheel set (.gpu_check/wheels, from tools/gpu_check_prepare.sh)
# on a GPU machine without network.
#
#   gpu_check_install CARRY SITE TINY LOG
#
# installs CARRY/wheels/*.whl with pip --no-index --no-deps --target SITE (pip's output
# in LOG). Full mode (TINY 0): puts the working tree, then SITE, on PYTHONPATH and
# SITE/bin on PATH (exported), and links lint-imports into the interpreter's bin folder
# (tests/test_layers.py runs it from there). Tiny mode (TINY 1): the same install of the
# cp312 manylinux wheels into SITE, a temp folder that is not used (this Python has the
# packages). Needs the caller's PY (the interpreter), ROOT (the working tree) and say
# (prints a line). Returns 0, pip's status, or 1 when CARRY has no wheels; sets
# INSTALL_NOTE (the number of wheels, or why none).

gpu_check_install() {
  local carry=$1 site=$2 tiny=$3 log=$4 rc=0 count exe_dir
  local pip_flags=()
  if ! compgen -G "$carry/wheels/*.whl" >/dev/null; then
    INSTALL_NOTE="no wheels in $carry/wheels"
    say "no wheels in $carry/wheels (run tools/gpu_check_prepare.sh here and carry $carry)"
    return 1
  fi
  count=$(ls "$carry"/wheels/*.whl | wc -l)
  INSTALL_NOTE="$count wheels"
  if (( tiny )); then
    # Exercise the same install as there (cp312 wheels) into a temp folder, not used here.
    pip_flags=(--python-version 3.12 --implementation cp --abi cp312
               --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
               --platform manylinux2014_x86_64 --platform any)
  fi
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --disable-pip-version-check "${pip_flags[@]}" --target "$site" "$carry"/wheels/*.whl \
      >"$log" 2>&1; then
    say "installed $count wheels into $site"
  else
    rc=$?
    say "wheel install failed (rc $rc):"; tail -20 "$log"
  fi
  if (( ! tiny )); then
    # The working tree first (it is what is tested), then the carried packages.
    export PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$site/bin:$PATH"
    exe_dir=$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))')
    if [ -e "$site/bin/lint-imports" ] && [ ! -e "$exe_dir/lint-imports" ]; then
      ln -s "$site/bin/lint-imports" "$exe_dir/lint-imports" 2>/dev/null \
        && say "linked $exe_dir/lint-imports" || say "could not link lint-imports into $exe_dir"
    fi
  else
    say "tiny: $site is not put on PYTHONPATH (this Python has the packages; the wheels are cp312)"
  fi
  return "$rc"
}
