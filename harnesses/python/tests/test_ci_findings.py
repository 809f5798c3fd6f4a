"""The test suite's rules for telling a framework's finding from a false positive of ours (ci_findings)."""

import unittest

from shardfuzz_worker import ci_findings as cf


def verdict(kind, tensor="grad/1", stat="norm", error=1.0, passing=()):
    checks = [{"tensor": t, "pass": True, "error": 1e-3, "stats": [{"stat": stat, "error": 1e-3}]} for t in passing]
    failing = {"tensor": tensor, "pass": kind != "divergent", "decided_by": stat, "error": error / 2,
               "stats": [{"stat": "max", "error": error / 2}, {"stat": stat, "error": error}]}
    return {"kind": kind, "checks": checks + [failing]}


class ScaleFree(unittest.TestCase):
    def test_an_error_that_stays_put_from_float32_to_bfloat16_is_not_round_off(self):
        # A doubled gradient: norm error 1.0 whatever the dtype.
        found = verdict("divergent", error=0.999)
        self.assertTrue(cf.scale_free(found, verdict("divergent", error=1.0), verdict("divergent", error=0.998)))

    def test_an_error_that_shrinks_with_the_unit_round_off_is_round_off(self):
        found = verdict("divergent", error=0.3)
        # Still flagged in float32 (its bounds are 2^16 tighter), but 2^12 smaller: round-off.
        self.assertFalse(cf.scale_free(found, verdict("divergent", error=0.3 / 4096), verdict("divergent", error=0.3)))
        # Just past the factor.
        self.assertFalse(cf.scale_free(found, verdict("divergent", error=0.2), verdict("divergent", error=0.81)))

    def test_a_rerun_that_passes_or_fails_otherwise_confirms_nothing(self):
        found = verdict("divergent")
        self.assertFalse(cf.scale_free(found, verdict("pass"), verdict("divergent")))
        self.assertFalse(cf.scale_free(found, verdict("divergent"), None))
        self.assertFalse(cf.scale_free(found, {"kind": "crash", "checks": []}, verdict("divergent")))

    def test_the_statistic_that_decided_is_the_one_compared(self):
        found = verdict("divergent", tensor="out/0", stat="direction", error=0.3, passing=["grad/0"])
        self.assertEqual(cf.decided(found), ("out/0", "direction"))
        # Same direction error in both; another tensor's error is not looked at.
        f32 = verdict("divergent", tensor="out/0", stat="direction", error=0.3, passing=["grad/0"])
        bf16 = verdict("divergent", tensor="out/0", stat="direction", error=0.31, passing=["grad/0"])
        self.assertTrue(cf.scale_free(found, f32, bf16))
        self.assertIsNone(cf.stat_error(f32, ("out/1", "direction")))

    def test_a_missing_or_nan_error_confirms_nothing(self):
        found = verdict("divergent")
        nan = verdict("divergent")
        nan["checks"][-1]["stats"][1]["error"] = None
        self.assertFalse(cf.scale_free(found, nan, verdict("divergent")))


class Hangs(unittest.TestCase):
    def test_a_hang_is_the_framework_s_only_when_every_rank_waits_inside_it(self):
        theirs = "rank 0 waits at torch/fx/x.py:1 in f, entered from shardfuzz_worker/t.py:2 in g via torch/distributed/tensor/_dispatch.py:3 in h"
        ours = "rank 1 waits at shardfuzz_worker/targets/t.py:5 in g"
        bare = "rank 0 waits at torch/x.py:1 in f via torch/distributed/distributed_c10d.py:9 in all_reduce"
        self.assertTrue(cf.framework_hang(theirs))
        self.assertFalse(cf.framework_hang(f"{theirs}; {ours}"))
        self.assertFalse(cf.framework_hang(bare))
        self.assertFalse(cf.framework_hang("the case did not finish"))


class CrashSite(unittest.TestCase):
    def test_traced_source_lines_and_handed_over_objects_do_not_name_our_code(self):
        jax = "XlaRuntimeError: bad\nSuspected Python Code Location:\nshardfuzz_worker/targets/jax_ops.py:3"
        self.assertNotIn("shardfuzz_worker", cf.crash_site(jax))
        mlir = "shardfuzz_worker/targets/jax_ops.py:382:29: error: 'func.call' op failed"
        self.assertNotIn("shardfuzz_worker", cf.crash_site(mlir))
        ours = 'KeyError: 3 (at File "shardfuzz_worker/targets/torch_tp.py", line 9)'
        self.assertIn("shardfuzz_worker", cf.crash_site(ours))
        dynamo = ("TorchRuntimeError: RuntimeError when making fake tensor call\n  Explanation: Sharding propagation "
                  "failed\n\nfrom user code:\n   File \"/x/shardfuzz_worker/targets/torch_model.py\", line 103, in "
                  "forward\n    return x + inner(self.norm(x)) (at File \"/x/torch/nn/modules/linear.py\", line 134)")
        self.assertNotIn("shardfuzz_worker", cf.crash_site(dynamo))
        self.assertIn("linear.py", cf.crash_site(dynamo))
        traced_ours = dynamo.replace("/x/torch/nn/modules/linear.py", "/x/shardfuzz_worker/targets/torch_model.py")
        self.assertIn("shardfuzz_worker", cf.crash_site(traced_ours))



class KnownFix(unittest.TestCase):
    def test_all_fixes_first_then_halves_and_an_earlier_answer_first(self):
        import pathlib
        from unittest import mock

        names = sorted(n for n, (targets, _) in cf.FIXES.items() if "deepspeed-zero" in targets)
        self.assertGreater(len(names), 8)
        culprit = names[-1]
        tried = []

        def passes(case_file, target, fixes):  # a case the culprit's fix makes pass, whatever else is applied
            tried.append(list(fixes))
            return culprit in fixes

        with mock.patch.object(cf, "passes", passes), mock.patch.object(cf, "_EXPLAINED", []):
            self.assertEqual(cf.known_fix(pathlib.Path("a"), "deepspeed-zero"), culprit)
            self.assertEqual(tried[0], names)
            self.assertLessEqual(len(tried), 1 + 2 * len(names).bit_length())
            first = len(tried)
            self.assertEqual(cf.known_fix(pathlib.Path("b"), "deepspeed-zero"), culprit)
            self.assertEqual(len(tried), first + 1)  # the fix that explained the first finding, at once
            tried.clear()
            with mock.patch.object(cf, "passes", lambda *a: tried.append(a[2]) and False):
                self.assertIsNone(cf.known_fix(pathlib.Path("c"), "deepspeed-zero"))
            self.assertEqual(len(tried), 1 + 1 + len(names))  # the earlier answer, all, then each alone

    def test_two_fixes_needed_together_are_named_together(self):
        import pathlib
        from unittest import mock

        names = sorted(n for n, (targets, _) in cf.FIXES.items() if "deepspeed-zero" in targets)
        pair = {names[0], names[-1]}
        with mock.patch.object(cf, "passes", lambda c, t, fixes: pair <= set(fixes)), \
                mock.patch.object(cf, "_EXPLAINED", []):
            got = cf.known_fix(pathlib.Path("a"), "deepspeed-zero").split("+")
        self.assertLessEqual(pair, set(got))


if __name__ == "__main__":
    unittest.main()
