"""deepspeed-zero's tensor parallelism as DeepSpeed's AutoTP training: the engine configuration, the rank layout, what
it refuses and the features it reports (the runs themselves are in tests/python_targets.rs). Skipped where DeepSpeed
is not installed."""

import importlib.util
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "python-autotp")
HAVE_DEEPSPEED = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("deepspeed") is not None


def case(name, parallel=None, model=None):
    with open(os.path.join(CASES, name)) as f:
        c = json.load(f)
    c["parallel"].update(parallel or {})
    c["model"].update(model or {})
    return c


@unittest.skipUnless(HAVE_DEEPSPEED, "deepspeed is not installed in this environment")
class AutoTpTest(unittest.TestCase):
    def test_the_engine_gets_autotp_with_the_model_projections_and_no_global_batch(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        cfg = TARGET.config(case("dp2-tp2-zero3-hpz2-f32.json"), 4)
        tp = cfg["tensor_parallel"]
        self.assertEqual(tp["autotp_size"], 2)
        kinds = {s["partition_type"]: s["patterns"][0] for s in tp["partition_config"]["layer_specs"]}
        self.assertRegex("layers.0.attn.q.weight", kinds["column"])
        self.assertRegex("layers.1.mlp.down.bias", kinds["row"])
        self.assertNotRegex("layers.0.norm.weight", kinds["column"])
        self.assertNotIn("train_batch_size", cfg)  # (DeepSpeed checks it against different worlds at stages 0-2 and 3)
        self.assertNotIn("vocab_parallel_lm_head", tp)
        sharded = TARGET.config(case("tp2-zero0-one-kv-head-vocab-parallel-head-local-mean-f32.json"), 2)
        self.assertTrue(sharded["tensor_parallel"]["vocab_parallel_lm_head"])
        self.assertNotIn("tensor_parallel", TARGET.config(case("dp2-tp2-zero3-hpz2-f32.json", {"tp": 1, "dp": 4}), 4))

    def test_ranks_and_refusals(self):
        from shardfuzz_worker.targets.deepspeed_autotp import dp_index
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        c = case("dp2-tp2-zero3-hpz2-f32.json")
        self.assertEqual([dp_index(r, c) for r in range(4)], [0, 0, 1, 1])  # DeepSpeed's (dp, tp) mesh: tp inner
        self.assertIsNone(TARGET.unsupported(c))
        self.assertIsNone(TARGET.unsupported(case("dp2-tp2-zero3-hpz2-f32.json", model={"heads": 3, "kv_heads": 3, "hidden": 9})))
        self.assertIn("sequence parallelism", TARGET.unsupported(case("tp2-sequence-parallel-unsupported.json")))
        vocab = "tp2-zero0-one-kv-head-vocab-parallel-head-local-mean-f32.json"
        self.assertIn("lm_head", TARGET.unsupported(case(vocab, model={"tied_embeddings": True})))
        smoothed = case(vocab)
        smoothed["train"]["label_smoothing"] = 0.1
        self.assertIn("label smoothing", TARGET.unsupported(smoothed))

    def test_no_standalone_script_trains_without_autotp(self):
        from shardfuzz_worker.repro.common import ReproError
        from shardfuzz_worker.repro.deepspeed_zero import check

        with self.assertRaisesRegex(ReproError, "AutoTP is not carried"):
            check(case("dp2-tp2-zero3-hpz2-f32.json"))

    def test_features(self):
        from shardfuzz_worker.targets.deepspeed_autotp import features

        self.assertEqual(features("s", case("dp2-tp2-zero1-overlap-comm-uneven-ffn-uneven-heads-sgd-clip-bf16.json")),
                         ["s:autotp2", "s:autotp:uneven-shards", "s:autotp:uneven-heads",
                          "s:autotp:overlapped-input-grad-reduce"])
        self.assertEqual(features("s", case("tp2-zero0-one-kv-head-vocab-parallel-head-local-mean-f32.json")),
                         ["s:autotp2", "s:autotp:even-shards", "s:autotp:empty-head-shards",
                          "s:autotp:vocab-parallel-head-uneven"])
        self.assertEqual(features("s", case("dp2-tp2-zero3-hpz2-f32.json", {"tp": 1})), [])


if __name__ == "__main__":
    unittest.main()
