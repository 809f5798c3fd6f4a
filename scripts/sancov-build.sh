#!/usr/bin/env bash
# Builds shardfuzz with SanitizerCoverage edges in the native target and kernels (stable rustc):
# target/sancov/release/shardfuzz. Its status line then reports "edges on".
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTC_WRAPPER="$PWD/scripts/sancov-rustc.sh" CARGO_TARGET_DIR=target/sancov cargo build --release "$@"
echo "built target/sancov/release/shardfuzz"
