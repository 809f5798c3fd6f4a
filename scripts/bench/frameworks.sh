#!/usr/bin/env bash
# Python framework targets: cases/s with persistent workers and rank pools against respawning them
# for every case (the ratio), and cases/s on new shapes and on fresh library-op cases; prints a table, writes bench-frameworks.csv.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup-python.sh
cargo build --release -q
target/release/shardfuzz bench frameworks --repeats "${REPEATS:-3}" --respawn-cases "${RESPAWN_CASES:-3}" \
  --new-cases "${NEW_CASES:-200}" --library-cases "${LIBRARY_CASES:-300}" --csv bench-frameworks.csv ${TARGETS:+--targets "$TARGETS"}
