"""A case run in the worker's own process (library ops: torch's simulated ranks, JAX's host devices) that does
not finish within its timeout is interrupted here, and reported as a hang at the frame it was interrupted in.

Without it the fuzzer could only kill the worker once the case's timeout and a grace had passed, and start a
new one (torch and OpInfo imported again): a DTensor view rule that loops forever on a zero-size tensor cost a
campaign 20 s and a restart per hit. SIGALRM interrupts Python code between bytecodes (a loop in a sharding
rule); a wait inside C++ is not interrupted, and the fuzzer's own deadline still ends it.

A hang the worker has waited out once is known by its site (our frame and the framework call it made, line
numbers dropped). A later case still at a known site at two probes half a second apart, from PROBE_AFTER_S
on, is cut there: mutants of one corpus entry reach the same framework loop again and again, and each full
wait cost a campaign the whole timeout for a finding it already has.
"""

import os
import re
import signal
import time
import traceback

from .pool import where_in


_HERE = os.path.abspath(__file__)

#: When probing for a known hang starts. 400 in-process campaign cases took 46 ms on average, 390 ms at the
#: 99th percentile and 3.4 s at most (a worker's first case, which no known site can precede): 2 s is five
#: times the 99th percentile, and a cut needs a second probe at the same site half a second later.
PROBE_AFTER_S = 2.0
PROBE_EVERY_S = 0.5

#: Sites of the hangs this worker waited out in full, oldest first (at most MAX_KNOWN).
_known_sites = []
MAX_KNOWN = 32


class CaseTimedOut(BaseException):
    """Raised by the alarm (a BaseException, so that the op's own `except Exception` does not swallow it).
    `cut_after` is the time at which a case at a known hang's site was cut, None after the full timeout."""

    def __init__(self, cut_after=None):
        super().__init__()
        self.cut_after = cut_after


def site_of(where):
    """The stable part of a `where_in` answer: our frame and the framework call it made, line numbers
    dropped (the innermost frame of a loop differs from one interrupt to the next); the innermost frame
    alone when the stack has no frame of ours."""
    entered = where.split(", entered from ", 1)
    return re.sub(r":\d+ in ", " in ", entered[1] if len(entered) == 2 else entered[0])


def _where_frame(frame):
    stack = [f for f in reversed(traceback.extract_stack(frame)) if os.path.abspath(f.filename) != _HERE]
    frames = [f"File \"{f.filename}\", line {f.lineno} in {f.name}" for f in stack]
    return where_in(frames) if frames else "an unknown place"


def _prober(seconds):
    start = time.monotonic()
    last = [None]

    def alarm(signum, frame):
        elapsed = time.monotonic() - start
        if elapsed >= seconds - 1e-3:
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise CaseTimedOut()
        site = site_of(_where_frame(frame))
        if site in _known_sites and last[0] == site:
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise CaseTimedOut(cut_after=elapsed)
        last[0] = site

    return alarm


def run_with_alarm(fn, seconds, cut_known=True):
    """fn() with SIGALRM armed for `seconds` (main thread only; elsewhere, or without SIGALRM, fn() as is),
    probing for known hangs when this worker has waited one out (unless `cut_known` is False: a hang
    given more time to tell a slow case from a hung one)."""
    if not hasattr(signal, "setitimer") or seconds <= 0:
        return fn()
    probing = cut_known and bool(_known_sites) and PROBE_AFTER_S < seconds
    try:
        previous = signal.signal(signal.SIGALRM, _prober(seconds))
    except ValueError:  # not the main thread
        return fn()
    if probing:
        signal.setitimer(signal.ITIMER_REAL, PROBE_AFTER_S, PROBE_EVERY_S)
    else:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    except CaseTimedOut as e:
        if e.cut_after is None:
            _remember(site_of(_where_traceback(e)))
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _remember(site):
    if site not in _known_sites:
        _known_sites.append(site)
        del _known_sites[:-MAX_KNOWN]
    _last_learned[:] = [site]


#: The site the last full wait taught, until a patient rerun of that case shows it was only slow.
_last_learned = []


def forget_last_learned():
    """A case given more time finished: the site its earlier full wait taught was a slow case's, not a
    hang's (the fuzzer reruns a hang patiently right after it), and no later case is cut there."""
    for site in _last_learned:
        if site in _known_sites:
            _known_sites.remove(site)
    _last_learned.clear()


def _where_traceback(e):
    tb = [f for f in reversed(traceback.extract_tb(e.__traceback__)) if os.path.abspath(f.filename) != _HERE]
    frames = [f"File \"{f.filename}\", line {f.lineno} in {f.name}" for f in tb]
    return where_in(frames) if frames else "an unknown place"


def where_interrupted(e):
    """'rank 0 waits at FRAME[, entered from OURS via CALL]': the innermost frame the alarm interrupted and,
    when that lies in a framework, the last frame of ours and the framework call it made (as pool.stuck_at
    says it for a rank of a pool)."""
    return f"rank 0 waits at {_where_traceback(e)}"


def hang_reason(e, timeout):
    """The worker's report of an interrupted case: waited out in full, or cut at a known hang's site."""
    where = where_interrupted(e)
    if e.cut_after is None:
        return f"the case did not finish within {timeout:.1f} s in the worker; {where}"
    return (f"the case was still at the site of a hang this worker waited out before after {e.cut_after:.1f} s "
            f"(timeout {timeout:.1f} s), and was cut there; {where}")
