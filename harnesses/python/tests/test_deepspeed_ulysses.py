"""deepspeed-zero's context parallelism as DeepSpeed-Ulysses: the engine configuration, the rank layout, what it refuses
and the features it reports (the runs themselves are in tests/python_targets.rs). Skipped where DeepSpeed is not
installed."""

import importlib.util
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "python-deepspeed-ulysses")
HAVE_DEEPSPEED = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("deepspeed") is not None


def case(name, **parallel):
    with open(os.path.join(CASES, name)) as f:
        c = json.load(f)
    c["parallel"].update(parallel)
    return c


@unittest.skipUnless(HAVE_DEEPSPEED, "deepspeed is not installed in this environment")
class UlyssesTest(unittest.TestCase):
    def test_the_engine_gets_the_dp_x_sp_mesh_and_a_batch_of_dp_ranks(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        cfg = TARGET.config(case("cp2-dp2-gqa-zero2-clip-bf16.json"), 4)
        self.assertEqual((cfg["sequence_parallel_size"], cfg["data_parallel_size"], cfg["train_batch_size"]), (2, 2, 2))
        plain = TARGET.config(case("cp2-f32.json", cp=1), 1)
        self.assertNotIn("sequence_parallel_size", plain, "no mesh without context parallelism")
        unit = TARGET.config(case("cp2-dp2-gqa-zero2-clip-bf16-sequence-parallel-unit.json"), 4)
        self.assertNotIn("sequence_parallel_size", unit, "the sequence-parallel unit, not the config's mesh")
        self.assertEqual(unit["train_batch_size"], 2)

    def test_ranks_are_dp_major_and_sp_minor(self):
        from shardfuzz_worker.targets.deepspeed_ulysses import rank_part

        c = case("cp2-dp2-gqa-zero2-clip-bf16.json")
        self.assertEqual([rank_part(r, c) for r in range(4)], [(0, 0), (0, 1), (1, 0), (1, 1)])
        self.assertEqual(rank_part(3, case("cp2-f32.json", cp=1, dp=4)), (3, None))

    def test_refusals_and_features(self):
        from shardfuzz_worker.targets.deepspeed_ulysses import features
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        self.assertIn("seq must be a multiple of cp", TARGET.unsupported(case("cp3-uneven-sequence-unsupported.json")))
        self.assertIsNone(TARGET.unsupported(case("cp3-uneven-heads-zero3-f32.json")))
        self.assertIn("AutoTP beside Ulysses", TARGET.unsupported(case("cp2-f32.json", tp=2)))
        self.assertIn("no pp", TARGET.unsupported(case("cp2-f32.json", pp=2)))
        self.assertEqual(features("s", case("cp3-uneven-heads-zero3-f32.json")),
                         ["s:ulysses-sp3", "s:ulysses:uneven-heads", "s:ulysses:config-mesh"])
        self.assertEqual(features("s", case("cp2-dp2-gqa-zero2-clip-bf16-sequence-parallel-unit.json")),
                         ["s:ulysses-sp2", "s:ulysses:even-heads", "s:ulysses:sequence-parallel-unit", "s:ulysses:gqa"])
        self.assertEqual(features("s", case("cp2-f32.json", cp=1)), [])


if __name__ == "__main__":
    unittest.main()
