#!/usr/bin/env bash
# Fuzzes each Python framework target for $SECONDS_PER_TARGET (default 60 s) from the seed corpus and
# fails on a false positive: any divergent finding, a crash whose site lies in our own worker code,
# or a hang that is ours, and on any harness error (out/harness-errors/: our worker failed, a tensor
# was not returned). A hang report names where each stuck rank waits and through which
# framework call our code got there; a hang is the framework's only when every stuck rank waits
# inside the framework, entered through a framework API other than a bare collective (a collective
# our harness issued itself, e.g. ranks running different numbers of them, is our mistake). Every
# other finding is real: listed, with its verdict, in target/fuzz-python/<target>/findings/.
# A divergence of a library-op case (an op of the framework's own vocabulary, whose reference is the
# framework's own float64 computation) is a finding of the framework when, for torch-dtensor's simulated
# ranks, it was confirmed on real process-group ranks, and the same case (re-run here) diverges
# - in float64 too: the oracle's bounds in low precision are what a false positive would come from, and
#   float64 leaves them no room; or
# - in float32 and in bfloat16 alike, the divergent tensor's error within a factor 4 in both: their unit
#   round-offs differ by 2^16, and round-off scales with it, while a dropped element or a doubled sum does
#   not. A float64 program is another program: the target passes cotangents in float64, converted to the
#   compute dtype inside the jitted step, and XLA doubles a conv weight gradient after that convert (none
#   exists in float64: docs/findings/jax-0.12-gspmd-conv-weight-grad-doubled-converted-cotangent.py).
# Verified examples, each with a standalone repro: docs/findings/.
# A divergence of a model case is a known finding (the test suite's baseline) when the same case passes
# with the fix of an already reported bug applied (harnesses/python/shardfuzz_worker/known_fixes.py, each
# with its repro in docs/findings/ and listed in the README); any other is a false positive.
# The rules are code in harnesses/python/shardfuzz_worker/ci_findings.py (unit tests: tests/test_ci_findings.py).
# SEED picks the campaign seed (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SECONDS_PER_TARGET:-60}
seed=${SEED:-1}
bin=${SHARDFUZZ_BIN:-target/release/shardfuzz}
targets=${TARGETS:-$($bin targets | awk 'NR > 2 && $1 != "native" && $1 != "nop" && $2 == "available" {print $1}')}
status=0
for t in $targets; do
  out=target/fuzz-python/$t
  rm -rf "$out"
  $bin fuzz --quiet --target "$t" --corpus corpus --out "$out" --time "${secs}s" --seed "$seed" 2>&1 | grep -E '^done:' | sed "s/^/$t: /"
  PYTHONPATH=harnesses/python SHARDFUZZ_BIN=$bin .venv/bin/python -m shardfuzz_worker.ci_findings "$out" "$t" || status=1
done
exit $status
