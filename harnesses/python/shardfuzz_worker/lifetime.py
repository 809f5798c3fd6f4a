"""Processes started here die with their parent (Linux PR_SET_PDEATHSIG)."""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent():
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    # The parent may already be gone between fork and prctl.
    if os.getppid() == 1:
        os._exit(1)


def watch_parent(interval_s=0.5):
    """Exits when the parent process goes away. Used by the worker itself, whose parent (the fuzzer)
    may have started it from a thread that ends before the process does, which PR_SET_PDEATHSIG
    would take for the parent's death."""
    import threading
    import time

    parent = os.getppid()

    def watch():
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="watch-parent").start()
