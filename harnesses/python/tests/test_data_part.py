"""Which rows a rank trains on (torch_training.DataPart): the split `train` uses, and the one it switches to when a
run resumes into other degrees. Skipped where torch is not installed."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def case(batch, accumulation):
    return {"model": {"batch": batch, "seq": 4}, "train": {"grad_accumulation": accumulation}}


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class DataPartSplit(unittest.TestCase):
    def test_rows_micro_batches_and_divisor_follow_the_degree(self):
        from shardfuzz_worker.targets.torch_training import DataPart

        lo, hi, averaged, chunks = DataPart(1, 2).split(case(6, 2))
        self.assertEqual((lo, hi, averaged), (3, 6, 2))
        self.assertEqual(chunks[0][0], 3)
        self.assertEqual(chunks[-1][1], 6)
        self.assertEqual(len(chunks), 2)
        # The same rank as data-parallel index 1 of 3 (a run resumed into dp 3): other rows, another divisor.
        lo, hi, averaged, chunks = DataPart(1, 3).split(case(6, 2))
        self.assertEqual((lo, hi, averaged, chunks), (2, 4, 3, [(2, 3), (3, 4)]))

    def test_every_row_is_trained_once_in_each_layout(self):
        from shardfuzz_worker.targets.torch_training import DataPart

        for dp in (1, 2, 3, 4):
            rows = []
            for i in range(dp):
                lo, hi, _, chunks = DataPart(i, dp).split(case(7, 1))
                self.assertEqual(chunks, [(lo, hi)])
                rows.extend(range(lo, hi))
            self.assertEqual(rows, list(range(7)), dp)


if __name__ == "__main__":
    unittest.main()
