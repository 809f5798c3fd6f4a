"""Label smoothing (`train.label_smoothing`): only targets whose loss smooths the labels run such cases, and
megatron's vocab-parallel loss gets torch's ε as its own α = ε (V - 1) / V."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.targets.base import label_smoothing, unsupported_label_smoothing  # noqa: E402

SMOOTHING = {"torch-tp", "torch-ddp", "torch-fsdp2", "torch-fsdp1", "torch-pp", "deepspeed-zero", "deepspeed-pp", "megatron-tp", "megatron-ddp", "colossalai-zero"}


def case(eps=None):
    train = {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32"}
    if eps is not None:
        train["label_smoothing"] = eps
    return {"model": {"vocab": 4}, "parallel": {"dp": 1}, "train": train}


class LabelSmoothingTest(unittest.TestCase):
    def test_only_targets_that_smooth_run_a_smoothed_case(self):
        from shardfuzz_worker.targets import REGISTRY

        here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shardfuzz_worker", "targets")
        for name, module in REGISTRY.items():
            with open(os.path.join(here, module + ".py")) as f:  # (not imported: some need the colossalai env)
                smooths = "\n    smooths_labels = True\n" in f.read()
            self.assertEqual(smooths, name in SMOOTHING, name)

    def test_a_target_that_does_not_smooth_refuses_a_smoothed_case(self):
        class Plain:
            name, smooths_labels = "plain", False

        class Smoothing:
            name, smooths_labels = "smoothing", True

        self.assertIsNone(unsupported_label_smoothing(Plain(), case()))
        self.assertIn("plain has no label smoothing", unsupported_label_smoothing(Plain(), case(0.1)))
        self.assertIsNone(unsupported_label_smoothing(Smoothing(), case(0.1)))

    def test_absent_is_zero(self):
        self.assertEqual(label_smoothing(case()), 0.0)
        self.assertEqual(label_smoothing(case(0.2)), 0.2)

    def test_megatrons_alpha_gives_torchs_target_distribution(self):
        import torch
        import torch.nn.functional as F

        torch.manual_seed(0)
        logits, target, eps, v = torch.randn(5, 7, dtype=torch.float64), torch.tensor([0, 6, 3, 3, 1]), 0.3, 7
        alpha = eps * (v - 1) / v
        # Megatron (NeMo's definition): 1 - α on the target, α / (V - 1) on every other entry.
        dist = torch.full((5, v), alpha / (v - 1), dtype=torch.float64)
        dist[torch.arange(5), target] = 1 - alpha
        nemo = -(dist * F.log_softmax(logits, -1)).sum(-1)
        torch_loss = F.cross_entropy(logits, target, reduction="none", label_smoothing=eps)
        self.assertTrue(torch.allclose(nemo, torch_loss, atol=1e-12), (nemo, torch_loss))


if __name__ == "__main__":
    unittest.main()
