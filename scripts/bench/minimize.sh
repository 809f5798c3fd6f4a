#!/usr/bin/env bash
# The minimizer: each injected bug's trigger case, then every finding of a 60-s native campaign with
# all bugs injected (seed 7), each within 200 executions and 10 s. Writes bench-minimize-*.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q
bin=target/release/shardfuzz
$bin bench minimize
$bin bench minimize --json > bench-minimize-triggers.json
out=$(mktemp -d)
inject=()
for b in $($bin bugs | awk '{print $1}'); do inject+=(--inject "$b"); done
$bin fuzz "${inject[@]}" --time "${TIME:-60s}" --seed "${SEED:-7}" --out "$out" --quiet
$bin bench minimize --campaign "$out" --max-execs 200 --max-time 10s --json > bench-minimize-campaign.json
python3 - bench-minimize-campaign.json <<'PY'
import json, statistics, sys
rows = [r for r in json.load(open(sys.argv[1])) if r["result"]]
for kind in ("divergent", "crash", "hang"):
    k = [r for r in rows if r["result"]["key"]["kind"] == kind]
    if not k:
        continue
    frac = [r["result"]["elements_after"] / r["original_elements"] for r in k]
    execs = [r["result"]["execs"] for r in k]
    secs = [r["result"]["seconds"] for r in k]
    print(f"{kind:<10} {len(k):>4} findings  execs median {statistics.median(execs)} max {max(execs)}  "
          f"seconds median {statistics.median(secs):.2f} max {max(secs):.2f}  "
          f"elements after/original median {statistics.median(frac):.1%}, <= 1/4 for {sum(f <= 0.25 for f in frac)}")
PY
