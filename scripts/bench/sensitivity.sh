#!/usr/bin/env bash
# The oracle's sensitivity: correct runs corrupted the way bugs corrupt them, detection per corruption
# and dtype, on the native target and (when .venv exists) the Python targets; then each injected bug's
# trigger case in every dtype. CASES per target and dtype (default 200 native, 25 Python).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q
target/release/shardfuzz bench sensitivity --cases "${CASES:-200}" --csv bench-sensitivity-native.csv
if [[ -x .venv/bin/python ]]; then
  target/release/shardfuzz bench sensitivity --cases "${PY_CASES:-25}" --csv bench-sensitivity-python.csv \
    --target torch-tp,torch-fsdp2,deepspeed-zero,megatron-tp,jax-gspmd,torch-dtensor
fi
target/release/shardfuzz bench bugs --per-dtype || true
