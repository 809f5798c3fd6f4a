"""A persistent pool of rank processes joined by gloo on a loopback port.

Ranks are forked once per world size and reused for every case of that size; each runs the target's
`run_rank` for every job and reports its result (or its exception) over a pipe. A rank that dies or
does not answer in time gets the pool killed; the next case of that size forks a fresh one.
"""

import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from multiprocessing.connection import wait

from . import lifetime
from .coverage import Coverage

#: How long peers of a failed rank get to finish before they count as stranded.
STRANDED_GRACE_S = 5.0


class RankDied(Exception):
    def __init__(self, rank, message):
        super().__init__(message)
        self.rank = rank


class RanksHung(Exception):
    def __init__(self, stuck, waited):
        super().__init__(f"ranks {stuck} did not finish within {waited:.1f} s")
        self.stuck = stuck


def free_loopback_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, target, conn, init_timeout_s):
    lifetime.die_with_parent()
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GLOO_SOCKET_IFNAME="lo",
    )
    target.init_rank(rank, world, init_timeout_s)
    cov = Coverage(target.coverage_prefixes)
    conn.send({"ready": rank})
    while True:
        try:
            job = conn.recv()
        except EOFError:
            os._exit(0)
        if job is None:
            os._exit(0)
        hook = job.get("test_hook")
        if hook == "kill-rank" and rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if hook == "sleep":
            time.sleep(3600)
        try:
            out = target.run_rank(rank, world, job["case"], job["inputs"])
            conn.send({"ok": True, "out": out, "coverage": cov.take()})
        except BaseException as e:  # noqa: BLE001 - every failure is reported, none kills the rank
            conn.send(
                {
                    "ok": False,
                    "type": type(e).__name__,
                    "module": type(e).__module__,
                    "message": str(e)[:2000],
                    "traceback": traceback.format_exc()[-4000:],
                    "coverage": cov.take(),
                }
            )


class RankPool:
    def __init__(self, target, world, init_timeout_s=120.0):
        self.world = world
        ctx = mp.get_context("fork")
        port = free_loopback_port()
        self.procs, self.conns = [], []
        for r in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rank_main, args=(r, world, port, target, child, init_timeout_s), daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self._gather(init_timeout_s)

    def alive(self):
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def run(self, job, timeout_s):
        for c in self.conns:
            c.send(job)
        return self._gather(timeout_s)

    def _gather(self, timeout_s):
        results = [None] * self.world
        pending = {c: r for r, c in enumerate(self.conns)}
        deadline = time.monotonic() + timeout_s
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                stuck = sorted(pending.values())
                self.kill()
                if any(r is not None and not r.get("ok", True) for r in results):
                    # A rank failed and its peers were left waiting for it: the failure is the story.
                    for r in stuck:
                        results[r] = {"ok": False, "type": "Stranded", "module": "", "traceback": "",
                                      "message": "left waiting in a collective after a peer failed"}
                    return results
                raise RanksHung(stuck, timeout_s)
            ready = wait(list(pending) + list(sentinels), timeout=min(left, 1.0))
            for obj in ready:
                if obj in pending:
                    r = pending[obj]
                    try:
                        results[r] = obj.recv()
                    except (EOFError, OSError):
                        continue
                    del pending[obj]
                    if not results[r].get("ok", True):
                        deadline = min(deadline, time.monotonic() + STRANDED_GRACE_S)
                elif obj in sentinels:
                    r = sentinels[obj]
                    p = self.procs[r]
                    if r in pending.values():
                        p.join(0.1)
                        code = p.exitcode
                        self.kill()
                        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
                        raise RankDied(r, f"rank {r} {why}")
                    del sentinels[obj]
        return results

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
