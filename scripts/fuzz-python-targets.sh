#!/usr/bin/env bash
# Fuzzes each Python framework target for $SECONDS_PER_TARGET (default 60 s) from the seed corpus and
# fails on a false positive: any divergent finding, any hang (every one seen so far was a harness
# mistake: ranks running different numbers of collectives), or a crash whose site lies in our own
# worker code. Crashes raised inside the frameworks are real findings: they are listed, with their
# verdicts, in target/fuzz-python/<target>/findings/. SEED picks the campaign seed (default 1).
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
  .venv/bin/python - "$out" "$t" <<'PY' || status=1
import json, pathlib, sys
out, target = pathlib.Path(sys.argv[1]), sys.argv[2]
bad = []
for v in sorted(out.glob("findings/*/verdict.json")):
    f = json.loads(v.read_text())
    verdict = f.get("verdict", f)
    kind, reason = verdict["kind"], verdict["reason"]
    harness = kind == "crash" and ("shardfuzz_worker" in reason or reason.startswith("worker:"))
    tag = "FALSE POSITIVE" if kind in ("divergent", "hang") or harness else "finding"
    print(f"  {tag}: {v.parent.name} {kind}: {reason.splitlines()[0][:200]}")
    if tag != "finding":
        bad.append(v.parent.name)
sys.exit(1 if bad else 0)
PY
done
exit $status
