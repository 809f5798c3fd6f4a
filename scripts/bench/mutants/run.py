"""Framework mutants: does a short campaign find a realistic one-edit bug planted in a framework's sharding code?

For each mutant of mutant_table.py (or those named): a campaign on the mutant's target with the mutant loaded in
every worker and rank process (harnesses/python/tests/faults on PYTHONPATH, SHARDFUZZ_MUTANT set: hook.py), then every
finding of that campaign run again without the mutant and, when that verdict differs, once more with it. A finding
is *caused* by the mutant when the unmutated build gives another verdict (a pass, or another kind) in two runs
and the mutated build gives its kind again; the mutant is *detected* when some finding is caused. A control campaign per target
(no mutant, same seed and time) lists what the unmutated frameworks give anyway.

Writes OUT/<name>/ (the campaigns), OUT/mutants.json and OUT/mutants.csv, and prints one line per mutant:
the first caused finding's campaign time, whether a seed case (`corpus/`) or a case the fuzzer made found it
first, and its reason. Run from the repository root with the worker's Python (`scripts/bench/mutants.sh`).
"""

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The test-fault hook installs a mutant named by SHARDFUZZ_MUTANT (hook.py of this folder).
HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "harnesses", "python", "tests", "faults")
sys.path.insert(0, HERE)

from mutant_table import MUTANTS  # noqa: E402

BIN = "target/release/shardfuzz"
OURS = ("PYTHONPATH", "SHARDFUZZ_MUTANT", "SHARDFUZZ_MUTANT_TRACE", "SHARDFUZZ_TEST_FAULT")


def environment(mutant=None):
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    if mutant:
        env.update(PYTHONPATH=HOOK, SHARDFUZZ_MUTANT=mutant)
    return env


def campaign(target, out, seed, budget, mutant=None):
    """A fresh campaign in `out` (an earlier run's directory there would be resumed, its findings kept)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [BIN, "fuzz", "--target", target, "--corpus", "corpus", "--out", out, "--time", budget, "--seed", str(seed), "--quiet"]
    subprocess.run(cmd, env=environment(mutant), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def verdicts(cases, target, mutant=None):
    """{case path: verdict} of one `shardfuzz run` over all the cases (one worker for them all)."""
    if not cases:
        return {}
    run = subprocess.run([BIN, "run", *cases, "--target", target, "--json"], env=environment(mutant),
                         capture_output=True, text=True, check=False)
    lines = (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))
    return {v["case"]: v for v in lines if "case" in v}


def findings(out):
    """[(first seen s, case path, verdict)] of a campaign, earliest first."""
    root = os.path.join(out, "findings")
    found = []
    for fid in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        with open(os.path.join(root, fid, "verdict.json")) as f:
            v = json.load(f)
        found.append((v.get("first_seen_elapsed_s", 0.0), os.path.join(root, fid, "case.json"), v.get("verdict", v)))
    return sorted(found, key=lambda x: x[0])


def seeds_loaded_at(out):
    """Campaign seconds at which the seed cases had all run (fuzz.log): findings up to then are the seeds'."""
    match = None
    with open(os.path.join(out, "fuzz.log")) as f:
        for line in f:
            match = re.search(r"seed cases loaded at ([0-9.]+) s", line) or match
    return float(match.group(1)) if match else 0.0


def judge(name, out, target):
    found = findings(out)
    differs = found
    # Twice without the mutant: a slow case on a busy machine can hang once and pass once.
    for _ in range(2):
        clean = verdicts([c for _, c, _ in differs], target)
        differs = [(t, c, v) for t, c, v in differs if clean.get(c, {}).get("kind") not in (None, v["kind"])]
    again = verdicts([c for _, c, _ in differs], target, name)
    caused = [(t, c, v) for t, c, v in differs if again.get(c, {}).get("kind") == v["kind"]]
    row = {"mutant": name, "target": target, "findings": len(found), "caused": len(caused), "detected": bool(caused)}
    if caused:
        t, c, v = caused[0]
        row.update(first_s=round(t, 1), first_by="seed" if t <= seeds_loaded_at(out) else "fuzzer",
                   kind=v["kind"], reason=v["reason"].splitlines()[0][:200], case=c)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mutants", nargs="*", help="mutant names (default: all of mutant_table.py)")
    ap.add_argument("--time", default="120s", help="campaign budget per mutant (default 120s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench-mutants")
    ap.add_argument("--no-controls", action="store_true", help="skip the unmutated control campaigns")
    ap.add_argument("--target", help="campaign on this target instead of each mutant's own (a mutant of code that "
                                     "another target also runs)")
    a = ap.parse_args()
    names = a.mutants or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        sys.exit(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(MUTANTS)}")
    os.makedirs(a.out, exist_ok=True)
    controls = {}
    target_of = {n: a.target or MUTANTS[n][0] for n in names}
    for target in [] if a.no_controls else sorted(set(target_of.values())):
        out = os.path.join(a.out, f"control-{target}")
        campaign(target, out, a.seed, a.time)
        controls[target] = len(findings(out))
        print(f"control {target}: {controls[target]} findings without a mutant", flush=True)
    rows = []
    for name in names:
        start = time.time()
        out = os.path.join(a.out, name)
        campaign(target_of[name], out, a.seed, a.time, name)
        row = judge(name, out, target_of[name])
        row["wall_s"] = round(time.time() - start, 1)
        rows.append(row)
        seen = f"after {row['first_s']} s ({row['first_by']}): {row['kind']}: {row['reason']}" if row["detected"] else "not detected"
        print(f"{name:32} {row['target']:15} {row['caused']}/{row['findings']} caused  {seen}", flush=True)
    with open(os.path.join(a.out, "mutants.json"), "w") as f:
        json.dump({"time": a.time, "seed": a.seed, "controls": controls, "rows": rows}, f, indent=1)
    with open(os.path.join(a.out, "mutants.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["mutant", "target", "detected", "caused", "findings", "first_s", "first_by", "kind", "reason"],
                           extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"detected {sum(r['detected'] for r in rows)} of {len(rows)} mutants; {a.out}/mutants.csv")


if __name__ == "__main__":
    main()
