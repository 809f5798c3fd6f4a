#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests, and every seed case.
# Sets up what it needs: the Rust toolchain builds the native target; scripts/setup-python.sh
# creates .venv, .venv-colossalai, .venv-megatron015, .venv-deepspeed017 and .venv-jax04 (the last two overlays on .venv) with the pinned
# frameworks for the Python targets (first run: ~12 min, ~18 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# The Rust builds (CPU) run while the Python environments are set up (mostly downloads): their output
# is printed once both are done, and the steps below reuse what they built.
mkdir -p target
(
  echo "== cargo fmt --check" && cargo fmt --all -- --check &&
    echo "== cargo clippy" && cargo clippy --workspace --all-targets --release -- -D warnings &&
    echo "== cargo test --no-run" && cargo test --workspace --release --no-run
) > target/rust-build.log 2>&1 &
rust_build=$!
echo "== Python framework environment"
scripts/setup-python.sh || { pkill -P "$rust_build"; kill "$rust_build"; exit 1; } 2>/dev/null
rust_status=0
wait "$rust_build" || rust_status=$?
cat target/rust-build.log
[[ $rust_status == 0 ]] || { echo "the Rust build, formatting or lints failed" >&2; exit 1; }
# The Python-target tests fail (instead of skipping) without the environment.
export SHARDFUZZ_REQUIRE_PYTHON=1
# JAX's persistent compilation cache, shared by every JAX worker the suite starts (the same programs compile in
# many processes: both JAX targets' single-device baselines, every campaign's seed replay). Verdicts, reasons and
# coverage features are the same with it (README, "JAX model cases").
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/target/jax-compilation-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
echo "== Python worker unit tests"
(cd harnesses/python && ../../.venv/bin/python -m unittest discover -s tests)
echo "== Python worker unit tests in the colossalai environment"
(cd harnesses/python && ../../.venv-colossalai/bin/python -m unittest tests.test_colossalai tests.test_mutants)
echo "== cargo test"
cargo test --workspace --release
echo "== seed corpus through the native target"
./target/release/shardfuzz run --target native corpus/*.json > target/corpus-run.txt || {
  cat target/corpus-run.txt
  echo "seed corpus: a case did not pass" >&2
  exit 1
}
grep -c '^case ' target/corpus-run.txt | xargs echo "seed cases run:"
echo "== clean fuzzing, short (no finding may appear)"
./target/release/shardfuzz bench clean --cases 3000 --seed 1000
echo "== fuzzing each Python framework target (no false positive may appear)"
# Every seed case runs on every target first, whatever the time; then 5 s of search per target, a smoke test only
# (the suite must finish within CI's 90 min on 2 cores; longer runs: SECONDS_PER_TARGET=120
# scripts/fuzz-python-targets.sh, or a campaign).
SECONDS_PER_TARGET=${SECONDS_PER_TARGET:-5} scripts/fuzz-python-targets.sh
echo "all tests passed"
