#!/usr/bin/env bash
# Creates .venv (Python 3.12) with the pinned framework versions of harnesses/python/requirements.txt.
# Idempotent: does nothing when .venv already holds exactly these requirements.
# First run: ~3-5 min and ~6 GB of disk (the PyPI torch wheel pulls the CUDA libraries).
set -euo pipefail
cd "$(dirname "$0")/.."
req=harnesses/python/requirements.txt
stamp=.venv/.shardfuzz-requirements
if [[ -f $stamp ]] && cmp -s "$req" "$stamp" && .venv/bin/python -c 'import torch, jax, deepspeed, megatron.core' 2>/dev/null; then
  echo "setup-python: .venv up to date ($(.venv/bin/python --version))"
  exit 0
fi
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
py=$(find_python) || { echo "setup-python: Python 3.12 not found (set SHARDFUZZ_BASE_PYTHON)" >&2; exit 1; }
echo "setup-python: creating .venv with $py ($("$py" --version))"
start=$(date +%s)
[[ -x .venv/bin/python ]] || "$py" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
echo "setup-python: done in $(( $(date +%s) - start )) s, $(du -sh .venv | cut -f1) on disk"
