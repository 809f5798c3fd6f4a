"""A persistent pool of rank processes joined by gloo on a loopback port.

Ranks are forked once per world size and reused for every case of that size; each runs the target's
`run_rank` for every job and reports its result (or its exception) over a pipe. A rank that dies or
does not answer in time gets the pool killed; the next case of that size forks a fresh one.

Each rank writes its stderr to a file of its own, emptied at every job, so that a rank killed by a
signal is reported with what it printed last (gloo's "enforce fail ... collective mismatch"), and a
rank that hangs is reported with its Python stack (faulthandler, on SIGUSR1) before it is killed.
"""

import faulthandler
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.connection import wait

from . import lifetime
from .lifetime import orphan_dir_prefix, remove_orphan_dirs
from .coverage import Coverage
from .validation import describe

#: How long peers of a failed rank get to finish before they count as stranded.
STRANDED_GRACE_S = 5.0
#: The same for a single op (a library-op case): peers do the same few milliseconds of work, so one
#: still busy a second after the failure (or twice the failing rank's own time) waits in a collective.
OP_STRANDED_GRACE_S = 1.0


class RankDied(Exception):
    def __init__(self, rank, message):
        super().__init__(message)
        self.rank = rank


class RanksFailedToStart(Exception):
    """Ranks whose start-up (`init_rank`: the process group, the requested known fixes) raised: `failed` holds
    (rank, failure) pairs as a job's failures are reported, to be judged by where they were raised."""

    def __init__(self, failed):
        super().__init__("; ".join(f"rank {r}: {f['type']}: {f['message']}" for r, f in failed))
        self.failed = failed


class RanksHung(Exception):
    def __init__(self, stuck, waited, where=()):
        detail = "".join(f"; rank {r} waits at {w}" for r, w in where)
        super().__init__(f"ranks {stuck} did not finish within {waited:.1f} s{detail}")
        self.stuck = stuck
        self.where = list(where)

    def in_our_frames(self):
        """Whether every stuck rank's innermost Python frame is ours, outside any framework call: native code
        running between our frames (a C++ destructor as a call's locals are released, the garbage collector),
        not a collective the framework or we issued."""
        return bool(self.where) and all(w.startswith("shardfuzz_worker/") and "entered from" not in w
                                        for _, w in self.where)


#: Starts of a rank pool tried when its rendezvous port was taken between being picked and bound.
START_ATTEMPTS = 3


def port_taken(message):
    """Whether a rank's failure says its rendezvous port was in use (torch's TCPStore: `EADDRINUSE`)."""
    return "EADDRINUSE" in message or "ddress already in use" in message


def free_loopback_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stderr_dir():
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) else tempfile.gettempdir()
    remove_orphan_dirs(where, "shardfuzz-ranks")  # a worker killed with its pools leaves theirs
    return tempfile.mkdtemp(prefix=orphan_dir_prefix("shardfuzz-ranks"), dir=where)


def _capture_stderr(path):
    """Points fd 2 at `path`; returns a function that empties it (called at every job)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    def reset():
        sys.stderr.flush()
        os.ftruncate(2, 0)
        os.lseek(2, 0, os.SEEK_SET)

    return reset


def read_tail(path, limit=8000):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def abort_message(text):
    """The line a C++ abort printed (`what(): ...`), or the last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("what():"):
            return ln[len("what():"):].strip()
    return lines[-1] if lines else ""


def _short(frame):
    """`File "/…/site-packages/torch/x.py", line 3 in f` -> `torch/x.py:3 in f`; our own files keep
    their `shardfuzz_worker/` prefix."""
    m = re.match(r'File "(.*)", line (\d+) in (.*)', frame)
    if not m:
        return frame
    path, line, func = m.groups()
    path = re.sub(r"^.*?/(site-packages|dist-packages)/", "", path)
    path = re.sub(r"^.*/(?=shardfuzz_worker/)", "", path)
    return f"{path}:{line} in {func}"


def stuck_at(dump):
    """Where a faulthandler dump says the rank's main thread waits: its innermost frame, and, when
    that lies in a framework, the last frame of ours and the framework call it made (so a collective
    our harness issued itself is told apart from one the framework issued)."""
    blocks = dump.split("\n\n")
    main = next((b for b in blocks if "_rank_main" in b), "")
    frames = [ln.strip() for ln in main.splitlines() if ln.strip().startswith("File ")]
    if not frames:
        return "an unknown place (no stack was dumped)"
    return where_in(frames)


def where_in(frames):
    """`FRAME[, entered from OURS via CALL]` of a stack as faulthandler prints it, innermost frame first:
    the innermost frame and, when that lies in a framework, the last frame of ours and the framework call
    it made."""
    while len(frames) > 1 and _passes_through(frames[0]):
        frames = frames[1:]  # (the framework's own call, re-dispatched by our mode: where it waits is that call)
    ours = next((i for i, f in enumerate(frames) if "shardfuzz_worker" in f), None)
    where = _short(frames[0])
    if ours is None or ours == 0:
        return where
    return f"{where}, entered from {_short(frames[ours])} via {_short(frames[ours - 1])}"


def _passes_through(frame):
    """Whether a faulthandler frame is one of our functions that only hand the framework's own call on to native
    code (validation.NATIVE_CALLERS: megatron_common's CUDA-on-CPU mode re-dispatching every torch call)."""
    from .validation import NATIVE_CALLERS

    short = _short(frame)
    return any(short.startswith(f"{path}:") and short.endswith(f" in {func}") for path, func in NATIVE_CALLERS)


def test_raise(hook):
    """The `worker-raises` test hook: our own worker code fails (a harness error, never a finding)."""
    if hook == "worker-raises":
        raise RuntimeError("the test hook raised in the worker")


#: What the abort test hooks print, as a C++ `std::terminate` does.
_TEST_ABORT = b"terminate called after throwing an instance of 'test::Abort'\n  what():  the test hook aborted this rank\n"


def _rank_main(rank, world, port, target, conn, init_timeout_s, stderr_path):
    lifetime.die_with_parent()
    reset_stderr = _capture_stderr(stderr_path)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        # DeepSpeed's launcher's name for it: its CPU accelerator counts devices from it (without it, releases
        # before 0.16 run `numactl --hardware`).
        LOCAL_SIZE=str(world),
        GLOO_SOCKET_IFNAME="lo",
    )
    try:
        target.init_rank(rank, world, init_timeout_s)
    except BaseException as e:  # noqa: BLE001 - reported as a job's failure is, then the rank exits
        conn.send({"ok": False, **describe(e)})
        os._exit(1)
    cov = Coverage(target.coverage_prefixes)
    conn.send({"ready": rank})
    while True:
        try:
            job = conn.recv()
        except EOFError:
            os._exit(0)
        if job is None:
            os._exit(0)
        reset_stderr()
        hook = job.get("test_hook")
        if hook == "kill-rank" and rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if hook in ("abort-rank", "abort-without-exit") and rank == world - 1:
            os.write(2, _TEST_ABORT)
            if hook == "abort-rank":
                os.abort()
            time.sleep(3600)
        if hook == "sleep" or (hook == "sleep-last-rank" and rank == world - 1):
            time.sleep(3600)
        try:
            test_raise(hook)
            out = target.run_rank(rank, world, job["case"], job["inputs"])
            conn.send({"ok": True, "out": out, "coverage": cov.take()})
        except BaseException as e:  # noqa: BLE001 - every failure is reported, none kills the rank
            conn.send({"ok": False, **describe(e), "coverage": cov.take()})


class RankPool:
    def __init__(self, target, world, init_timeout_s=120.0):
        self.world = world
        method = getattr(target, "start_method", "fork")
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(list(getattr(target, "preload", ())))
        # The port is free when picked and bound by rank 0's store a moment later: another process
        # (a second campaign, a test beside it) can take it in between. Rank 0 then fails at once
        # with EADDRINUSE, and the pool starts again on another port.
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start(ctx, target, free_loopback_port(), init_timeout_s)
                return
            except (RankDied, RanksFailedToStart) as e:
                if attempt == START_ATTEMPTS or not port_taken(str(e)):
                    raise

    def _start(self, ctx, target, port, init_timeout_s):
        world = self.world
        self.procs, self.conns = [], []
        self.jobs_run = 0
        self.stderr_dir = _stderr_dir()
        self.stderr_paths = [os.path.join(self.stderr_dir, f"rank{r}.err") for r in range(world)]
        for r in range(world):
            parent, child = ctx.Pipe()
            args = (r, world, port, target, child, init_timeout_s, self.stderr_paths[r])
            p = ctx.Process(target=_rank_main, args=args, daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        failed = [(r, f) for r, f in enumerate(self._gather(init_timeout_s)) if not f.get("ok", True)]
        if failed:
            self.kill()
            raise RanksFailedToStart(failed)

    def alive(self):
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def run(self, job, timeout_s):
        self.jobs_run += 1
        for c in self.conns:
            c.send(job)
        return self._gather(timeout_s, grace_s=OP_STRANDED_GRACE_S if "library_op" in job["case"] else STRANDED_GRACE_S)

    def _gather(self, timeout_s, grace_s=STRANDED_GRACE_S):
        results = [None] * self.world
        pending = {c: r for r, c in enumerate(self.conns)}
        start = time.monotonic()
        deadline = start + timeout_s
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}

        def received(r, result):
            nonlocal deadline
            results[r] = result
            del pending[self.conns[r]]
            if not result.get("ok", True):
                now = time.monotonic()
                deadline = min(deadline, now + min(STRANDED_GRACE_S, max(grace_s, 2 * (now - start))))

        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                stuck = sorted(pending.values())
                printed = self.dump_stacks(stuck)
                where = [(r, stuck_at(printed[r])) for r in stuck]
                # A C++ abort that never completed (its handler blocked) leaves the rank alive: it
                # failed, it did not hang.
                aborted = [(r, abort_message(printed[r])) for r in stuck if "terminate called" in printed[r]]
                self.kill()
                if aborted:
                    r, said = aborted[0]
                    raise RankDied(r, f"rank {r} aborted but did not exit: {said}")
                if any(r is not None and not r.get("ok", True) for r in results):
                    # A rank failed and its peers were left waiting for it: the failure is the story.
                    for r in stuck:
                        results[r] = {"ok": False, "type": "Stranded", "module": "", "traceback": "",
                                      "message": "left waiting in a collective after a peer failed"}
                    return results
                raise RanksHung(stuck, timeout_s, where)
            ready = wait(list(pending) + list(sentinels), timeout=min(left, 1.0))
            for obj in ready:
                if obj in pending:
                    try:
                        received(pending[obj], obj.recv())
                    except (EOFError, OSError):
                        continue
                elif obj in sentinels:
                    r = sentinels[obj]
                    p = self.procs[r]
                    if r in pending.values() and (report := self._report_before_exit(r)) is not None:
                        received(r, report)  # it reported, then exited (a start-up failure)
                        continue
                    if r in pending.values():
                        p.join(0.1)
                        code = p.exitcode
                        said = abort_message(read_tail(self.stderr_paths[r]))
                        self.kill()
                        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
                        raise RankDied(r, f"rank {r} {why}" + (f": {said}" if said else ""))
                    del sentinels[obj]
        return results

    def _report_before_exit(self, r):
        """What rank r, found exited, had sent first (None if nothing)."""
        try:
            return self.conns[r].recv() if self.conns[r].poll() else None
        except (EOFError, OSError):
            return None

    def dump_stacks(self, ranks, wait_s=1.0):
        """Asks each rank for its Python stack (SIGUSR1); returns what each has printed this job,
        the stack last."""
        for r in ranks:
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(wait_s)
        return {r: read_tail(self.stderr_paths[r], 16000) for r in ranks}

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.join(5)
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []
        if self.stderr_dir:
            shutil.rmtree(self.stderr_dir, ignore_errors=True)
            self.stderr_dir = None
