"""Failed ranks to a verdict: `harness_error`, `rejected` or `crash`, by where each failure was raised
(validation.py holds the table of every target's validation locations).

A harness error on any rank wins: our worker failed, and what the framework did after that says nothing.
Every rank must have refused for a rejection, since a refusal on some ranks only leaves the others stranded
in a collective (a crash of the framework, not a clean rejection) — except across pipeline stages, which run different
layers: a refusal raised only by the stages that hold what it refuses (a layer tensor parallelism cannot split, the
sequence split on the first stage), the other stages left waiting for them, is a rejection. A crash is reported on the first rank whose
error is its own crash: not a peer's closed or reset connection (what the ranks that outlived the failing one
see), nor a refusal where another rank crashed.
"""

#: What gloo raises on a rank whose peer died: never the cause of a crash.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")

import os

from .validation import causes, classify, is_native_caller, recomputing, short


def classify_failures(target, failed, world, stages=1):
    """The verdict of a run whose ranks `failed` ([(rank, failure)]) of `world`; `stages`: its pipeline stages."""
    real = [f for f in failed if f[1]["type"] != "Stranded"] or failed
    keep_tracebacks(real)
    verdicts = [(rank, f, *classify(target.name, f)) for rank, f in real]
    for rank, f, kind, frame in verdicts:
        if kind == "harness_error":
            return harness_error(f, frame)
    # Where ranks disagree, the crash is told on the first rank whose own failure is one (not a refusal, which
    # would name the case after a check the framework passed on another rank).
    crashed = [(r, f) for r, f, kind, _ in verdicts if kind == "crash" and not peer_gone(f)]
    first_rank, first = crashed[0] if crashed else next(((r, f) for r, f in real if not peer_gone(f)), real[0])
    message = failure_message(first)
    if len(failed) == world and len(real) == len(failed) and all(v[2] == "rejected" for v in verdicts):
        return {"status": "rejected", "reason": message}
    if len(failed) == world and stages > 1 and refused_by_some_stages(verdicts):
        refusing = [r for r, _, kind, _ in verdicts if kind == "rejected"]
        return {"status": "rejected", "reason": f"{message} (raised on rank(s) {', '.join(map(str, refusing))}; the "
                                                f"other pipeline stages were left waiting for them)"}
    site = innermost_site(first)
    frame = next(v[3] for v in verdicts if v[0] == first_rank)
    where = "raised in the framework's native code, called at" if frame and is_native_caller(frame) else "at"
    if frame and is_recompute(frame) and frame[0] not in site:
        # Raised in our model's code as the checkpoint recomputed it: the checkpoint's frame is the crash site.
        where, site = "in the model code recomputed by", f'File "{frame[0]}", line {frame[1]}, in {frame[2]}'
    reason = message if not site else f"{message} ({where} {site})"
    return {"status": "crash", "rank": first_rank, "reason": reason}


def refused_by_some_stages(verdicts):
    """Whether some ranks refused and every other rank only waited on them (left stranded, or its peer's connection
    gone): a refusal of a pipeline stage's own layers."""
    refused = [v for v in verdicts if v[2] == "rejected"]
    return bool(refused) and all(v[2] == "rejected" or peer_gone(v[1]) for v in verdicts)


def keep_tracebacks(failed):
    """Appends the failed ranks' tracebacks to the file SHARDFUZZ_TRACEBACKS names, if set: the whole story of a
    crash, for whoever turns it into a bug report (the verdict keeps its innermost frame only)."""
    path = os.environ.get("SHARDFUZZ_TRACEBACKS")
    if path:
        with open(path, "a") as out:
            out.writelines(f"--- rank {rank}\n{f.get('traceback', '')}\n" for rank, f in failed)


def failure_message(f):
    """`Type: message` of the error that happened. A framework that wraps an error (`raise RuntimeError(
    "[Stage 0] failed to run forward ...") from e`, torch.distributed.pipelining) would otherwise give every
    failure under it one message: the innermost cause is told first, the wrapper's first line after it."""
    outer = f"{f['type']}: {f['message']}".strip()
    chain = causes(f)
    if len(chain) < 2:
        return outer
    inner = chain[-1]
    told = f"{inner['type']}: {inner['message']}".strip()
    wrapper = next((line.strip() for line in f["message"].splitlines() if line.strip()), "")
    if wrapper and wrapper in inner["message"]:
        return told  # (re-raised with the same words: DTensor's dispatcher)
    return told + f" (wrapped as {f['type']}: {wrapper})"


def innermost_site(f):
    """`File "...", line N, in f` where the innermost cause was raised (the traceback's last frame when
    nothing is chained)."""
    chain = causes(f)
    if len(chain) >= 2 and chain[-1]["frames"]:
        path, line, function = chain[-1]["frames"][-1]
        return f'File "{path}", line {line}, in {function}'
    return last_frame(f.get("traceback", ""))


def peer_gone(f):
    return "gloo/transport" in f.get("message", "") and any(m in f["message"] for m in PEER_GONE)


def harness_error(f, frame):
    at = f" (at {short(frame)})" if frame else ""
    return {"status": "harness_error", "reason": f"{f['type']}: {f['message']}{at}".strip()}


def last_frame(tb):
    lines = [l.strip() for l in tb.splitlines() if l.strip().startswith("File ")]
    return lines[-1] if lines else ""


def is_recompute(frame):
    return recomputing([frame]) is not None
