#!/usr/bin/env bash
# Builds the Python environments the framework targets run in, each from its pinned requirement file
# harnesses/python/requirements/NAME.txt (a `# python X.Y` line names its interpreter):
#   main        .venv             Python 3.12: torch, jax, deepspeed, megatron-core   (~3-5 min, ~6 GB)
#   colossalai  .venv-colossalai  Python 3.10: torch 2.5.1, colossalai 0.5.0, transformers 4.51.3
#                                 (~5 min, ~5.7 GB)
#   megatron015 .venv-megatron015 Python 3.12: torch 2.15.0, megatron-core 0.15.3 (an older release, for the
#                                 test suite's historical Megatron bugs; ~2 min, ~5.4 GB)
#   deepspeed017 .venv-deepspeed017 Python 3.12: deepspeed 0.17.6 over main's packages (an older release, for the
#                                 test suite's historical DeepSpeed bugs; ~15 s, ~60 MB)
#   jax04       .venv-jax04       Python 3.12: jax 0.4.38 over main's packages (an older release, for the test
#                                 suite's historical JAX bugs; ~20 s, ~410 MB)
# and installs the worker package (harnesses/python, editable) into each. Idempotent: an environment that
# already holds exactly its requirements is left alone.
#
#   scripts/setup-python.sh                   every named environment
#   scripts/setup-python.sh --named NAME      one of them
#   scripts/setup-python.sh --env NAME PACKAGE==VERSION...
# builds another environment, .venv-NAME (Python 3.12), with the given framework releases (and what the
# worker needs: numpy, safetensors, ml_dtypes, expecttest, einops, packaging), for fuzzing older releases:
#   scripts/setup-python.sh --env torch29 torch==2.9.1
#   shardfuzz fuzz --target torch-dtensor --python .venv-torch29/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
reqs=harnesses/python/requirements

# An interpreter of version $1 (X.Y): $SHARDFUZZ_BASE_PYTHON_X_Y, pythonX.Y on PATH, pyenv's, /usr/bin's.
find_python() {
  local want=$1 var="SHARDFUZZ_BASE_PYTHON_${1//./_}" c
  for c in "${!var:-}" "python$want" "$HOME/.pyenv/versions/$want"*/bin/"python$want" /root/.pyenv/versions/"$want"*/bin/"python$want" "/usr/bin/python$want"; do
    [[ -n $c ]] && command -v "$c" >/dev/null 2>&1 &&
      "$c" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$want'" 2>/dev/null && { echo "$c"; return; }
  done
  if command -v pyenv >/dev/null 2>&1; then
    local v
    v=$(pyenv versions --bare | grep -E "^${want//./\\.}(\\.|$)" | tail -1 || true)
    [[ -n $v ]] && { echo "$(pyenv root)/versions/$v/bin/python$want"; return; }
  fi
  echo "setup-python: Python $want not found (set $var)" >&2
  return 1
}

# Installs the worker package into environment $1 (editable: the checkout's code, no copy).
install_worker() {
  "$1/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e harnesses/python
}

# Makes environment $1 see environment $2's packages after its own (a `# overlay NAME` line in a requirement file):
# an older release of one framework beside everything else of the other environment, in seconds and megabytes.
overlay_on() {
  local base_dir own base
  base_dir=$([[ $2 == main ]] && echo .venv || echo ".venv-$2")
  own=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  base=$(cd "$("$base_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && pwd -P)
  echo "import site; site.addsitedir('$base')" > "$own/shardfuzz-overlay-$2.pth"
}

build_named() {
  local name=$1 req="$reqs/$1.txt" dir
  [[ -f $req ]] || { echo "setup-python: no environment $name ($req missing)" >&2; exit 2; }
  dir=$([[ $name == main ]] && echo .venv || echo ".venv-$name")
  if [[ -f $dir/.shardfuzz-requirements ]] && cmp -s "$req" "$dir/.shardfuzz-requirements" &&
     "$dir/bin/python" -c 'import shardfuzz_worker' 2>/dev/null; then
    echo "setup-python: $dir up to date ($("$dir/bin/python" --version))"
    return
  fi
  local version py start overlay
  overlay=$(sed -n 's/^# overlay \([a-z0-9]*\)$/\1/p' "$req" | head -1)
  [[ -z $overlay ]] || build_named "$overlay"
  version=$(sed -n 's/^# python \([0-9.]*\)$/\1/p' "$req" | head -1)
  py=$(find_python "${version:?$req has no '# python X.Y' line}")
  echo "setup-python: building $dir with $py ($("$py" --version))${overlay:+ over $overlay}"
  start=$(date +%s)
  [[ -x $dir/bin/python ]] || "$py" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip setuptools
  if [[ -n $overlay ]]; then
    overlay_on "$dir" "$overlay"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$req"
  else
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  fi
  install_worker "$dir"
  cp "$req" "$dir/.shardfuzz-requirements"
  echo "setup-python: $dir done in $(( $(date +%s) - start )) s, $(du -sh "$dir" | cut -f1) on disk"
}

case ${1:-} in
  --env)
    name=${2:?usage: setup-python.sh --env NAME PACKAGE==VERSION...}
    shift 2
    [[ $# -gt 0 ]] || { echo "setup-python: --env $name: name the framework releases (e.g. torch==2.9.1)" >&2; exit 2; }
    env_dir=.venv-$name
    req_line="$* numpy safetensors ml_dtypes expecttest einops packaging"
    if [[ -f $env_dir/.shardfuzz-requirements ]] && [[ $(cat "$env_dir/.shardfuzz-requirements") == "$req_line" ]]; then
      echo "setup-python: $env_dir up to date"
      exit 0
    fi
    base=$(find_python 3.12)
    start=$(date +%s)
    [[ -x $env_dir/bin/python ]] || "$base" -m venv "$env_dir"
    # shellcheck disable=SC2086
    "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check setuptools $req_line
    install_worker "$env_dir"
    echo "$req_line" > "$env_dir/.shardfuzz-requirements"
    echo "setup-python: $env_dir done in $(( $(date +%s) - start )) s, $(du -sh "$env_dir" | cut -f1) on disk"
    ;;
  --named)
    build_named "${2:?usage: setup-python.sh --named NAME}"
    ;;
  "")
    for req in "$reqs"/*.txt; do
      build_named "$(basename "$req" .txt)"
    done
    ;;
  *)
    echo "usage: setup-python.sh [--named NAME | --env NAME PACKAGE==VERSION...]" >&2
    exit 2
    ;;
esac
