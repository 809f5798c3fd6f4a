"""deepspeed-zero's MoE blocks as DeepSpeed's AutoEP layers: the `expert_parallel` section, what is not expressed, the
module layout AutoEP finds, and the case layout of what it reports (the runs themselves are in
tests/python_targets.rs). Skipped where DeepSpeed is not installed."""

import importlib.util
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "python-autoep")
HAVE_DEEPSPEED = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("deepspeed") is not None


def case(name, parallel=None, model=None, moe=None, train=None):
    with open(os.path.join(CASES, name)) as f:
        c = json.load(f)
    c["parallel"].update(parallel or {})
    c["model"].update(model or {})
    c["model"]["moe"].update(moe or {})
    c["train"].update(train or {})
    return c


@unittest.skipUnless(HAVE_DEEPSPEED, "deepspeed is not installed in this environment")
class AutoEpTest(unittest.TestCase):
    def test_the_engine_gets_the_case_routing_as_custom_patterns(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        section = TARGET.config(case("tp2-ep2-shared-gated-clip-f32.json"), 2)["expert_parallel"]
        self.assertEqual((section["autoep_size"], section["top_k"], section["route_norm"]), (2, 2, True))
        self.assertEqual((section["score_func"], section["score_apply"]), ("softmax", "post"))
        self.assertEqual((section["shared_experts_pattern"], section["shared_experts_gate_pattern"]),
                         ("shared", "shared_gate"))
        plain = TARGET.config(case("dp2-ep2-top1-zero0-bf16.json"), 2)["expert_parallel"]
        self.assertFalse(plain["route_norm"])
        self.assertNotIn("shared_experts_pattern", plain)
        without = case("dp2-ep2-top1-zero0-bf16.json", parallel={"auto_ep": None})
        self.assertNotIn("expert_parallel", TARGET.config(without, 2))

    def test_grouped_mm_only_where_torch_accepts_the_strides(self):
        from shardfuzz_worker.targets.deepspeed_autoep import grouped_mm

        self.assertTrue(grouped_mm(case("dp2-ep2-top1-zero0-bf16.json")))  # hidden 8, ffn 16 in bf16: 16 and 32 bytes
        self.assertFalse(grouped_mm(case("dp2-ep2-top1-zero0-bf16.json", model={"ffn": 12})))  # 24 bytes
        self.assertTrue(grouped_mm(case("dp2-ep2-top1-zero0-bf16.json", model={"ffn": 12}, train={"dtype": "f32"})))

    def test_what_autoep_cannot_express(self):
        from shardfuzz_worker.targets.deepspeed_autoep import unsupported_autoep

        base = "dp2-ep2-top1-zero0-bf16.json"
        self.assertIsNone(unsupported_autoep(case(base)))
        self.assertIn("gated", unsupported_autoep(case(base, model={"activation": "gelu"})))
        self.assertIn("biases", unsupported_autoep(case(base, model={"bias": True})))
        self.assertIn("dropless", unsupported_autoep(case(base, moe={"pad_to_capacity": True})))
        self.assertIn("auxiliary", unsupported_autoep(case(base, moe={"aux_loss": 0.01})))
        self.assertIn("ep must divide dp", unsupported_autoep(case(base, parallel={"dp": 3})))
        self.assertIsNone(unsupported_autoep(case(base, parallel={"auto_ep": None, "dp": 3})))  # the MoE layer's rules

    def test_the_model_meets_autoep_with_transformers_layout_and_reports_the_case_layout(self):
        import torch

        from shardfuzz_worker.targets.deepspeed_autoep import SourceMoe, to_case_layout
        from shardfuzz_worker.targets.torch_model import Mlp
        from shardfuzz_worker.targets.torch_moe import Moe

        m = case("tp2-ep2-shared-gated-clip-f32.json")["model"]
        moe = Moe(m, Mlp)
        torch.nn.init.normal_(moe.gate.weight)
        source = SourceMoe(moe)
        self.assertEqual(tuple(source.experts.gate_proj.shape), (4, m["ffn"], m["hidden"]))  # [experts, out, in]
        self.assertTrue(torch.equal(source.experts.gate_proj[1], moe.gate.weight[1].t()))
        # AutoEP's names and layouts back to the case's (ep 1: no gather).
        w1 = source.experts.gate_proj.detach().numpy()
        out = to_case_layout({"layers.0.moe.experts.w1": w1, "layers.0.moe.router.gate.weight": moe.router.weight
                              .detach().numpy(), "layers.0.norm.weight": 1}, case("dp2-ep2-top1-zero0-bf16.json",
                                                                                 parallel={"ep": 1}))
        self.assertTrue((out["layers.0.moe.gate.weight"] == moe.gate.weight.detach().numpy()).all())
        self.assertEqual(out["layers.0.moe.router.weight"].shape, (m["hidden"], 4))
        self.assertEqual(out["layers.0.norm.weight"], 1)


if __name__ == "__main__":
    unittest.main()
