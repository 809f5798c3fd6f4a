#!/usr/bin/env bash
# The extended Python-target tests, kept out of scripts/test.sh so that it finishes within CI's 90 min on 2 cores:
# every seed case through every Python target against its list of known seed findings, and the end-to-end tests
# of known framework bugs and training features that take over 170 s each (about 80 min in all on 2 cores).
# Needs what scripts/test.sh sets up (run it first).
set -euo pipefail
cd "$(dirname "$0")/.."
export SHARDFUZZ_REQUIRE_PYTHON=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/target/jax-compilation-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
cargo test --release --test python_targets -- --ignored "$@"
