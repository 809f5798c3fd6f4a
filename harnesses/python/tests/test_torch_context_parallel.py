"""torch-fsdp2's context parallelism (torch's ring attention): the CPU kernels given to the CUDA flash-attention ops
compute the model's own attention and its gradients, what it refuses, the features it reports (the runs themselves
are in tests/python_targets.rs)."""

import importlib.util
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "python-torch-cp")
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def case(name, **parallel):
    with open(os.path.join(CASES, name)) as f:
        c = json.load(f)
    c["parallel"].update(parallel)
    return c


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class TorchContextParallelTest(unittest.TestCase):
    def test_cpu_flash_kernels_compute_the_models_attention_and_its_gradients(self):
        import torch

        from shardfuzz_worker.targets.torch_context_parallel import install_cpu_flash_kernels, ring_attention
        from shardfuzz_worker.targets.torch_model import causal_attention

        install_cpu_flash_kernels()
        torch.manual_seed(0)
        q = torch.randn(2, 4, 6, 3, dtype=torch.float32, requires_grad=True)
        k, v = (torch.randn(2, 2, 6, 3, dtype=torch.float32, requires_grad=True) for _ in range(2))  # GQA: 2 kv heads
        w = torch.randn(2, 4, 6, 3)
        out = ring_attention(q, k, v)  # outside the context: the flash op on one device
        ref = causal_attention(q, k, v)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        got = torch.autograd.grad((out * w).sum(), (q, k, v))
        want = torch.autograd.grad((ref * w).sum(), (q, k, v))
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)

    def test_blockwise_baseline_is_the_models_attention_up_to_float32_merges(self):
        import torch

        from shardfuzz_worker.targets.torch_context_parallel import blockwise_attention
        from shardfuzz_worker.targets.torch_model import causal_attention

        torch.manual_seed(0)
        q = torch.randn(2, 4, 12, 3, dtype=torch.float64)
        k, v = (torch.randn(2, 2, 12, 3, dtype=torch.float64) for _ in range(2))
        w = torch.randn(2, 4, 12, 3, dtype=torch.float64)
        for parts in (1, 2, 3, 4):
            a = [t.clone().requires_grad_() for t in (q, k, v)]
            b = [t.clone().requires_grad_() for t in (q, k, v)]
            out, ref = blockwise_attention(*a, parts), causal_attention(*b)
            torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # (torch's merge runs in float32)
            (out * w).sum().backward()
            (ref * w).sum().backward()
            for x, y in zip(a, b):
                torch.testing.assert_close(x.grad, y.grad, rtol=1e-6, atol=1e-6, msg=f"{parts} blocks")

    def test_refusals(self):
        from shardfuzz_worker.targets.torch_fsdp2 import TARGET

        self.assertIn("padded to a multiple of cp", TARGET.unsupported(case("cp2-uneven-sequence-unsupported.json")))
        self.assertIn("no float64", TARGET.unsupported(case("cp2-f64-unsupported.json")))
        self.assertIn("no tp, pp or MoE", TARGET.unsupported(case("cp2-zero3-load-balanced-f32.json", tp=2)))
        self.assertIn("no HSDP", TARGET.unsupported(case("cp2-dp2-zero2-bf16.json", zero_shard_group=1)))
        self.assertIsNone(TARGET.unsupported(case("cp3-gqa-accumulate-clip-f32.json")))

    def test_features_say_the_order_rotation_and_gqa(self):
        from shardfuzz_worker.targets.torch_context_parallel import features

        self.assertEqual(features("s", case("cp3-gqa-accumulate-clip-f32.json")),
                         ["s:cp3", "s:cp:load-balanced", "s:cp:rotate-allgather", "s:cp:gqa"])
        self.assertEqual(features("s", case("cp2-in-order-all-to-all-f32.json")),
                         ["s:cp2", "s:cp:in-order", "s:cp:rotate-alltoall"])
        self.assertEqual(features("s", case("cp2-dp2-zero2-bf16.json", cp=1)), [])


if __name__ == "__main__":
    unittest.main()
