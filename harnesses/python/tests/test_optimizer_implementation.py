"""The optimizer implementation (`train.optimizer.implementation`): torch's for-loop, foreach and fused optimizers
as the case names them, foreach clipping with the foreach optimizer, and the refusals that keep the reference's
float32 update arithmetic the one compared against."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from shardfuzz_worker.targets.base import HarnessError, optimizer_features  # noqa: E402
from shardfuzz_worker.targets.torch_model import foreach_clip, optimizer_parts, unsupported_model  # noqa: E402
from shardfuzz_worker.targets.torch_training import baseline_optimizer  # noqa: E402


def case(kind="adam", implementation=None, dtype="f32", master=None):
    o = {"kind": kind, "lr": 0.01}
    if implementation:
        o["implementation"] = implementation
    train = {"steps": 1, "optimizer": o, "dtype": dtype}
    if master:
        train["master_dtype"] = master
    return {"model": {"vocab": 5, "hidden": 4, "ffn": 4, "heads": 1, "kv_heads": 1, "seq": 2, "batch": 2,
                      "layers": ["mlp"]},
            "parallel": {"dp": 1}, "train": train, "data": {"seed": 1}}


def params(dtype=torch.float32):
    return [torch.nn.Parameter(torch.ones(3, 2, dtype=dtype)), torch.nn.Parameter(torch.ones(2, dtype=dtype))]


class OptimizerImplementationTest(unittest.TestCase):
    def test_each_implementation_reaches_torch_as_its_keyword(self):
        for implementation, want in (("for_loop", {"foreach": False}), ("foreach", {"foreach": True}),
                                     ("fused", {"fused": True})):
            for kind in ("adam", "adamw", "sgd"):
                _, _, kw = optimizer_parts(case(kind, implementation), params())
                self.assertEqual({k: kw[k] for k in want}, want, (kind, implementation))
                self.assertNotIn("fused" if "foreach" in want else "foreach", kw, (kind, implementation))
        # The default: the for-loop in full precision, the fused kernel over low-precision parameters (Adam).
        self.assertEqual(optimizer_parts(case(), params())[2]["foreach"], False)
        self.assertEqual(optimizer_parts(case(dtype="bf16"), params(torch.bfloat16))[2]["fused"], True)
        self.assertEqual(optimizer_parts(case("sgd"), params(torch.bfloat16))[2]["foreach"], False)

    def test_the_foreach_optimizer_clips_through_foreach_and_says_so_in_its_features(self):
        self.assertTrue(foreach_clip(case(implementation="foreach")))
        self.assertFalse(foreach_clip(case(implementation="fused")) or foreach_clip(case()))
        self.assertEqual(optimizer_features("tp:tp2", case(implementation="fused")), ["tp:tp2:optimizer-fused"])
        self.assertEqual(optimizer_features("tp:tp2", case()), [])

    def test_an_adam_rounding_in_low_precision_is_refused_and_never_run(self):
        for implementation in ("for_loop", "foreach"):
            why = unsupported_model(case("adam", implementation, "bf16"))
            self.assertIn(f"a {implementation} Adam over bf16 parameters", why or "")
            # Held in a float32 master copy, the same update runs in float32: nothing to refuse.
            self.assertIsNone(unsupported_model(case("adam", implementation, "bf16", "f32"), master_weights=True))
            # A target that reached the optimizer anyway failed our own check: a harness error, never a verdict.
            with self.assertRaises(HarnessError):
                optimizer_parts(case("adam", implementation, "bf16"), params(torch.bfloat16))
        self.assertIsNone(unsupported_model(case("adam", "fused", "bf16")))
        sparse = case("sgd", "fused")
        sparse["model"]["sparse_embedding"] = True
        self.assertIn("fused optimizers take no sparse gradient", unsupported_model(sparse) or "")
        self.assertIsNone(unsupported_model(case("sgd", "foreach", "bf16")))

    def test_the_targets_that_choose_the_implementation_are_the_torch_ones(self):
        from shardfuzz_worker.targets import REGISTRY

        here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shardfuzz_worker", "targets")
        for name, module in REGISTRY.items():
            with open(os.path.join(here, module + ".py")) as f:  # (not imported: some need other environments)
                chooses = "\n    optimizer_implementations = True\n" in f.read()
            self.assertEqual(chooses, name in {"torch-tp", "torch-ddp", "torch-fsdp2", "torch-fsdp1", "torch-pp"}, name)

    def test_a_target_that_does_not_choose_the_implementation_runs_the_case_without_it(self):
        from shardfuzz_worker.targets.base import as_offered

        class Plain:
            optimizer_implementations = False

        class Torch:
            optimizer_implementations = True

        c = case("adam", "foreach", "bf16")
        self.assertNotIn("implementation", as_offered(Plain(), c)["train"]["optimizer"])
        self.assertEqual(c["train"]["optimizer"]["implementation"], "foreach", "the case itself is unchanged")
        self.assertIs(as_offered(Torch(), c), c)
        plain = case()
        self.assertIs(as_offered(Plain(), plain), plain)

    def test_the_single_device_baseline_in_low_precision_takes_the_fused_update(self):
        low = case("adamw", "foreach", "bf16", "f32")
        self.assertEqual(baseline_optimizer(low)["train"]["optimizer"]["implementation"], "fused")
        self.assertEqual(low["train"]["optimizer"]["implementation"], "foreach", "the case itself is unchanged")
        for kept in (case("adamw", "foreach"), case("sgd", "foreach", "bf16")):
            self.assertIs(baseline_optimizer(kept), kept)


if __name__ == "__main__":
    unittest.main()
