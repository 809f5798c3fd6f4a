"""A case run in the worker's own process (library ops: torch's simulated ranks, JAX's host devices) that does
not finish within its timeout is interrupted here, and reported as a hang at the frame it was interrupted in.

Without it the fuzzer could only kill the worker once the case's timeout and a grace had passed, and start a
new one (torch and OpInfo imported again): a DTensor view rule that loops forever on a zero-size tensor cost a
campaign 20 s and a restart per hit. SIGALRM interrupts Python code between bytecodes (a loop in a sharding
rule); a wait inside C++ is not interrupted, and the fuzzer's own deadline still ends it.
"""

import os
import signal
import traceback

from .pool import where_in


_HERE = os.path.abspath(__file__)


class CaseTimedOut(BaseException):
    """Raised by the alarm (a BaseException, so that the op's own `except Exception` does not swallow it)."""


def _alarm(signum, frame):
    raise CaseTimedOut()


def run_with_alarm(fn, seconds):
    """fn() with SIGALRM armed for `seconds` (main thread only; elsewhere, or without SIGALRM, fn() as is)."""
    if not hasattr(signal, "setitimer") or seconds <= 0:
        return fn()
    try:
        previous = signal.signal(signal.SIGALRM, _alarm)
    except ValueError:  # not the main thread
        return fn()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def where_interrupted(e):
    """'rank 0 waits at FRAME[, entered from OURS via CALL]': the innermost frame the alarm interrupted and,
    when that lies in a framework, the last frame of ours and the framework call it made (as pool.stuck_at
    says it for a rank of a pool)."""
    tb = [f for f in reversed(traceback.extract_tb(e.__traceback__)) if os.path.abspath(f.filename) != _HERE]
    frames = [f"File \"{f.filename}\", line {f.lineno} in {f.name}" for f in tb]
    return f"rank 0 waits at {where_in(frames) if frames else 'an unknown place'}"
