"""The test suite's verdict on a short campaign of a Python target (scripts/fuzz-python-targets.sh): which
findings are the framework's and which would be false positives, ours.

    python -m shardfuzz_worker.ci_findings CAMPAIGN_DIR TARGET      (exit 1 on a false positive)

Rules (the script's header says why):
- a harness error (out/harness-errors/) fails;
- a crash whose site lies in our worker code is ours;
- a hang is the framework's only when every stuck rank waits inside the framework, entered through a
  framework API other than a bare collective;
- a divergence of a library-op case is the framework's when it is confirmed on real process-group ranks
  (torch-dtensor) and diverges in float64 too, or in float32 and bfloat16 alike with the same error
  (`scale_free`); a few low-precision findings are listed with their scripts (`LOW_PRECISION_FINDINGS`);
- a divergence of a model case is a known finding when a known fix makes it pass (known_fixes.py).
"""

import json
import os
import pathlib
import re
import subprocess
import sys

from .known_fixes import ENV as FIXES_ENV
from .known_fixes import FIXES

BARE_COLLECTIVES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py", "deepspeed/comm/")

#: Round-off scales with the unit round-off (float32's and bfloat16's are 2^16 apart); a divergence whose
#: error moves by less than this factor between them is not round-off.
SCALE_FREE_FACTOR = 4.0


def bin_path():
    return os.environ.get("SHARDFUZZ_BIN", "target/release/shardfuzz")


# ---------------------------------------------------------------------------------------- hangs


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


# ---------------------------------------------------------------------------------------- library-op divergences


def verdict_in(finding_dir, target, dtype):
    """The verdict of the finding's case run again in `dtype` (None when the run printed none)."""
    case = json.loads((finding_dir / "case.json").read_text())
    case["train"]["dtype"] = dtype
    path = finding_dir / f"case-{dtype}.json"
    path.write_text(json.dumps(case))
    run = subprocess.run([bin_path(), "run", str(path), "--target", target, "--json"], capture_output=True, text=True)
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
    """The error of statistic `where[1]` on tensor `where[0]` in `verdict` (None when it has no such check)."""
    for c in verdict.get("checks", []):
        if c["tensor"] == where[0]:
            if where[1] == "max" or not c.get("stats"):
                return c.get("error")
            return next((s["error"] for s in c["stats"] if s["stat"] == where[1]), None)
    return None


def scale_free(verdict, f32, bf16):
    """Divergent in float32 and in bfloat16 with the same error (within SCALE_FREE_FACTOR) on the tensor and
    statistic that decided `verdict`: an error that does not scale with the unit round-off is not round-off."""
    where = decided(verdict)
    if where is None or any(v is None or v.get("kind") != "divergent" for v in (f32, bf16)):
        return False
    errors = [stat_error(v, where) for v in (f32, bf16)]
    if any(e is None or not e > 0 for e in errors):
        return False
    return max(errors) <= SCALE_FREE_FACTOR * min(errors)


def library_op_divergence_is_real(finding_dir, verdict, target):
    """Confirmed on real ranks, and divergent in float64 as well, or in float32 and bfloat16 alike."""
    notes = verdict.get("notes", [])
    # torch-dtensor simulates its ranks in one process and confirms on real ones; JAX's host devices are real.
    # A case the simulation could not run (it crashed there) ran on real ranks directly: its verdict is theirs.
    confirmed = any("on real process-group ranks: divergent" in n for n in notes)
    ran_there = any(n.startswith("ran on real process-group ranks") for n in notes)
    if target == "torch-dtensor" and not (confirmed or ran_there):
        return False
    f64 = verdict_in(finding_dir, target, "f64")
    if f64 is not None and f64.get("kind") == "divergent":
        return True
    return scale_free(verdict, verdict_in(finding_dir, target, "f32"), verdict_in(finding_dir, target, "bf16"))


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


def known_low_precision(finding_dir, verdict, target):
    case = json.loads((finding_dir / "case.json").read_text())
    entry = LOW_PRECISION_FINDINGS.get((target, (case.get("library_op") or {}).get("name")))
    return entry[0] if entry and entry[1](case, verdict) else None


# ---------------------------------------------------------------------------------------- model divergences


def passes(case_file, target, fixes):
    env = dict(os.environ, **{FIXES_ENV: ",".join(fixes)})
    run = subprocess.run([bin_path(), "run", str(case_file), "--target", target, "--json"],
                         capture_output=True, text=True, env=env)
    kinds = [json.loads(line).get("kind") for line in run.stdout.splitlines() if line.startswith("{")]
    return kinds == ["pass"]


#: The fix sets that explained an earlier finding of this process, tried first for the next one: one campaign's
#: findings often share a cause, and each try is a `shardfuzz run` of its own (seconds).
_EXPLAINED = []


def narrowed(case_file, target, fixes):
    """A smaller set of `fixes` (which make the case pass) that still does: halves while one half alone does,
    so one culprit among n fixes costs about 2·log2(n) runs instead of up to n."""
    while len(fixes) > 1:
        half = len(fixes) // 2
        for part in (fixes[:half], fixes[half:]):
            if passes(case_file, target, part):
                fixes = part
                break
        else:
            return fixes  # only fixes from both halves together explain it
    return fixes


def known_fix(finding_dir, target):
    """The known fix(es) under which the finding's case passes, or None. Every fix of the target applied at
    once is tried first (after the sets that explained earlier findings), then narrowed; where that fails, each
    fix alone (fixes of different bugs could meet in one case)."""
    case = finding_dir / "case.json"
    mine = sorted(n for n, (targets, _) in FIXES.items() if target in targets)
    if not mine:
        return None
    found = next((c for c in _EXPLAINED if set(c) <= set(mine) and passes(case, target, c)), None)
    if found is None and passes(case, target, mine):
        found = narrowed(case, target, mine)
    if found is None and len(mine) > 1:
        found = next(([n] for n in mine if passes(case, target, [n])), None)
    if found is None:
        return None
    if found not in _EXPLAINED:
        _EXPLAINED.append(found)
    return "+".join(found)


# ---------------------------------------------------------------------------------------- the verdict


def crash_site(reason):
    """Where a crash happened, as far as its reason tells: JAX appends the user frames that traced a failing
    op ("Suspected Python Code Location:") to XLA's compiler errors, and MLIR diagnostics are located at the
    traced source line ("file.py:382:29: error: 'func.call' op ..." from the Shardy partitioner): where the op
    was called, not where it failed. A framework object failing in the framework's own native code, under a
    call of ours that only hands it over (validation.NATIVE_CALLERS: a view of an op's output), names our
    line; the failure is not ours."""
    site = reason.split("Suspected Python Code Location:", 1)[0]
    # Dynamo's errors quote the traced frames ("from user code:", the model's lines: ours) of an op that failed in
    # the framework; the frame that raised stays in the reason's "(at ...)".
    site = re.sub(r"from user code:.*?(?=\(at File |$)", "", site, flags=re.S)
    site = re.sub(r"\S+\.py:\d+:\d+: (error|warning|note):", "traced op:", site)
    return re.sub(r"\(raised in the framework's native code, called at [^\n]*", "", site)


def classify(finding_dir, target):
    """(tag, ours) for one finding: ours is True for a false positive."""
    f = json.loads((finding_dir / "verdict.json").read_text())
    verdict = f.get("verdict", f)
    kind, reason = verdict["kind"], verdict["reason"]
    harness = kind == "crash" and ("shardfuzz_worker" in crash_site(reason) or reason.startswith("worker:"))
    library_op = "|lib-" in f.get("signature", "")
    real_divergence = kind == "divergent" and library_op and library_op_divergence_is_real(finding_dir, verdict, target)
    if library_op:
        known = kind == "divergent" and not real_divergence and known_low_precision(finding_dir, verdict, target)
    else:
        known = kind == "divergent" and known_fix(finding_dir, target)
    hang_ours = kind == "hang" and not any(framework_hang(r) for r in real_rank_hangs(verdict))
    ours = (kind == "divergent" and not real_divergence and not known) or harness or hang_ours
    tag = "FALSE POSITIVE" if ours else f"known finding ({known})" if known else "finding"
    return tag, ours


def main(argv):
    out, target = pathlib.Path(argv[0]), argv[1]
    bad = []
    for v in sorted(out.glob("harness-errors/*/verdict.json")):
        print(f"  HARNESS ERROR: {v.parent.name}: {json.loads(v.read_text())['reason'][:500]}")
        bad.append(v.parent.name)
    for v in sorted(out.glob("findings/*/verdict.json")):
        f = json.loads(v.read_text())
        verdict = f.get("verdict", f)
        tag, ours = classify(v.parent, target)
        print(f"  {tag}: {v.parent.name} {verdict['kind']}: {verdict['reason'].splitlines()[0][:500]}")
        if ours:
            bad.append(v.parent.name)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
