"""An in-process case that never finishes is interrupted by the worker's alarm (shardfuzz_worker/interrupt.py)
and reported at the frame it was interrupted in; a case that finishes is untouched."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker import interrupt  # noqa: E402
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

    def test_a_hang_waited_out_once_is_cut_at_its_site_the_next_time_and_a_slow_case_elsewhere_is_not(self):
        import time

        interrupt._known_sites.clear()
        saved = interrupt.PROBE_AFTER_S, interrupt.PROBE_EVERY_S
        interrupt.PROBE_AFTER_S, interrupt.PROBE_EVERY_S = 0.2, 0.1
        try:
            with self.assertRaises(CaseTimedOut) as first:
                run_with_alarm(spin_forever, 0.5)
            self.assertIsNone(first.exception.cut_after)
            self.assertEqual(len(interrupt._known_sites), 1)
            begun = time.monotonic()
            with self.assertRaises(CaseTimedOut) as again:
                run_with_alarm(spin_forever, 5.0)
            self.assertIsNotNone(again.exception.cut_after)
            self.assertLess(time.monotonic() - begun, 1.0)
            self.assertIn("was cut there", interrupt.hang_reason(again.exception, 5.0))

            def slow_elsewhere():
                end = time.monotonic() + 0.6
                while time.monotonic() < end:
                    pass
                return "done"

            self.assertEqual(run_with_alarm(slow_elsewhere, 5.0), "done")

            # Given more time, a case is never cut; one that then finishes was only slow, and the site
            # its full wait taught is forgotten.
            with self.assertRaises(CaseTimedOut) as patient:
                run_with_alarm(spin_forever, 0.5, cut_known=False)
            self.assertIsNone(patient.exception.cut_after)
            interrupt.forget_last_learned()
            self.assertEqual(interrupt._known_sites, [])
        finally:
            interrupt.PROBE_AFTER_S, interrupt.PROBE_EVERY_S = saved
            interrupt._known_sites.clear()

    def test_a_site_drops_line_numbers_and_keeps_the_call_our_code_made(self):
        where = ("torch/x.py:12 in guard, entered from shardfuzz_worker/targets/t.py:204 in viewed "
                 "via torch/d.py:299 in slow")
        self.assertEqual(interrupt.site_of(where), "shardfuzz_worker/targets/t.py in viewed via torch/d.py in slow")
        self.assertEqual(interrupt.site_of("a.py:3 in f"), "a.py in f")


if __name__ == "__main__":
    unittest.main()
