"""Clipping by another norm (`train.clip_norm_type`): only targets whose clipping takes torch's norm_type run such
cases, and they pass torch the case's norm."""

import math
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.targets.base import clip_norm, unsupported_clip_norm  # noqa: E402

NORM_TYPES = {"torch-tp", "torch-ddp", "torch-fsdp2", "torch-fsdp1", "torch-pp"}


def case(kind=None, clip=0.5):
    train = {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32"}
    if clip is not None:
        train["clip_grad_norm"] = clip
    if kind is not None:
        train["clip_norm_type"] = kind
    return {"model": {"vocab": 4}, "parallel": {"dp": 1}, "train": train}


class ClipNormTest(unittest.TestCase):
    def test_only_targets_whose_clipping_takes_a_norm_type_say_so(self):
        from shardfuzz_worker.targets import REGISTRY

        here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shardfuzz_worker", "targets")
        for name, module in REGISTRY.items():
            with open(os.path.join(here, module + ".py")) as f:  # (not imported: some need other environments)
                takes = '\n    clip_norms = ("l1", "l2", "inf")\n' in f.read()
            self.assertEqual(takes, name in NORM_TYPES, name)

    def test_a_target_clipping_the_l2_norm_only_refuses_another(self):
        class Plain:
            name, clip_norms = "plain", ("l2",)

        class Torch:
            name, clip_norms = "torch", ("l1", "l2", "inf")

        for kind in (None, "l2"):
            self.assertIsNone(unsupported_clip_norm(Plain(), case(kind)))
        self.assertIn("plain clips by the l2 norm only", unsupported_clip_norm(Plain(), case("inf")))
        self.assertIsNone(unsupported_clip_norm(Torch(), case("inf")))
        self.assertEqual([clip_norm(case(k)) for k in (None, "l1", "inf")], ["l2", "l1", "inf"])

    def test_torch_gets_the_case_norm_type(self):
        from shardfuzz_worker.targets.torch_model import clip_norm_type

        self.assertEqual([clip_norm_type(case(k)) for k in (None, "l1", "l2", "inf")], [2.0, 1.0, 2.0, math.inf])


if __name__ == "__main__":
    unittest.main()
