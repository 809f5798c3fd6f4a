#!/usr/bin/env bash
# False positives of the clean native target over N random cases per dtype (default 100000).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${CASES:-100000}
cargo build --release -q
echo "dtype,cases,false_positives,cases_per_sec" > bench-clean.csv
for d in f64 f32 bf16 f16; do
  json=$(target/release/shardfuzz bench clean --cases "$n" --dtype "$d" --seed 7000000 --json || true)
  python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(f"{v[\"dtype\"]:>5}: {v[\"cases\"]} cases, {v[\"false_positives\"]} false positives, {v[\"cases_per_sec\"]:.0f} cases/s"); open("bench-clean.csv","a").write(f"{v[\"dtype\"]},{v[\"cases\"]},{v[\"false_positives\"]},{v[\"cases_per_sec\"]:.0f}\n")' "$json"
done
