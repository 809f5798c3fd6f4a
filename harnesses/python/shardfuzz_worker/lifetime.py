"""Processes started here die with their parent (Linux PR_SET_PDEATHSIG), and what a killed one leaves behind goes
with the next."""

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


def orphan_dir_prefix(prefix):
    """A scratch directory name prefix naming this process: `prefix-<pid>-`."""
    return f"{prefix}-{os.getpid()}-"


def remove_orphan_dirs(where, prefix, mine=False):
    """Directories in `where` named `prefix-<pid>-…` (orphan_dir_prefix) whose process no longer runs (with `mine`,
    this process's too): what a killed or failed run left."""
    import shutil

    for name in os.listdir(where):
        pid = name[len(prefix) + 1:].split("-", 1)[0]
        if not (name.startswith(prefix + "-") and pid.isdigit()):
            continue
        if (mine and int(pid) == os.getpid()) or not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(where, name), ignore_errors=True)
