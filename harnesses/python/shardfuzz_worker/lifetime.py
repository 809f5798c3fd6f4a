"""Processes started here die with their parent (Linux PR_SET_PDEATHSIG), and what a killed one leaves behind goes
with the next; their address space is capped (`cap_memory`) so that one call asking for more memory than the
machine has fails in that call instead of taking the machine down."""

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


#: Floor of the per-process address-space cap, and the variable that sets it (bytes; 0: no cap).
MEMORY_FLOOR = 16 << 30
MEMORY_ENV = "SHARDFUZZ_WORKER_MEMORY"


def memory_cap():
    """The address-space cap of a worker and its ranks: $SHARDFUZZ_WORKER_MEMORY, else half the machine's memory but
    at least 16 GiB. Measured here (2026-12-02): a torch worker's address space is 3.6 GB at rest, a JAX one's 1.7 GB,
    Colossal-AI's 3.3 GB; a case's tensors add megabytes. An edit can still ask for far more: `combinations` with r
    raised from 2 to 34 allocates 2^34 bytes at once, which Linux grants and then kills the machine's largest
    process for as the pages fill (24 GB, 40 s)."""
    given = os.environ.get(MEMORY_ENV)
    if given is not None:
        return int(given)
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return MEMORY_FLOOR
    return max(MEMORY_FLOOR, physical // 2)


def cap_memory():
    """RLIMIT_AS lowered to `memory_cap()` for this process and what it forks (never raised): an allocation past it
    fails where it is made (torch: "DefaultCPUAllocator: can't allocate memory"), a verdict like any other."""
    import resource

    cap = memory_cap()
    if cap <= 0:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft == resource.RLIM_INFINITY or soft > cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


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
