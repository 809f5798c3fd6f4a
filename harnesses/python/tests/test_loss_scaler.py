"""The torch targets' dynamic loss scaler (torch_training): float16 gradients unscaled, a step with a
non-finite gradient skipped and the scale halved, and ranks whose scalers disagree reported as a
divergence. Skipped where torch is not installed."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class LossScaler(unittest.TestCase):
    def step(self, scaler, opt, p, value):
        from shardfuzz_worker.targets.torch_training import scaled_step

        opt.zero_grad()
        scaler.scale((p * value).sum().float()).backward()
        scaler.unscale_(opt)
        grad = p.grad.clone()
        return scaled_step(scaler, opt), grad

    def test_float16_gradients_are_unscaled_and_an_overflow_skips_and_halves(self):
        import torch
        from shardfuzz_worker.targets.torch_training import loss_scaler

        p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
        opt = torch.optim.SGD([p], lr=0.5)
        scaler = loss_scaler({"loss_scale": 1024.0})
        skipped, grad = self.step(scaler, opt, p, 2.0)
        self.assertFalse(skipped)
        self.assertEqual(grad.tolist(), [2.0, 2.0, 2.0])
        self.assertEqual(p.tolist(), [0.0, 0.0, 0.0])
        skipped, _ = self.step(scaler, opt, p, 1000.0)  # 1000 x 1024 > 65504: inf in float16
        self.assertTrue(skipped)
        self.assertEqual(scaler.get_scale(), 512.0)
        self.assertEqual(p.tolist(), [0.0, 0.0, 0.0])
        self.assertIsNone(loss_scaler({}))

    def test_ranks_that_skip_different_steps_diverge(self):
        from shardfuzz_worker.targets.torch_training import skipped_steps_stats

        self.assertEqual(skipped_steps_stats([{"skipped": [True, False]}] * 2), ({"skipped_steps": [True, False]}, None))
        self.assertEqual(skipped_steps_stats([{"skipped": None}, {"skipped": None}]), ({}, None))
        stats, why = skipped_steps_stats([{"skipped": [False, True]}, {"skipped": [False, False]}])
        self.assertEqual(stats, {})
        self.assertIn("rank 0 [False, True], rank 1 [False, False]", why)


if __name__ == "__main__":
    unittest.main()
