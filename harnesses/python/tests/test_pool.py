"""The rank pool's start: a rendezvous port another process takes between being picked and bound
(EADDRINUSE at rank 0's store) makes the pool start again on another port, not fail the case. Skipped
where torch is not installed.

    cd harnesses/python && ../../.venv/bin/python -m unittest tests.test_pool
"""

import importlib.util
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_TORCH = importlib.util.find_spec("torch") is not None

#: A pool whose first pick is a port held open here: it must start on another.
TAKEN_PORT = """
import socket
from shardfuzz_worker import pool
from shardfuzz_worker.targets.torch_ddp import TARGET

taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
taken.bind(("127.0.0.1", 0))
taken.listen(1)
picks = [taken.getsockname()[1]]
real = pool.free_loopback_port
pool.free_loopback_port = lambda: picks.pop() if picks else real()
p = pool.RankPool(TARGET, 2, init_timeout_s=60.0)
assert picks == [], "the taken port was not tried"
assert p.alive()
p.kill()
print("started on another port")
"""

#: A rank whose start-up fails in our code (as a requested known fix that does not apply to the installed release).
START_FAILS = """
from shardfuzz_worker import pool
from shardfuzz_worker.targets.torch_ddp import TARGET
from shardfuzz_worker.verdicts import classify_failures

real = type(TARGET).init_rank

def init_rank(self, rank, world, timeout_s):
    real(self, rank, world, timeout_s)
    if rank == 1:
        raise AttributeError("the fix's target is missing")

type(TARGET).init_rank = init_rank
try:
    pool.RankPool(TARGET, 2, init_timeout_s=60.0)
    raise SystemExit("the pool started")
except pool.RanksFailedToStart as e:
    assert [r for r, _ in e.failed] == [1], e.failed
    print(classify_failures(TARGET, e.failed, 2))
"""


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class RankPoolStart(unittest.TestCase):
    def test_a_start_up_failure_is_reported_with_its_frames(self):
        # Before: the rank exited and the case read "crash: rank 1 exited with status 1".
        done = subprocess.run([sys.executable, "-c", START_FAILS], capture_output=True, text=True, timeout=240,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("'status': 'harness_error'", done.stdout)
        self.assertIn("the fix's target is missing", done.stdout)

    def test_a_port_taken_before_rank_0_binds_it_starts_the_pool_on_another(self):
        # In a fresh interpreter: rank processes fork from it, and this one may hold a process group
        # already (the in-process DTensor tests).
        done = subprocess.run([sys.executable, "-c", TAKEN_PORT], capture_output=True, text=True, timeout=240,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("started on another port", done.stdout)

    def test_only_a_taken_port_is_retried(self):
        from shardfuzz_worker.pool import port_taken

        self.assertTrue(port_taken("rank 0 exited with status 1: torch.distributed.DistNetworkError: The server socket "
                                   "has failed to listen on any local network address. port: 41, useIpv6: false, code: -98, "
                                   "name: EADDRINUSE, message: address already in use"))
        self.assertFalse(port_taken("rank 1 exited with status 1: RuntimeError: gloo connect timed out"))



class WhereARankWaits(unittest.TestCase):
    """A stuck rank's place: megatron_common's CUDA-on-CPU mode only re-dispatches the framework's own torch call,
    so a rank waiting under it waits in that call (a collective megatron issued), not in our code."""

    MODE = 'File "/w/harnesses/python/shardfuzz_worker/targets/megatron_common.py", line 54 in __torch_function__'
    CALL = 'File "/v/site-packages/megatron/core/distributed/param_and_grad_buffer.py", line 300 in start_param_sync'
    OURS = 'File "/w/harnesses/python/shardfuzz_worker/targets/megatron_model.py", line 302 in train_megatron'

    def test_the_mode_is_transparent(self):
        from shardfuzz_worker.pool import where_in

        self.assertEqual(where_in([self.MODE, self.CALL, self.OURS]),
                         "megatron/core/distributed/param_and_grad_buffer.py:300 in start_param_sync, entered from "
                         "shardfuzz_worker/targets/megatron_model.py:302 in train_megatron via "
                         "megatron/core/distributed/param_and_grad_buffer.py:300 in start_param_sync")

    def test_our_own_waits_stay_ours(self):
        from shardfuzz_worker.pool import where_in

        self.assertEqual(where_in([self.OURS]), "shardfuzz_worker/targets/megatron_model.py:302 in train_megatron")


if __name__ == "__main__":
    unittest.main()
