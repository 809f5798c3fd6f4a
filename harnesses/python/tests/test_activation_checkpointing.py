"""The case model's activation checkpointing (targets/torch_model.py, `model.activation_checkpointing`): every
block really runs again in the backward, and the gradients are those of the plain model, a frozen embedding
included (a re-entrant checkpoint must not lose the blocks' gradients)."""

import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.targets.torch_model import Model, model_defaults  # noqa: E402

CASE_MODEL = {"vocab": 11, "hidden": 8, "ffn": 12, "heads": 2, "kv_heads": 1, "seq": 5, "batch": 3,
              "layers": ["attention", "mlp", "attention"]}


def gradients(recompute, frozen_embedding=False):
    """(block forward calls, {name: gradient}) of one forward and backward in f64."""
    torch.manual_seed(0)
    m = model_defaults({"model": dict(CASE_MODEL, activation_checkpointing=recompute)})
    model = Model(m).double()
    if frozen_embedding:
        model.embed.weight.requires_grad_(False)
    calls = []
    for block in model.layers:
        block.register_forward_pre_hook(lambda *_: calls.append(1))  # (a pre-hook: non-re-entrant recomputation stops early)
    ids = torch.randint(0, CASE_MODEL["vocab"], (CASE_MODEL["batch"], CASE_MODEL["seq"]), generator=torch.Generator().manual_seed(1))
    model(ids).square().mean().backward()
    return len(calls), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


class ActivationCheckpointingTest(unittest.TestCase):
    def test_every_block_recomputes_and_the_gradients_are_the_plain_models(self):
        blocks = len(CASE_MODEL["layers"])
        for frozen in (False, True):
            plain_calls, plain = gradients(None, frozen)
            self.assertEqual(plain_calls, blocks)
            for recompute in ("reentrant", "non_reentrant"):
                calls, grads = gradients(recompute, frozen)
                self.assertEqual(calls, 2 * blocks, f"{recompute}: each block once more in the backward")
                self.assertEqual(grads.keys(), plain.keys())
                for name, g in grads.items():
                    self.assertIsNotNone(g, f"{recompute}, frozen embedding {frozen}: {name} got no gradient")
                    torch.testing.assert_close(g, plain[name], rtol=1e-12, atol=1e-12, msg=f"{recompute}: {name}")


if __name__ == "__main__":
    unittest.main()
