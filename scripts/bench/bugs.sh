#!/usr/bin/env bash
# Bug-finding benchmark: how deep each bug's region lies, then every injected bug, K campaign seeds,
# time to the first finding with and without coverage feedback and with pure random generation
# (table, CSV, PNG); each fault's detection per dtype on random cases in its region; then a clean
# campaign that must report 0 findings.
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds=${SEEDS:-5}
budget=${BUDGET:-60s}
clean=${CLEAN_TIME:-10m}
# One campaign per core: each campaign runs on one core, as the goals are stated.
jobs=${JOBS:-$(nproc)}
cargo build --release -q
bin=target/release/shardfuzz
echo "how deep each bug's region lies: share of random cases / of seed cases mutated 1-3 times that trigger it"
$bin bench bugs --rates 1000
$bin bench bugs --seeds "$seeds" --budget "$budget" --jobs "$jobs" --random --csv bench-bugs.csv --png bench-bugs.png
$bin bench bugs --per-dtype --region-cases 30 || true
out=$(mktemp -d)
echo "clean native target, $clean:"
status=0
$bin fuzz --quiet --target native --corpus corpus --out "$out/campaign" --time "$clean" --fail-on-finding >"$out/clean.log" 2>&1 || status=$?
grep -E '^done:|^  ' "$out/clean.log"
echo "clean campaign: exit $status (0 = no finding)"
exit "$status"
