"""The Colossal-AI targets' own pieces, in the colossalai environment (.venv-colossalai; skipped elsewhere):
the gloo stand-ins for collectives gloo lacks against their definitions, the refusal table against the
installed sources, the known fixes, and what each target refuses."""

import importlib.util
import json
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_COLOSSALAI = importlib.util.find_spec("colossalai") is not None
CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "corpus")


def _collectives(rank, world, port, out):
    import torch
    import torch.distributed as dist

    from shardfuzz_worker.targets.colossalai_common import _all_to_all_list, _reduce_scatter_list

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    chunks = [torch.arange(6, dtype=torch.float64).view(2, 3) * (rank + 1) + 10 * i for i in range(world)]
    got = torch.empty(2, 3, dtype=torch.float64)
    _reduce_scatter_list(got, chunks)
    want = sum(torch.arange(6, dtype=torch.float64).view(2, 3) * (r + 1) + 10 * rank for r in range(world))
    sizes = [i + 1 for i in range(world)]  # rank r sends i + 1 values to rank i
    sent = [torch.full((sizes[i],), float(100 * rank + i)) for i in range(world)]
    received = [torch.empty(rank + 1) for _ in range(world)]
    _all_to_all_list(received, sent)
    ok_a2a = all(torch.equal(received[r], torch.full((rank + 1,), float(100 * r + rank))) for r in range(world))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    gathered = torch.empty(world, 2)  # NCCL's form: world x the input's elements, any shape
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
    ok_gather = torch.equal(gathered, torch.arange(world, dtype=torch.float32)[:, None].expand(world, 2))
    out[rank] = (bool(torch.equal(got, want)), ok_a2a, bool(ok_gather))
    dist.destroy_process_group()


def random_case_inputs(m):
    """Random float64 initial parameters of the case model `m`, in the case's layout (linear weights [in, out])."""
    import torch

    from shardfuzz_worker.targets import torch_model

    torch.manual_seed(0)
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in torch_model.Model(m).named_parameters()}
    inputs = {n: torch.randn(s, dtype=torch.float64).numpy() for n, s in shapes.items()}
    for n in inputs:
        if torch_model.is_linear_weight(n):
            inputs[n] = inputs[n].T.copy()
    return inputs


def reference_model(m, inputs):
    """The torch model of the case in float64 with the parameters `inputs` (the logits a family must reproduce)."""
    import torch

    from shardfuzz_worker.targets import torch_model

    reference = torch_model.Model(m).to(torch.float64)
    torch_model.load_case_params(reference, inputs, torch.float64)
    return reference


def case(name, **parallel):
    with open(os.path.join(CORPUS, name)) as f:
        c = json.load(f)
    c["parallel"].update(parallel)
    return c


@unittest.skipUnless(HAVE_COLOSSALAI, "colossalai is not installed in this environment")
class ColossalAiTest(unittest.TestCase):
    def assert_reports_every_case_tensor_exactly(self, model, m, inputs):
        """The family's model reports every case tensor, each exactly as the case's `inputs` gave it."""
        import torch

        from shardfuzz_worker.targets.colossalai_family import case_tensors

        reported = {n: t for name, p in model.named_parameters() for n, t in case_tensors(name, p.detach(), m)}
        self.assertEqual(sorted(reported), sorted(inputs))
        for n, t in reported.items():
            torch.testing.assert_close(t, torch.tensor(inputs[n]), rtol=0, atol=0, msg=n)

    def test_gloo_stand_ins_compute_what_the_collectives_define(self):
        import torch.multiprocessing as mp

        out = mp.Manager().dict()
        mp.spawn(_collectives, args=(3, 29581, out), nprocs=3)
        self.assertEqual(dict(out), {r: (True, True, True) for r in range(3)})

    def test_every_refusal_location_exists_in_the_installed_colossalai(self):
        from shardfuzz_worker.validation import FRAMEWORKS, VALIDATION

        root = os.path.dirname(importlib.util.find_spec("colossalai").origin)
        for target in ("colossalai-tp", "colossalai-zero", "colossalai-hybrid", "colossalai-moe"):
            self.assertIn("colossalai", FRAMEWORKS[target])
            for fragment, function, _ in VALIDATION[target]:
                path = os.path.join(os.path.dirname(root), fragment)
                self.assertTrue(os.path.isfile(path), fragment)
                if function:
                    with open(path, encoding="utf-8") as f:
                        self.assertIn(f"def {function}(", f.read(), f"{function} in {fragment}")

    def test_an_unknown_known_fix_is_our_error(self):
        from shardfuzz_worker import known_fixes

        os.environ[known_fixes.ENV] = "no-such-fix"
        try:
            with self.assertRaises(KeyError):
                known_fixes.apply("colossalai-tp")
        finally:
            del os.environ[known_fixes.ENV]

    def test_each_known_fix_names_a_target_and_patches_what_exists(self):
        from shardfuzz_worker import known_fixes
        from shardfuzz_worker.targets import REGISTRY

        for name, (targets, fix) in known_fixes.FIXES.items():
            for target in targets:
                self.assertIn(target, REGISTRY, name)
            self.assertIn("docs/findings/", fix.__doc__, f"{name}: its repro")
        from colossalai.shardformer.layer import _operation

        before = _operation._ring_as_gather
        known_fixes.FIXES["colossalai-ring-gather"][1]()
        self.assertIsNot(_operation._ring_as_gather, before)
        _operation._ring_as_gather = before

    def test_colossalai_tp_refuses_what_it_cannot_express(self):
        from shardfuzz_worker.targets.colossalai_tp import TARGET

        self.assertIsNone(TARGET.unsupported(case("tp2-sp-bf16-swiglu.json")))
        self.assertIsNone(TARGET.unsupported(case("tp2-sp-bf16-swiglu.json", sequence_parallel_mode="ring")))
        self.assertIn("all_to_all", TARGET.unsupported(case("tp2-sp-bf16-swiglu.json", sequence_parallel_mode="all_to_all")))
        self.assertIn("fp32", TARGET.unsupported(case("tp2-sp.json")))
        self.assertIn("heads divisible by tp", TARGET.unsupported(case("tp2-heads-not-divisible-rejected.json")))
        self.assertIn("tensor (and sequence) parallelism only", TARGET.unsupported(case("dp2-even-f32.json")))

    def test_colossalai_zero_refuses_what_it_cannot_express(self):
        from shardfuzz_worker.targets.colossalai_zero import TARGET

        self.assertIsNone(TARGET.unsupported(case("zero2-bf16.json")))
        self.assertIsNone(TARGET.unsupported(case("zero2-bf16.json", zero_offload=True)))
        self.assertIn("not 3", TARGET.unsupported(case("zero2-bf16.json", zero_stage=3)))
        self.assertIn("not 0", TARGET.unsupported(case("zero2-bf16.json", zero_stage=0)))
        self.assertIn("f64", TARGET.unsupported(case("zero1-dp2.json")))

    def test_colossalai_zero_keeps_master_weights_unless_the_case_keeps_parameters_in_the_compute_dtype(self):
        from shardfuzz_worker.repro.colossalai_zero import plugin_arguments as zero
        from shardfuzz_worker.targets.colossalai_zero import TARGET

        c = case("zero2-bf16.json")
        self.assertTrue(zero(c)["master_weights"], "absent: the plugin's own fp32 masters")
        c["train"]["master_dtype"] = "f32"
        self.assertTrue(zero(c)["master_weights"])
        c["train"]["master_dtype"] = c["train"]["dtype"]
        self.assertFalse(zero(c)["master_weights"], "parameters in the compute dtype: no master copy")
        self.assertIsNone(TARGET.unsupported(c))
        c["train"]["master_dtype"] = "f64"
        self.assertIn("fp32 master weights or none", TARGET.unsupported(c))

    def test_a_hybrid_case_starts_from_a_fresh_randomizer_index(self):
        from unittest import mock

        from colossalai.shardformer.layer.utils import Randomizer

        from shardfuzz_worker.targets.colossalai_hybrid import TARGET

        Randomizer._INDEX = 5  # what an earlier case refused part-way on this rank may leave
        seen = []
        with mock.patch.object(TARGET, "plugin", side_effect=lambda case: seen.append(Randomizer.index()) or 1 / 0):
            with self.assertRaises(ZeroDivisionError):
                TARGET.run_rank(0, 2, case("llama-dp2-tp2-zero1-sp-bf16.json"), {})
        self.assertEqual(seen, [0], "the index is reset before the plugin shards the model")

    def test_the_vocabulary_is_padded_to_the_cases_divisor(self):
        from shardfuzz_worker.repro.colossalai_hybrid import plugin_arguments as hybrid
        from shardfuzz_worker.targets.base import vocab_padding_feature

        self.assertNotIn("make_vocab_size_divisible_by", hybrid(case("llama-dp2-tp2-zero1-sp-bf16.json")))
        h = hybrid(case("llama-dp2-tp2-zero1-sp-bf16.json", vocab_divisible_by=3))
        self.assertEqual(h["make_vocab_size_divisible_by"], 3)
        self.assertEqual([vocab_padding_feature("x", 13, d, 2) for d in (1, 3, 13)],
                         ["x:vocab-padded", "x:vocab-padded", "x:vocab-padding-only-shards"])
        self.assertEqual(vocab_padding_feature("x", 12, 1, 4), "x:vocab-unpadded")

    def test_colossalai_zeros_shard_group_is_the_inner_axis_of_its_extra_dp_mesh(self):
        from shardfuzz_worker.repro.colossalai_zero import plugin_arguments as zero

        self.assertEqual(zero(case("zero2-bf16.json", dp=4))["extra_dp_size"], 1)
        self.assertEqual(zero(case("zero2-bf16.json", dp=4, zero_shard_group=2))["extra_dp_size"], 2)
        self.assertEqual(zero(case("zero2-bf16.json", dp=4, zero_shard_group=1))["extra_dp_size"], 4)

    def test_colossalai_hybrid_refuses_what_a_llama_or_the_plugin_cannot_express(self):
        from shardfuzz_worker.targets.colossalai_hybrid import TARGET

        self.assertIsNone(TARGET.unsupported(case("llama-pp2-tp2-1f1b-f32.json")))
        self.assertIsNone(TARGET.unsupported(case("llama-dp2-tp2-zero1-sp-bf16.json", sequence_parallel_mode="all_to_all")))
        self.assertIn("GPipe", TARGET.unsupported(case("llama-pp2-tp2-1f1b-f32.json", pipeline_schedule="gpipe")))
        self.assertIsNone(TARGET.unsupported(case("llama-pp2-interleaved2-bf16.json")))
        self.assertIn("RMSNorm", TARGET.unsupported(case("tp2-sp-bf16-swiglu.json")))
        self.assertIn("stages 0-2", TARGET.unsupported(case("llama-dp2-tp2-zero1-sp-bf16.json", zero_stage=3)))

    def test_the_plugins_take_the_cases_reduction_bucket_and_overlap(self):
        from shardfuzz_worker.repro.colossalai_hybrid import plugin_arguments as hybrid
        from shardfuzz_worker.repro.colossalai_zero import plugin_arguments as zero

        plain = zero(case("zero2-bf16.json"))
        self.assertEqual((plain["reduce_bucket_size_in_m"] * 2**20, plain["overlap_communication"]), (2**20, False))
        z = zero(case("zero2-bf16.json", reduce_bucket=7, overlap_comm=True))
        self.assertEqual((z["reduce_bucket_size_in_m"] * 2**20, z["overlap_communication"]), (7, True))
        h = hybrid(case("llama-dp2-tp2-zero1-sp-bf16.json", reduce_bucket=96, overlap_comm=True))
        self.assertEqual((h["zero_bucket_size_in_m"] * 2**20, h["ddp_bucket_cap_mb"] * 2**20), (96, 96 * 2))
        self.assertTrue(h["overlap_communication"])
        self.assertNotIn("zero_bucket_size_in_m", hybrid(case("llama-dp2-tp2-zero1-sp-bf16.json")))

    def test_the_plugins_gather_updated_parameters_asynchronously_where_the_case_asks(self):
        from shardfuzz_worker.repro.colossalai_hybrid import plugin_arguments as hybrid
        from shardfuzz_worker.repro.colossalai_zero import plugin_arguments as zero

        self.assertFalse(zero(case("zero2-bf16.json"))["overlap_allgather"], "absent: gathered in the step")
        self.assertTrue(zero(case("zero2-bf16.json", overlap_param_gather=True))["overlap_allgather"])
        self.assertFalse(zero(case("zero2-bf16.json", overlap_param_gather=False))["overlap_allgather"])
        self.assertFalse(hybrid(case("llama-dp2-tp2-zero1-sp-bf16.json"))["overlap_allgather"])
        self.assertTrue(hybrid(case("llama-dp2-tp2-zero1-sp-bf16.json", overlap_param_gather=True))["overlap_allgather"])

    def test_the_case_llama_loads_every_case_parameter_in_place(self):
        import torch

        from shardfuzz_worker.targets.colossalai_llama import build, case_name, config, to_case
        from shardfuzz_worker.targets.colossalai_release import llama_model

        m = dict(case("llama-pp2-tp2-1f1b-f32.json")["model"])
        shapes = llama_model(**config(m, torch.float64)).named_parameters()
        # Distinct values per parameter and element, in the case's layout.
        inputs = {case_name(n): to_case(case_name(n), torch.arange(p.numel(), dtype=torch.float64).view(p.shape) + k).numpy()
                  for k, (n, p) in enumerate(shapes)}
        self.assertIn("layers.2.attn.q.weight", inputs)
        self.assertIn("layers.3.mlp.gate.bias", inputs)
        self.assertEqual(len(inputs), 3 + 2 * (2 + 8 + 6))  # embed, head, final norm; per pair: 2 norms, attn, mlp
        model = build(m, inputs, torch.float64)
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(to_case(case_name(n), p.detach()), torch.tensor(inputs[case_name(n)])), n)
        ids = torch.tensor([[1, 2, 3]])
        rotations = [mod for name, mod in model.named_modules() if name.endswith("rotary_emb")]
        self.assertTrue(rotations, "the release's rotary embedding found")
        for rotation in rotations:
            cos, sin = rotation(torch.zeros(1, 3, m["hidden"]), torch.arange(3)[None])
            self.assertTrue(bool((cos == 1).all() and (sin == 0).all()), "no positional encoding")
        self.assertEqual(model(input_ids=ids).logits.shape, (1, 3, m["vocab"]))

    def test_a_mistral_and_a_qwen2_compute_the_case_llama_s_logits(self):
        import torch

        from shardfuzz_worker.targets.colossalai_family import case_tensors, expressible
        from shardfuzz_worker.targets.colossalai_llama import build, case_name, config, to_case
        from shardfuzz_worker.targets.colossalai_release import llama_model

        m = dict(case("llama-pp2-tp2-1f1b-f32.json")["model"], bias=False)
        torch.manual_seed(0)
        inputs = {case_name(n): to_case(case_name(n), torch.randn(p.shape, dtype=torch.float64)).numpy()
                  for n, p in llama_model(**config(m, torch.float64)).named_parameters()}
        ids = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
        llama = build(m, inputs, torch.float64)(input_ids=ids).logits
        for arch, extra in (("mistral", 0), ("qwen2", 3 * 2)):
            other = dict(m, hf_model=arch)
            self.assertIsNone(expressible(other))
            model = build(other, inputs, torch.float64)
            self.assertIn(arch, type(model).__name__.lower())
            named = list(model.named_parameters())
            reported = [n for name, p in named for n, _ in case_tensors(name, p.detach(), other)]
            self.assertEqual(sorted(reported), sorted(inputs), arch)
            self.assertEqual(len(named) - len(reported), extra, "Qwen2's q/k/v biases are the extra parameters")
            self.assertTrue(all(not p.requires_grad and not p.any() for n, p in named if n.endswith("_proj.bias")))
            torch.testing.assert_close(model(input_ids=ids).logits, llama, rtol=0, atol=1e-12, msg=arch)
        self.assertIn("no biases", expressible(dict(m, bias=True, hf_model="qwen2")))
        self.assertIsNotNone(expressible(dict(m, norm="layernorm", activation="gelu", hf_model="mistral")),
                             "a named class is built by the Llama family alone, never the GPT-2's")

    def test_an_opt_computes_the_case_gpt2_s_logits(self):
        from unittest import mock

        import torch

        from shardfuzz_worker.targets import colossalai_gpt2
        from shardfuzz_worker.targets.colossalai_family import build, case_tensors, expressible

        with open(os.path.join(CORPUS, "..", "tests", "python-gpt2", "gpt2-tp2-f32.json")) as f:
            m = json.load(f)["model"]
        torch.manual_seed(0)
        from transformers import GPT2LMHeadModel

        inputs = {n: t.numpy() for name, p in GPT2LMHeadModel(colossalai_gpt2.config(m, torch.float64)).named_parameters()
                  for n, t in colossalai_gpt2.case_tensors(name, torch.randn(p.shape, dtype=torch.float64))}
        opt = dict(m, hf_model="opt")
        self.assertIsNone(expressible(opt))
        model = build(opt, inputs, torch.float64)
        self.assertEqual(type(model).__name__, "OPTForCausalLM")
        named = list(model.named_parameters())
        reported = [n for name, p in named for n, _ in case_tensors(name, p.detach(), opt)]
        self.assertEqual(sorted(reported), sorted(inputs))
        self.assertEqual(len(named) - len(reported), 1, "the position table is the one extra parameter")
        positions = dict(named)["model.decoder.embed_positions.weight"]
        self.assertTrue(not positions.requires_grad and not positions.any())
        ids = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
        gpt2 = colossalai_gpt2.build(m, inputs, torch.float64)(input_ids=ids).logits
        # OPT's attention takes its softmax in float32 (modeling_opt.py:174): in float64 the two agree to f32 rounding,
        # and exactly once that softmax keeps the input's dtype.
        torch.testing.assert_close(model(input_ids=ids).logits, gpt2, rtol=0, atol=1e-5)
        real = torch.nn.functional.softmax
        with mock.patch("torch.nn.functional.softmax", lambda x, dim=None, dtype=None: real(x, dim=dim)):
            torch.testing.assert_close(model(input_ids=ids).logits, gpt2, rtol=0, atol=1e-12)
        self.assertIn("LayerNorm", expressible(dict(m, norm="rmsnorm", activation="swiglu", hf_model="opt")))
        self.assertIn("biases", expressible(dict(m, bias=False, hf_model="opt")))

    def test_a_falcon_computes_the_case_models_logits_and_reports_fused_shards_per_head(self):
        import torch

        from shardfuzz_worker.targets.colossalai_family import build, case_tensors, expressible

        with open(os.path.join(CORPUS, "..", "tests", "python-gpt2", "gpt2-tp2-f32.json")) as f:
            m = dict(json.load(f)["model"], hidden=16, heads=4, kv_heads=4, rotary_base=10, hf_model="falcon")
        self.assertIsNone(expressible(m))
        self.assertIn("rotary", expressible(dict(m, rotary_base=None)))
        self.assertIn("RMSNorm", expressible(dict(m, norm="rmsnorm")))
        inputs = random_case_inputs(m)
        model = build(m, inputs, torch.float64)
        self.assertEqual(type(model).__name__, "FalconForCausalLM")
        self.assert_reports_every_case_tensor_exactly(model, m, inputs)
        # A tensor-parallel rank's shard of query_key_value holds whole heads: its q, k and v shards.
        qkv = dict(model.named_parameters())["transformer.h.0.self_attention.query_key_value.weight"].detach()
        half = dict(case_tensors("transformer.h.0.self_attention.query_key_value.weight", qkv[qkv.shape[0] // 2:], m))
        torch.testing.assert_close(half["layers.0.attn.k.weight"], torch.tensor(inputs["layers.0.attn.k.weight"])[:, 8:])
        reference = reference_model(m, inputs)
        ids = torch.tensor([[1, 2, 3, 0, 5, 4], [4, 5, 6, 7, 0, 1]])
        torch.testing.assert_close(model(input_ids=ids).logits, reference(ids), rtol=0, atol=1e-12)

    def test_a_falcon_of_parallel_blocks_is_parallel_attn_and_computes_the_case_models_logits(self):
        import torch

        from shardfuzz_worker.targets.colossalai_family import build, expressible

        with open(os.path.join(CORPUS, "..", "tests", "python-colossalai-falcon", "falcon-parallel-tp2-f32.json")) as f:
            m = json.load(f)["model"]
        self.assertIsNone(expressible(m))
        self.assertIn("parallel blocks", expressible(dict(m, layers=["parallel", "attention"])))
        inputs = random_case_inputs(m)
        model = build(m, inputs, torch.float64)
        self.assertTrue(model.config.parallel_attn)
        self.assert_reports_every_case_tensor_exactly(model, m, inputs)
        reference = reference_model(m, inputs)
        ids = torch.tensor([[1, 2, 3, 0, 5, 4], [4, 5, 6, 7, 0, 1]])
        torch.testing.assert_close(model(input_ids=ids).logits, reference(ids), rtol=0, atol=1e-12)

    def test_a_command_computes_the_case_models_logits_with_its_interleaved_rotary_and_reports_head_shards(self):
        import torch

        from shardfuzz_worker.targets.colossalai_family import build, case_tensors, expressible

        m = {"vocab": 16, "hidden": 16, "ffn": 12, "heads": 4, "kv_heads": 2, "seq": 6, "batch": 2,
             "layers": ["parallel", "parallel"], "norm": "layernorm", "activation": "swiglu", "bias": False,
             "tied_embeddings": False, "rotary_base": 10, "hf_model": "command"}
        self.assertIsNone(expressible(m))
        self.assertIn("parallel blocks", expressible(dict(m, layers=["attention", "mlp"])))
        self.assertIn("rotary", expressible(dict(m, rotary_base=None)))
        self.assertIn("biases", expressible(dict(m, bias=True)))
        inputs = random_case_inputs(m)
        model = build(m, inputs, torch.float64)
        self.assertEqual(type(model).__name__, "CohereForCausalLM")
        self.assert_reports_every_case_tensor_exactly(model, m, inputs)
        # A tensor-parallel rank's shard of q_proj holds whole heads: the case's columns of those heads.
        q = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.weight"].detach()
        (name, half), = case_tensors("model.layers.0.self_attn.q_proj.weight", q[q.shape[0] // 2:], m)
        torch.testing.assert_close(half, torch.tensor(inputs["layers.0.attn.q.weight"])[:, 8:], rtol=0, atol=0)
        # Cohere's interleaved rotary on the permuted projections is the case's half-split one: the same logits, to
        # float32's round-off (CohereLayerNorm and transformers' eager softmax compute in float32 whatever the dtype).
        reference = reference_model(m, inputs)
        ids = torch.tensor([[1, 2, 3, 0, 5, 4], [4, 5, 6, 7, 0, 1]])
        torch.testing.assert_close(model(input_ids=ids).logits, reference(ids), rtol=0, atol=2e-5)
        # (without the permutation the rotary turns other pairs: far off)
        unpermuted = {n: t for n, t in inputs.items()}
        for n in ("layers.0.attn.q.weight", "layers.1.attn.k.weight"):
            unpermuted[n] = inputs[n][:, [j for h in range(m["heads"] if ".q." in n else m["kv_heads"])
                                          for j in [h * 4 + k for k in (0, 2, 1, 3)]]]
        self.assertGreater(float((build(m, unpermuted, torch.float64)(input_ids=ids).logits - reference(ids)).abs().max()),
                           1e-2)
        # Query/key norms (model.qk_norm): Cohere's q_norm / k_norm, weights [heads, head_dim] permuted as the heads'.
        m = dict(m, qk_norm=True)
        inputs.update({f"layers.{i}.attn.{n}_norm.weight": torch.rand(width, dtype=torch.float64).numpy() + 0.5
                       for i in range(2) for n, width in (("q", 16), ("k", 8))})
        model = build(m, inputs, torch.float64)
        self.assertTrue(model.config.use_qk_norm)
        self.assert_reports_every_case_tensor_exactly(model, m, inputs)
        reference = reference_model(m, inputs)
        torch.testing.assert_close(model(input_ids=ids).logits, reference(ids), rtol=0, atol=2e-5)
        self.assertGreater(float((model(input_ids=ids).logits - build(dict(m, qk_norm=False), inputs, torch.float64)(
            input_ids=ids).logits).abs().max()), 1e-2)

    def test_the_case_mixtral_loads_every_case_parameter_and_reports_experts_as_parts(self):
        import numpy as np
        import torch

        from shardfuzz_worker.targets.colossalai_hybrid_run import stack_experts
        from shardfuzz_worker.targets.colossalai_mixtral import build, case_tensors, expressible

        m = dict(case("mixtral-dp2-ep2-zero1-bf16.json")["model"])
        e, h, f, v = m["moe"]["experts"], m["hidden"], m["ffn"], m["vocab"]
        shapes = {"embed.weight": (v, h), "lm_head.weight": (v, h), "final_norm.weight": (h,),
                  "layers.0.norm.weight": (h,), "layers.1.norm.weight": (h,), "layers.1.moe.router.weight": (h, e),
                  "layers.1.moe.gate.weight": (e, h, f), "layers.1.moe.up.weight": (e, h, f),
                  "layers.1.moe.down.weight": (e, f, h)}
        shapes |= {f"layers.0.attn.{x}.weight": (h, h) for x in ("q", "k", "v", "o")}
        inputs = {n: np.arange(np.prod(s), dtype=np.float64).reshape(s) + k for k, (n, s) in enumerate(shapes.items())}
        model = build(m, inputs, torch.float64)
        tensors = {}
        for n, p in model.named_parameters():
            for name, t in case_tensors(n, p.detach()):
                tensors[f"param/{name}"] = t.numpy()
        self.assertEqual(len([k for k in tensors if "#e" in k]), 3 * e, "every expert's three weights, one part each")
        replicas = {}
        stack_experts(tensors, replicas)
        self.assertEqual(set(tensors), {f"param/{n}" for n in shapes})
        for n in shapes:
            self.assertTrue(np.array_equal(tensors[f"param/{n}"], inputs[n]), n)
        self.assertIsNone(expressible(m))
        self.assertIn("drops no token", expressible({**m, "moe": {**m["moe"], "capacity_factor": 1.0}}))
        self.assertIn("divides each token's gates", expressible({**m, "moe": {**m["moe"], "renormalize": False}}))

    def test_colossalai_moe_refuses_what_the_moe_plugin_or_the_reference_cannot_match(self):
        from shardfuzz_worker.targets.colossalai_moe import TARGET, unsteppable_unused_experts

        self.assertIsNone(TARGET.unsupported(case("mixtral-dp2-ep2-zero1-bf16.json")))
        self.assertIn("DDP", TARGET.unsupported(case("mixtral-dp2-ep2-zero1-bf16.json", zero_stage=0)))
        self.assertIsNone(TARGET.unsupported(case("mixtral-dp2-ep2-zero1-bf16.json", zero_stage=0, pp=2,
                                                       pipeline_schedule="1f1b", microbatches=2)),
                          "beside a pipeline the plugin runs no DDP and takes ep > 1")
        resumed = case("mixtral-dp2-ep2-zero1-bf16.json")
        resumed["train"].update(steps=2, resume_after=1, checkpoint_layout="gathered")
        self.assertIsNone(TARGET.unsupported(resumed))
        self.assertIn("bf16 or fp16", TARGET.unsupported(case("mixtral-dp2-ep2-zero1-bf16.json", ep=1) | {
            "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32"}}))
        momentum = case("mixtral-dp2-ep2-zero1-bf16.json")
        momentum["train"]["optimizer"] = {"kind": "adam", "lr": 0.01}
        self.assertIsNone(TARGET.unsupported(momentum), "decided by the run's routing (RoutingWatch)")
        self.assertIn("step count", unsteppable_unused_experts(momentum), "Adam after its first step moves an expert without tokens")
        momentum["train"]["steps"] = 1
        self.assertIsNone(unsteppable_unused_experts(momentum), "Adam's first step moves nothing whose gradient is zero")
        self.assertIn("trains MoE models", TARGET.unsupported(case("llama-dp2-tp2-zero1-sp-bf16.json")))
        ddp = case("mixtral-dp2-ep2-zero1-bf16.json", ep=1, zero_stage=0)
        self.assertIsNone(TARGET.unsupported(ddp))
        for recompute, refused in (("reentrant", True), ("non_reentrant", False)):
            ddp["model"]["activation_checkpointing"] = recompute
            self.assertEqual("reentrant activation checkpointing" in (TARGET.unsupported(ddp) or ""), refused, recompute)

    def test_the_routing_watch_counts_the_tokens_each_expert_is_routed(self):
        import torch
        from transformers import MixtralConfig, MixtralForCausalLM

        from shardfuzz_worker.targets.colossalai_mixtral import RoutingWatch

        config = MixtralConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                               num_experts_per_tok=2)
        torch.manual_seed(0)
        model = MixtralForCausalLM(config)
        watch = RoutingWatch(model)
        model(torch.randint(0, 13, (3, 5)))
        self.assertEqual(watch.counts.shape, (2, 4))
        self.assertEqual(watch.counts.sum(dim=1).tolist(), [30.0, 30.0], "15 tokens, 2 experts each, per layer")
        with torch.no_grad():
            model.model.layers[1].block_sparse_moe.gate.weight.zero_()
            model.model.layers[1].block_sparse_moe.gate.weight[0] = 1.0
        watch.counts.zero_()
        model(torch.ones(1, 4, dtype=torch.long))
        self.assertEqual(watch.counts[1].tolist()[0], 4.0, "the expert the router favours gets every token")

    def test_an_older_transformers_llama_is_the_same_model(self):
        """transformers 4.39.3 (Colossal-AI 0.4.9's pin) has no LlamaConfig.mlp_bias and no head_dim, and keeps the
        rotary embedding in each attention layer: the case's Llama, biases included, is built there all the same."""
        import torch
        from transformers import LlamaConfig

        from shardfuzz_worker.targets import colossalai_llama, colossalai_release

        class OldConfig(LlamaConfig):
            def __init__(self, vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=None, rms_norm_eps=1e-6,
                         attention_bias=False, **kwargs):
                assert "mlp_bias" not in kwargs and "head_dim" not in kwargs, kwargs
                super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                                 num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                                 num_key_value_heads=num_key_value_heads, rms_norm_eps=rms_norm_eps,
                                 attention_bias=attention_bias, **kwargs)

        m = dict(case("llama-pp2-tp2-1f1b-f32.json")["model"])
        self.assertTrue(m["bias"])
        current = colossalai_release.llama_model(**colossalai_llama.config(m, torch.float32))
        with mock.patch("transformers.LlamaConfig", OldConfig):
            old = colossalai_release.llama_model(**colossalai_llama.config(m, torch.float32))
        self.assertIsInstance(old.config, OldConfig)
        self.assertEqual({n: p.shape for n, p in old.named_parameters()},
                         {n: p.shape for n, p in current.named_parameters()})
        self.assertIn("model.layers.1.mlp.down_proj.bias", dict(old.named_parameters()))

        class Attention(torch.nn.Module):
            rotary_emb = None

        layers = [mock.Mock(self_attn=Attention()) for _ in range(2)]
        model = mock.Mock(model=mock.Mock(spec=["layers"], layers=layers))
        colossalai_release.replace_llama_rotary_embedding(model, lambda: "none")
        self.assertEqual([layer.self_attn.rotary_emb for layer in layers], ["none", "none"])
    def test_the_options_read_from_colossalais_source_are_its_signatures(self):
        import inspect

        from colossalai.booster.plugin import HybridParallelPlugin, LowLevelZeroPlugin
        from colossalai.shardformer.layer import loss

        from shardfuzz_worker.targets import colossalai_release

        for name, real in (("HybridParallelPlugin", HybridParallelPlugin), ("LowLevelZeroPlugin", LowLevelZeroPlugin),
                           ("cross_entropy_1d", loss.cross_entropy_1d)):
            self.assertEqual(colossalai_release.parameters(name) - {"self"}, set(inspect.signature(real).parameters))
            self.assertLessEqual(set(colossalai_release.OPTIONS_OFF[name]), colossalai_release.parameters(name))

    def test_an_older_colossalai_runs_a_case_without_its_newer_options_and_refuses_one_that_needs_them(self):
        """Colossal-AI 0.4.0 has no overlap_allgather, extra_dp_size or cross_entropy_1d mode."""
        from shardfuzz_worker.targets import colossalai_release, colossalai_tp, colossalai_zero

        older = {"LowLevelZeroPlugin": frozenset({"self", "stage", "precision", "max_norm", "cpu_offload",
                                                  "communication_dtype", "overlap_communication",
                                                  "reduce_bucket_size_in_m", "master_weights", "initial_scale",
                                                  "min_scale", "growth_factor", "backoff_factor", "growth_interval",
                                                  "hysteresis", "max_scale"}),
                 "cross_entropy_1d": frozenset({"vocab_logits", "labels", "ignore_index", "process_group",
                                                "vocab_size", "dtype"})}
        with mock.patch.object(colossalai_release, "parameters", older.__getitem__), \
                mock.patch.object(colossalai_release, "installed_version", lambda: "0.4.0"):
            plain = case("zero2-bf16.json")
            kwargs = colossalai_zero.TARGET.plugin_options(plain)
            self.assertIsNone(colossalai_zero.TARGET.unsupported(plain))
            self.assertNotIn("extra_dp_size", colossalai_release.options("LowLevelZeroPlugin", kwargs))
            extra = case("zero2-bf16.json", dp=4, zero_shard_group=2)
            self.assertIn("0.4.0 has no LowLevelZeroPlugin(extra_dp_size=...)", colossalai_zero.TARGET.unsupported(extra))
            with self.assertRaisesRegex(TypeError, "the case was not refused"):
                colossalai_release.options("LowLevelZeroPlugin", colossalai_zero.TARGET.plugin_options(extra))
            tp = case("tp2-sp-bf16-swiglu.json")
            self.assertIsNone(colossalai_tp.TARGET.unsupported(tp))
            accumulated = dict(tp, train=dict(tp["train"], grad_accumulation=2))
            self.assertIn("no cross_entropy_1d(mode=...) (the case needs 'sum')",
                          colossalai_tp.TARGET.unsupported(accumulated))


if __name__ == "__main__":
    unittest.main()
