"""An in-process case that never finishes is interrupted by the worker's alarm (shardfuzz_worker/interrupt.py)
and reported at the frame it was interrupted in; a case that finishes is untouched."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.interrupt import CaseTimedOut, run_with_alarm, where_interrupted  # noqa: E402


def spin_forever():
    while True:
        try:
            pass
        except Exception:  # noqa: BLE001 - an op's own handler must not swallow the alarm
            continue


class InterruptTest(unittest.TestCase):
    def test_a_loop_that_never_ends_is_interrupted_where_it_runs(self):
        try:  # (not assertRaises: it drops the traceback the report is made from)
            run_with_alarm(spin_forever, 0.2)
        except CaseTimedOut as e:
            where = where_interrupted(e)
        else:
            self.fail("the loop was not interrupted")
        self.assertTrue(where.startswith("rank 0 waits at "), where)
        self.assertIn("in spin_forever", where)

    def test_a_case_that_finishes_returns_and_leaves_no_alarm(self):
        import signal
        import time

        self.assertEqual(run_with_alarm(lambda: 42, 0.2), 42)
        time.sleep(0.3)  # (an alarm left armed would raise here)
        self.assertEqual(signal.getitimer(signal.ITIMER_REAL), (0.0, 0.0))


if __name__ == "__main__":
    unittest.main()
