#!/usr/bin/env bash
# The extended Python-target tests, kept out of scripts/test.sh so that it finishes within CI's 90 min on 2 cores:
# every seed case through every Python target against its list of known seed findings, and the end-to-end tests
# of known framework bugs and training features that take over 34 s each (about 2 h in all on 2 cores); and the
# repro-script unit tests of variants whose fault another class already catches (SHARDFUZZ_EXTENDED_TESTS=1).
# Seven python_repro tests (a standalone script per target and bug, each over 100 s) run here too.
# Needs what scripts/test.sh sets up (run it first).
set -euo pipefail
cd "$(dirname "$0")/.."
export SHARDFUZZ_REQUIRE_PYTHON=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/target/jax-compilation-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
(cd harnesses/python && SHARDFUZZ_EXTENDED_TESTS=1 ../../.venv/bin/python -m unittest -k TorchFsdp2BesideTp -k MegatronTpDp \
  -k MegatronTpPipeline -k MegatronTpPerToken -k MegatronDdpPerToken tests.test_repro)
(cd harnesses/python && SHARDFUZZ_EXTENDED_TESTS=1 ../../.venv/bin/python -m unittest -k LibraryOpRepro tests.test_torch_library_ops)
cargo test --release --test python_repro --test python_targets -- --ignored "$@"
