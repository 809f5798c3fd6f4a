"""The case model's shared blocks (targets/torch_model.py, `model.layer_passes`): the stack runs `passes` times
through the same modules, so it computes what a model with `passes` independent copies of the blocks computes
when the copies hold the same values, and each block's gradient is the sum of its copies' gradients (with and
without activation checkpointing)."""

import copy
import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.targets.torch_model import Model, model_defaults  # noqa: E402

CASE_MODEL = {"vocab": 11, "hidden": 8, "ffn": 12, "heads": 2, "kv_heads": 1, "seq": 5, "batch": 3,
              "layers": ["attention", "mlp"]}


def ids():
    return torch.randint(0, CASE_MODEL["vocab"], (CASE_MODEL["batch"], CASE_MODEL["seq"]),
                         generator=torch.Generator().manual_seed(1))


def shared(passes, recompute=None):
    torch.manual_seed(0)
    model = Model(model_defaults({"model": dict(CASE_MODEL, layer_passes=passes, activation_checkpointing=recompute)}))
    return model.double()


class LayerPassesTest(unittest.TestCase):
    def test_shared_blocks_compute_the_unrolled_model_and_sum_its_gradients(self):
        passes, blocks = 3, len(CASE_MODEL["layers"])
        unrolled = shared(1)
        unrolled.layers = torch.nn.ModuleList(copy.deepcopy(b) for _ in range(passes) for b in unrolled.layers)
        out_unrolled = unrolled(ids())
        out_unrolled.square().mean().backward()
        for recompute in (None, "reentrant", "non_reentrant"):
            model = shared(passes, recompute)
            calls = []
            for block in model.layers:
                block.register_forward_pre_hook(lambda *_: calls.append(1))
            out = model(ids())
            torch.testing.assert_close(out, out_unrolled, rtol=1e-12, atol=1e-12)
            out.square().mean().backward()
            self.assertEqual(len(calls), passes * blocks * (2 if recompute else 1), f"{recompute}: forward calls")
            for name, p in model.named_parameters():
                if name.startswith("layers."):
                    i, rest = name.split(".", 2)[1:]
                    copies = [dict(unrolled.named_parameters())[f"layers.{k * blocks + int(i)}.{rest}"].grad for k in range(passes)]
                    expected = sum(copies)
                else:
                    expected = dict(unrolled.named_parameters())[name].grad
                torch.testing.assert_close(p.grad, expected, rtol=1e-12, atol=1e-12, msg=f"{recompute}: {name}")

    def test_one_pass_is_the_default(self):
        torch.manual_seed(0)
        default = Model(model_defaults({"model": CASE_MODEL})).double()
        torch.testing.assert_close(shared(1)(ids()), default(ids()), rtol=0, atol=0)
        self.assertFalse(torch.equal(shared(2)(ids()), default(ids())), "a second pass changes the output")


if __name__ == "__main__":
    unittest.main()
