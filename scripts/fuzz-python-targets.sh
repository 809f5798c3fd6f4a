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
  SHARDFUZZ_BIN=$bin .venv/bin/python - "$out" "$t" <<'PY' || status=1
import json, pathlib, re, sys
out, target = pathlib.Path(sys.argv[1]), sys.argv[2]
BARE_COLLECTIVES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py", "deepspeed/comm/")


def real_rank_hangs(verdict):
    """The hang reasons a verdict carries: its own, and what its confirmation gave (real process-group
    ranks, or the worker given more time)."""
    reasons = [verdict["reason"]]
    for note in verdict.get("notes", []):
        m = re.search(r"(?:on real process-group ranks|given \d+ times the timeout in the worker): hang — (.*)", note)
        if m:
            reasons.append(m.group(1))
    return reasons


def framework_hang(reason):
    waits = re.findall(r"rank \d+ waits at ([^;]*)", reason)
    def theirs(w):
        via = w.split(" via ", 1)[1] if " via " in w else ""
        return not w.startswith(("shardfuzz_worker/", "an unknown place")) and not via.startswith(BARE_COLLECTIVES)
    return bool(waits) and all(theirs(w) for w in waits)


bad = []
for v in sorted(out.glob("harness-errors/*/verdict.json")):
    print(f"  HARNESS ERROR: {v.parent.name}: {json.loads(v.read_text())['reason'][:500]}")
    bad.append(v.parent.name)
def library_op_divergence_is_real(finding_dir, verdict):
    """Confirmed on real ranks, and divergent in float64 as well."""
    notes = verdict.get("notes", [])
    # torch-dtensor simulates its ranks in one process and confirms on real ones; JAX's host devices are real.
    # A case the simulation could not run (it crashed there) ran on real ranks directly: its verdict is theirs.
    confirmed = any("on real process-group ranks: divergent" in n for n in notes)
    ran_there = any(n.startswith("ran on real process-group ranks") for n in notes)
    if target == "torch-dtensor" and not (confirmed or ran_there):
        return False
    rerun = lambda dtype: verdict_in(finding_dir, dtype)
    f64 = rerun("f64")
    if f64 is not None and f64.get("kind") == "divergent":
        return True
    return scale_free(verdict, rerun("f32"), rerun("bf16"))


def verdict_in(finding_dir, dtype):
    """The verdict of the finding's case run again in `dtype` (None when the run printed none)."""
    import subprocess
    case = json.loads((finding_dir / "case.json").read_text())
    case["train"]["dtype"] = dtype
    path = finding_dir / f"case-{dtype}.json"
    path.write_text(json.dumps(case))
    run = subprocess.run([BIN, "run", str(path), "--target", target, "--json"], capture_output=True, text=True)
    for line in run.stdout.splitlines():
        try:
            v = json.loads(line)
        except ValueError:
            continue
        return v.get("verdict", v)
    return None


def decided(verdict):
    """(tensor, statistic) that made the verdict divergent: its first failing check."""
    for c in verdict.get("checks", []):
        if not c.get("pass", True):
            return c["tensor"], c.get("decided_by", "max")
    return None


def stat_error(verdict, where):
    for c in verdict.get("checks", []):
        if c["tensor"] == where[0]:
            if where[1] == "max" or not c.get("stats"):
                return c.get("error")
            return next((s["error"] for s in c["stats"] if s["stat"] == where[1]), None)
    return None


def scale_free(verdict, f32, bf16):
    """Divergent in float32 and in bfloat16 with the same error (within 4x) on the tensor and statistic
    that decided the finding: an error that does not scale with the unit round-off is not round-off."""
    where = decided(verdict)
    if where is None or any(v is None or v.get("kind") != "divergent" for v in (f32, bf16)):
        return False
    errors = [stat_error(v, where) for v in (f32, bf16)]
    if any(e is None or not e > 0 for e in errors):
        return False
    return max(errors) <= 4 * min(errors)


BIN = __import__("os").environ.get("SHARDFUZZ_BIN", "target/release/shardfuzz")
sys.path.insert(0, "harnesses/python")
from shardfuzz_worker.known_fixes import ENV as FIXES_ENV, FIXES


# Library-op findings that show in low precision only, each confirmed with a standalone script in
# docs/findings/ and listed in the README (the float64 rule above cannot confirm them): (target, op) →
# (script, what the finding shows).
LOW_PRECISION_FINDINGS = {
    ("torch-dtensor", "dist"): (
        "torch-2.15-dtensor-dist-p4-f16-nan.py",
        lambda case, v: case["train"]["dtype"] == "f16"
        and any(c["tensor"].startswith("out/") and c["error"] is None for c in v.get("checks", [])),
    ),
}
def known_low_precision(finding_dir, verdict):
    case = json.loads((finding_dir / "case.json").read_text())
    entry = LOW_PRECISION_FINDINGS.get((target, (case.get("library_op") or {}).get("name")))
    return entry[0] if entry and entry[1](case, verdict) else None
def passes(case_file, fixes):
    import os, subprocess
    env = dict(os.environ, **{FIXES_ENV: ",".join(fixes)})
    run = subprocess.run([BIN, "run", str(case_file), "--target", target, "--json"], capture_output=True, text=True, env=env)
    kinds = [json.loads(l).get("kind") for l in run.stdout.splitlines() if l.startswith("{")]
    return kinds == ["pass"]


def known_fix(finding_dir):
    """The known fix(es) under which the finding's case passes, or None."""
    mine = sorted(n for n, (targets, _) in FIXES.items() if target in targets)
    for fixes in [[n] for n in mine] + ([mine] if len(mine) > 1 else []):
        if passes(finding_dir / "case.json", fixes):
            return "+".join(fixes)
    return None
for v in sorted(out.glob("findings/*/verdict.json")):
    f = json.loads(v.read_text())
    verdict = f.get("verdict", f)
    kind, reason = verdict["kind"], verdict["reason"]
    # JAX appends the user frames that traced a failing op ("Suspected Python Code Location:") to XLA's
    # compiler errors, and MLIR diagnostics are located at the traced source line ("file.py:382:29:
    # error: 'func.call' op ..." from the Shardy partitioner): where the op was called, not where it
    # failed.
    site = reason.split("Suspected Python Code Location:", 1)[0]
    site = re.sub(r"\S+\.py:\d+:\d+: (error|warning|note):", "traced op:", site)
    # A framework object failing in the framework's own native code, under a call of ours that only hands
    # it over (validation.NATIVE_CALLERS: a view of an op's output), names our line; the failure is not ours.
    site = re.sub(r"\(raised in the framework's native code, called at [^\n]*", "", site)
    harness = kind == "crash" and ("shardfuzz_worker" in site or reason.startswith("worker:"))
    library_op = "|lib-" in f.get("signature", "")
    real_divergence = kind == "divergent" and library_op and library_op_divergence_is_real(v.parent, verdict)
    if library_op:
        known = kind == "divergent" and not real_divergence and known_low_precision(v.parent, verdict)
    else:
        known = kind == "divergent" and known_fix(v.parent)
    ours = (kind == "divergent" and not real_divergence and not known) or harness or (kind == "hang" and not any(framework_hang(r) for r in real_rank_hangs(verdict)))
    tag = "FALSE POSITIVE" if ours else f"known finding ({known})" if known else "finding"
    print(f"  {tag}: {v.parent.name} {kind}: {reason.splitlines()[0][:500]}")
    if ours:
        bad.append(v.parent.name)
sys.exit(1 if bad else 0)
PY
done
exit $status
