#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests, and every seed case.
# Sets up what it needs (nothing beyond the Rust toolchain for the native target).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
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
echo "all tests passed"
