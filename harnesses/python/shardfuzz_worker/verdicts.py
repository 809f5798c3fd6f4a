"""Failed ranks to a verdict: the framework's own validation error is `rejected`, anything else a `crash`.

A target names the exception types (and message fragments) its framework raises when it refuses a
configuration up front; every rank must have refused for a rejection, since a refusal on some ranks
only leaves the others stranded in a collective (a crash of the framework, not a clean rejection).
"""


def classify_failures(target, failed, world):
    real = [f for f in failed if f[1]["type"] != "Stranded"] or failed
    first_rank, first = real[0]
    message = f"{first['type']}: {first['message']}".strip()
    everyone = len(failed) == world
    if everyone and all(target.is_rejection(f["type"], f["module"], f["message"], f["traceback"]) for _, f in failed):
        return {"status": "rejected", "reason": message}
    site = last_frame(first.get("traceback", ""))
    reason = message if not site else f"{message} (at {site})"
    return {"status": "crash", "rank": first_rank, "reason": reason}


def last_frame(tb):
    lines = [l.strip() for l in tb.splitlines() if l.strip().startswith("File ")]
    return lines[-1] if lines else ""
