"""Release differences of torch in one place (targets/torch_release.py): before torch 2.5, DTensor's public names live
in the private `torch.distributed._tensor`; `public_dtensor` makes them importable from `torch.distributed.tensor`
there, and leaves a release that has them alone; `refuses_kept_partials` tells a release whose `DTensor.redistribute`
refuses a Partial the tensor already has. A mocked torch 2.4 layout stands in for the release (run for real by
hand: README "Older torch releases"); `clips_sparse_gradients` tells a release whose `clip_grad_norm_` refuses a
sparse gradient, which torch-ddp then refuses to clip.

    cd harnesses/python && ../../.venv/bin/python -m unittest tests.test_torch_release
"""

import importlib.util
import json
import os
import sys
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.targets import torch_release  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def torch_2_4_modules():
    """torch.distributed.tensor holding only `parallel`, DTensor under torch.distributed._tensor (as torch 2.4)."""
    public = types.ModuleType("torch.distributed.tensor")
    private = types.ModuleType("torch.distributed._tensor")
    private.placement_types = types.ModuleType("torch.distributed._tensor.placement_types")
    for name in torch_release.DTENSOR_NAMES:
        setattr(private, name, type(name, (), {}))
    distributed = types.ModuleType("torch.distributed")
    distributed.tensor, distributed._tensor = public, private
    torch = types.ModuleType("torch")
    torch.distributed = distributed
    return {"torch": torch, "torch.distributed": distributed, "torch.distributed.tensor": public,
            "torch.distributed._tensor": private}


class OlderTorch(unittest.TestCase):
    def test_dtensor_names_become_public_on_torch_2_4(self):
        modules = torch_2_4_modules()
        with mock.patch.dict(sys.modules, modules):
            sys.modules.pop("torch.distributed.tensor.placement_types", None)  # (restored on leaving)
            self.assertTrue(torch_release.public_dtensor())
            from torch.distributed.tensor import DTensor, Partial, Shard  # noqa: F401 - the targets' import

            private = modules["torch.distributed._tensor"]
            self.assertIs(DTensor, private.DTensor)
            self.assertIs(sys.modules["torch.distributed.tensor.placement_types"], private.placement_types)
            self.assertFalse(torch_release.public_dtensor(), "a second call changes nothing")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class InstalledTorch(unittest.TestCase):
    def test_a_release_with_public_dtensor_is_left_alone(self):
        import torch.distributed.tensor as public

        before = public.DTensor
        self.assertFalse(torch_release.public_dtensor())
        self.assertIs(public.DTensor, before)

    def test_the_installed_release_takes_a_partial_kept_in_place(self):
        # torch 2.15 (.venv) refuses only a change to a Partial; 2.4.1 and 2.5.1 any Partial (checked by hand).
        import torch

        torch_release.public_dtensor()
        if torch.__version__.startswith(("2.4.", "2.5.")):
            self.assertTrue(torch_release.refuses_kept_partials())
        else:
            self.assertFalse(torch_release.refuses_kept_partials())


class SparseClipping(unittest.TestCase):
    CASE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "python-sparse-embedding",
                        "dp2-sparse-embedding-clip-f32.json")

    def test_the_installed_release_clips_a_sparse_gradient(self):
        # torch 2.15 (.venv) clips one; 2.4.1 and 2.5.1 raise on one device (checked by hand: README, campaign 219).
        import torch

        older = torch.__version__.startswith(("2.4.", "2.5."))
        self.assertEqual(torch_release.clips_sparse_gradients(), not older)

    def test_ddp_refuses_clipping_sparse_gradients_only_where_torch_cannot(self):
        from shardfuzz_worker.targets import torch_ddp

        with open(self.CASE) as f:
            case = json.load(f)
        with mock.patch.object(torch_ddp, "clips_sparse_gradients", return_value=False):
            self.assertIn("clip_grad_norm_ takes no sparse gradient", torch_ddp.TorchDdp().unsupported(case))
        with mock.patch.object(torch_ddp, "clips_sparse_gradients", return_value=True):
            self.assertIsNone(torch_ddp.TorchDdp().unsupported(case))
