"""OpInfo sample drawing in the worker: no stack walk per sample list (it cost 24 ms a walk), and a seed
still draws the same values every time. Skipped where torch is not installed."""

import importlib.util
import inspect
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class UntrackedSamples(unittest.TestCase):
    def test_drawing_samples_walks_no_stack(self):
        from shardfuzz_worker.targets import torch_opinfo

        op = torch_opinfo.find({"name": "addmm"})  # loads the table, which installs the shortcut
        with mock.patch.object(inspect, "stack", wraps=inspect.stack) as stack:
            samples = torch_opinfo.draw(op, 7, True)
        self.assertGreater(len(samples), 0)
        self.assertEqual(stack.call_count, 0, "OpInfo's sample iterator walked the stack")

    def test_the_same_seed_draws_the_same_values(self):
        import torch

        from shardfuzz_worker.targets import torch_opinfo

        op = torch_opinfo.find({"name": "nn.functional.layer_norm"})
        first, again = torch_opinfo.draw(op, 11, True), torch_opinfo.draw(op, 11, True)
        self.assertEqual(len(first), len(again))
        for a, b in zip(first, again):
            self.assertTrue(torch.equal(a.input, b.input))


if __name__ == "__main__":
    unittest.main()
