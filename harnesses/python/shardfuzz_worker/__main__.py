"""Entry point: `python -m shardfuzz_worker --target NAME` serves cases until stdin closes."""

import argparse
import os
import sys
import traceback

from . import known_fixes, lifetime, protocol, tensors_io
from .interrupt import CaseTimedOut, forget_last_learned, hang_reason, run_with_alarm
from .pool import RankDied, RankPool, RanksFailedToStart, RanksHung, test_raise
from .targets import REGISTRY, load
from .targets.base import (HarnessError, as_offered, expected_outputs, unsupported_checkpoint_layout,
                           unsupported_resume_parallel,
                           unsupported_clip_norm, unsupported_frozen, unsupported_label_smoothing,
                           unsupported_model_vocabulary)
from .validation import describe, short
from .verdicts import classify_failures


def main():
    ap = argparse.ArgumentParser(prog="shardfuzz_worker")
    ap.add_argument("--target", required=True)
    ap.add_argument("--list", action="store_true", help="print the registered targets and exit")
    args = ap.parse_args()
    protocol.claim_stdout()
    lifetime.watch_parent()
    lifetime.cap_memory()
    try:
        target = load(args.target)
        versions = target.versions()
    except Exception as e:  # noqa: BLE001 - a missing framework makes the target unavailable
        protocol.send({"event": "unavailable", "target": args.target, "reason": f"{type(e).__name__}: {e}"})
        return 0
    versions["python"] = sys.version.split()[0]
    fixes = known_fixes.concerning(args.target)
    if fixes:  # (the verdicts depend on them: every finding records them, and its report re-applies them)
        versions["known-fixes"] = ",".join(fixes)
    protocol.send({"event": "ready", "target": args.target, "versions": versions, "known": sorted(REGISTRY)})
    serve(target)
    return 0


def slow_test_hook(job):
    """The `slow-in-process` test hook: the first case outlasts its timeout inside the alarm (as a long compilation
    does), a patient rerun of it (a later request, without the hook) does not."""
    if job.get("test_hook") == "slow-in-process":
        import time

        time.sleep(job["timeout_s"] + 0.5)


class Coordinator:
    """Keeps rank pools by world size, least recently used first out when the ranks they hold
    together would exceed MAX_POOLED_RANKS, and turns results into replies."""

    MAX_POOLED_RANKS = int(os.environ.get("SHARDFUZZ_MAX_POOLED_RANKS", "16"))

    def __init__(self, target):
        self.target = target
        self.pools = {}
        self.local_cov = None

    def pool(self, world):
        p = self.pools.pop(world, None)
        if p is not None and p.alive():
            self.pools[world] = p
            return p
        if p is not None:
            p.kill()
        while self.pools and sum(self.pools) + world > self.MAX_POOLED_RANKS:
            oldest = next(iter(self.pools))
            self.pools.pop(oldest).kill()
        self.target.before_fork()
        p = RankPool(self.target, world)
        self.pools[world] = p
        return p

    def drop(self, world):
        p = self.pools.pop(world, None)
        if p is not None:
            p.kill()

    def run(self, msg):
        case = as_offered(self.target, msg["case"])
        reason = (("op" in case and self.target.unsupported_op(case)) or unsupported_frozen(self.target, case)
                  or unsupported_model_vocabulary(self.target, case)
                  or unsupported_label_smoothing(self.target, case) or unsupported_clip_norm(self.target, case)
                  or unsupported_checkpoint_layout(self.target, case) or unsupported_resume_parallel(self.target, case)
                  or self.target.unsupported(case))
        if reason:
            return {"status": "unsupported", "reason": reason}
        inputs = tensors_io.read_inputs(msg["inputs"])
        world = self.target.world(case)
        if msg.get("processes") and hasattr(self.target, "process_world"):
            # Confirming a finding of an in-process simulation on real ranks.
            world = self.target.process_world(case)
        timeout = float(msg.get("timeout_s", 60))
        job = {"case": case, "inputs": inputs, "test_hook": msg.get("test_hook"), "timeout_s": timeout}
        if world == 0:
            return self.run_local(job, msg)
        try:
            results, notes = self.run_in_pool(world, job, timeout)
        except RanksHung as e:
            self.drop(world)
            return {"status": "hang", "reason": str(e), "stuck": e.stuck}
        except RankDied as e:
            self.drop(world)
            return {"status": "crash", "rank": e.rank, "reason": str(e)}
        except RanksFailedToStart as e:
            # Judged as a job's failures are: our start-up code (a known fix that does not apply) is a harness error.
            return {**classify_failures(self.target, e.failed, world), "coverage": []}
        coverage = set()
        for r in results:
            coverage |= r.get("coverage", set())
        failed = [(i, r) for i, r in enumerate(results) if not r["ok"]]
        if failed:
            if must_restart(failed, world):
                self.drop(world)
            reply = classify_failures(self.target, failed, world, case.get("parallel", {}).get("pp", 1))
            if reply["status"] == "crash" and len(failed) == world:
                refusal = self.target.single_device_refusal(case)
                if refusal:
                    # Every rank failed on a call the op refuses on one device too (refused both ways).
                    reply = {"status": "rejected", "reason": f"{refusal}; sharded too: {reply['reason'][:200]}"}
            reply["coverage"] = sorted(coverage)
            return reply
        combined = self.target.combine(case, [r["out"] for r in results])
        if "unsupported" in combined:
            # (A target that can tell only from the run whether it expresses the case: colossalai-moe's routing.)
            return {"status": "unsupported", "reason": combined["unsupported"], "coverage": sorted(coverage)}
        combined["notes"] = combined.get("notes", []) + notes
        return self.completed(msg, combined, coverage, inputs)

    def run_in_pool(self, world, job, timeout):
        """The ranks' results, and notes. A reused pool whose ranks hang in our own frames (a C++ destructor of an
        earlier case's object, run as a call's locals are released: a gloo process group waiting for work that
        never completes) is no verdict on this case: it runs once more on fresh ranks, as `shardfuzz run` would
        run it alone, and a hang there stands."""
        pool = self.pool(world)
        try:
            return pool.run(job, timeout), []
        except RanksHung as e:
            if pool.jobs_run < 2 or not e.in_our_frames():
                raise
            self.drop(world)
            note = f"reran on fresh ranks: in a reused rank pool {e}"
            return self.pool(world).run(job, timeout), [note]

    def single_device(self, msg):
        """Whether a library-op case's op finishes on one device (float64) within the case's time: a case whose
        sharded run hung is no finding when the op alone is as slow (an edit that made a call exponential,
        `combinations` of r = 34). `timeout`, `ok` (with the seconds), `failed` (the op raised: the hang stands)
        or `unknown` (the target cannot tell)."""
        timeout = float(msg.get("timeout_s", 60))
        try:
            seconds = run_with_alarm(lambda: self.target.single_device_seconds(msg["case"]), timeout, cut_known=False)
        except CaseTimedOut:
            return {"status": "timeout"}
        except Exception as e:  # noqa: BLE001 - the op refuses the call on one device: the hang stands
            return {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[:200]}"}
        return {"status": "unknown"} if seconds is None else {"status": "ok", "seconds": seconds}

    def run_local(self, job, msg):
        from .coverage import Coverage

        if self.local_cov is None:
            self.local_cov = Coverage(self.target.coverage_prefixes)
        if job.get("test_hook") == "sleep":
            import time

            time.sleep(3600)
        timeout = float(msg.get("timeout_s", 60))
        try:
            test_raise(job.get("test_hook"))
            patient = msg.get("patient", False)

            def case():
                slow_test_hook(job)
                return self.target.run_local(job["case"], job["inputs"])

            combined = run_with_alarm(case, timeout, cut_known=not patient)
            if patient:
                forget_last_learned()
        except CaseTimedOut as e:
            # Waited out in full (not cut at a known hang's site): the fuzzer may give the case more time.
            return {"status": "hang", "reason": hang_reason(e, timeout), "stuck": [0],
                    "waited_out_in_process": e.cut_after is None, "coverage": sorted(self.local_cov.take())}
        except Exception as e:  # noqa: BLE001
            if msg.get("patient", False):
                forget_last_learned()
            reply = classify_failures(self.target, [(None, describe(e))], 1)
            reply["coverage"] = sorted(self.local_cov.take())
            return reply
        return self.completed(msg, combined, self.local_cov.take(), job["inputs"])

    def completed(self, msg, combined, coverage, inputs):
        status = combined.pop("status", "completed")
        if status != "completed":
            return {"status": status, "reason": combined.get("reason", ""), "coverage": sorted(coverage)}
        tensors = combined.get("tensors", {})
        missing = [n for n in expected_outputs(msg["case"], inputs) if tensors.get(n) is None]
        if missing:
            raise HarnessError(f"{self.target.name} returned no {', '.join(missing)}")
        tensors_io.write_outputs(msg["output"], tensors, combined.get("replicas", {}))
        return {
            "status": "completed",
            "output": msg["output"],
            "features": combined.get("features", []),
            "notes": combined.get("notes", []),
            "stats": combined.get("stats", {}),
            "coverage": sorted(coverage),
        }


def must_restart(failed, world):
    """Whether a pool whose ranks failed must be started afresh. Peers of a failed rank may be waiting in
    a collective; and ranks that all failed, but at different sites, have not run the same framework
    calls: process groups created on some ranks only, or a framework's global counters advanced on some,
    leave the next case out of step (a `new_group` that hangs, a "not synchronized" check that fails).
    Ranks that all failed at one site (the same refusal everywhere; its message may name the rank) keep
    the pool."""
    if len(failed) < world or any(f["type"] == "Stranded" for _, f in failed):
        return True
    return len({failure_site(f) for _, f in failed}) > 1


def failure_site(f):
    """Type and raising frame of every exception in the failure's chain, outermost first."""
    links = f.get("chain") or [{"type": f["type"], "frames": []}]
    return tuple((link["type"], tuple(link["frames"][-1]) if link["frames"] else None) for link in links)


def worker_failed(e):
    """A failure of the coordinator's own code (combining, writing outputs): a harness error."""
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {short((frames[-1].filename, frames[-1].lineno, frames[-1].name))})" if frames else ""
    return {"status": "harness_error", "reason": f"{type(e).__name__}: {e}{at}",
            "traceback": traceback.format_exc()[-4000:]}


def serve(target):
    coord = Coordinator(target)
    while True:
        msg = protocol.receive()
        if msg is None or msg.get("cmd") == "quit":
            break
        if msg.get("cmd") == "vocabulary":
            # Asked for on demand: reading an op database (OpInfo) takes seconds.
            try:
                protocol.send({"id": msg.get("id"), "status": "ok", "ops": target.vocabulary()})
            except Exception as e:  # noqa: BLE001 - a failure of our code reading it: a harness error
                protocol.send({"id": msg.get("id"), **worker_failed(e)})
            continue
        if msg.get("cmd") == "single_device":
            protocol.send({"id": msg.get("id"), **coord.single_device(msg)})
            continue
        if msg.get("cmd") != "run":
            protocol.send({"id": msg.get("id"), "status": "crash", "reason": f"unknown command {msg.get('cmd')!r}"})
            continue
        if msg.get("test_hook") == "kill-worker":
            os.kill(os.getpid(), 9)
        try:
            reply = coord.run(msg)
        except Exception as e:  # noqa: BLE001 - the worker itself failed: report, keep serving
            reply = worker_failed(e)
        reply["id"] = msg.get("id")
        protocol.send(reply)
    for world in list(coord.pools):
        coord.drop(world)


if __name__ == "__main__":
    sys.exit(main())
