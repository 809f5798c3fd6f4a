#!/usr/bin/env bash
# Bug-finding benchmark: every injected bug, K campaign seeds, time to the first finding with and
# without coverage feedback (table, CSV, PNG); then a clean campaign that must report 0 findings.
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds=${SEEDS:-5}
budget=${BUDGET:-60s}
clean=${CLEAN_TIME:-10m}
cargo build --release -q
bin=target/release/shardfuzz
$bin bench bugs --seeds "$seeds" --budget "$budget" --csv bench-bugs.csv --png bench-bugs.png
out=$(mktemp -d)
echo "clean native target, $clean:"
$bin fuzz --quiet --target native --corpus corpus --out "$out" --time "$clean" --fail-on-finding 2>&1 | grep -E '^done:|^  '
echo "clean campaign: exit $? (0 = no finding)"
