#!/usr/bin/env bash
# Creates .venv (Python 3.12) with the pinned framework versions of harnesses/python/requirements.txt.
# Idempotent: does nothing when .venv already holds exactly these requirements.
# First run: ~3-5 min and ~6 GB of disk (the PyPI torch wheel pulls the CUDA libraries).
#
#   scripts/setup-python.sh --env NAME PACKAGE==VERSION...
# builds another environment, .venv-NAME, with the given framework releases (and what the worker needs:
# numpy, safetensors, ml_dtypes, expecttest), for fuzzing older releases:
#   scripts/setup-python.sh --env torch29 torch==2.9.1
#   shardfuzz fuzz --target torch-dtensor --python .venv-torch29/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
find_python() {
  for c in "${SHARDFUZZ_BASE_PYTHON:-}" python3.12 "$HOME/.pyenv/versions/3.12"*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    [[ -n $c ]] && command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$c"; return; }
  done
  if command -v pyenv >/dev/null 2>&1; then
    local v
    v=$(pyenv versions --bare | grep -E '^3\.12' | tail -1 || true)
    [[ -n $v ]] && { echo "$(pyenv root)/versions/$v/bin/python3.12"; return; }
  fi
  return 1
}
if [[ ${1:-} == --env ]]; then
  name=${2:?usage: setup-python.sh --env NAME PACKAGE==VERSION...}
  shift 2
  [[ $# -gt 0 ]] || { echo "setup-python: --env $name: name the framework releases (e.g. torch==2.9.1)" >&2; exit 2; }
  env_dir=.venv-$name
  req_line="$* numpy safetensors ml_dtypes expecttest"
  if [[ -f $env_dir/.shardfuzz-requirements ]] && [[ $(cat "$env_dir/.shardfuzz-requirements") == "$req_line" ]]; then
    echo "setup-python: $env_dir up to date"
    exit 0
  fi
  base=$(find_python) || { echo "setup-python: Python 3.12 not found (set SHARDFUZZ_BASE_PYTHON)" >&2; exit 1; }
  start=$(date +%s)
  [[ -x $env_dir/bin/python ]] || "$base" -m venv "$env_dir"
  # shellcheck disable=SC2086
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check $req_line
  echo "$req_line" > "$env_dir/.shardfuzz-requirements"
  echo "setup-python: $env_dir done in $(( $(date +%s) - start )) s, $(du -sh "$env_dir" | cut -f1) on disk"
  exit 0
fi
req=harnesses/python/requirements.txt
stamp=.venv/.shardfuzz-requirements
if [[ -f $stamp ]] && cmp -s "$req" "$stamp" && .venv/bin/python -c 'import torch, jax, deepspeed, megatron.core' 2>/dev/null; then
  echo "setup-python: .venv up to date ($(.venv/bin/python --version))"
  exit 0
fi
py=$(find_python) || { echo "setup-python: Python 3.12 not found (set SHARDFUZZ_BASE_PYTHON)" >&2; exit 1; }
echo "setup-python: creating .venv with $py ($("$py" --version))"
start=$(date +%s)
[[ -x .venv/bin/python ]] || "$py" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
echo "setup-python: done in $(( $(date +%s) - start )) s, $(du -sh .venv | cut -f1) on disk"
