#!/usr/bin/env bash
# Fuzzer throughput on the native target: 60 s (or $SECONDS_PER_RUN) with --jobs 1 and --jobs 2;
# execs/s and the fuzzer's overhead (time outside the target and oracle). Prints a table, writes a CSV.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${SECONDS_PER_RUN:-60}
cargo build --release -q
bin=target/release/shardfuzz
csv=${CSV:-bench-throughput.csv}
echo "jobs,seconds,execs,execs_per_sec,execs_per_sec_per_core,overhead_pct" > "$csv"
printf '%-5s %8s %10s %10s %14s %10s\n' jobs seconds execs execs/s execs/s/core overhead
for jobs in 1 2; do
  out=$(mktemp -d)
  line=$($bin fuzz --quiet --target native --corpus corpus --out "$out" --time "${secs}s" --jobs "$jobs" 2>&1 | grep '^done:' | tail -1)
  execs=$(sed -E 's/^done: ([0-9]+) execs.*/\1/' <<<"$line")
  rate=$(sed -E 's/.*\(([0-9.]+)\/s\).*/\1/' <<<"$line")
  target_pct=$(sed -E 's/.*target\+oracle ([0-9.]+) %.*/\1/' <<<"$line")
  overhead=$(awk -v t="$target_pct" 'BEGIN { o = 100 - t; if (o < 0) o = 0; printf "%.1f", o }')
  per_core=$(awk -v r="$rate" -v j="$jobs" 'BEGIN { printf "%.0f", r / (j < 2 ? 1 : j) }')
  printf '%-5s %8s %10s %10s %14s %9s%%\n' "$jobs" "$secs" "$execs" "$rate" "$per_core" "$overhead"
  echo "$jobs,$secs,$execs,$rate,$per_core,$overhead" >> "$csv"
  rm -rf "$out"
done
echo "csv: $csv"
