#!/usr/bin/env bash
# RUSTC_WRAPPER: adds SanitizerCoverage (trace-pc-guard) to the crates under test only, so the edge
# map covers the native target and kernels, not the fuzzer, LibAFL or the standard library.
rustc="$1"; shift
crate=""
prev=""
for a in "$@"; do
  if [ "$prev" = "--crate-name" ]; then crate="$a"; fi
  prev="$a"
done
case "$crate" in
  shardfuzz_harnesses|shardfuzz_kernels)
    exec "$rustc" "$@" -C passes=sancov-module -C llvm-args=-sanitizer-coverage-level=3 \
      -C llvm-args=-sanitizer-coverage-trace-pc-guard ;;
  *) exec "$rustc" "$@" ;;
esac
