#!/usr/bin/env bash
# What coverage guidance buys on real framework code (FuzzBench-style): per Python target, guided
# campaigns against pure random generation for the same wall time, framework lines/branches covered
# over time (median of runs), findings; writes bench-guidance/guidance.csv and guidance.png.
# TARGETS (comma-separated, default: every Python target), TIME (default 10m), RUNS (default 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q
args=(bench guidance --time "${TIME:-10m}" --runs "${RUNS:-3}" --out bench-guidance)
if [ -n "${TARGETS:-}" ]; then args+=(--targets "$TARGETS"); fi
target/release/shardfuzz "${args[@]}"
