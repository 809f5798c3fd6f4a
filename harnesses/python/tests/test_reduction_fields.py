"""The case fields `reduce_bucket`, `overlap_comm` and the other gradient-reduction fields as the main environment's data-parallel targets realise them:
DeepSpeed's ZeRO configuration and DDP's bucket size (the Colossal-AI plugins' are in test_colossalai.py).
Skipped where torch or DeepSpeed is not installed."""

import importlib.util
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "corpus")
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_DEEPSPEED = HAVE_TORCH and importlib.util.find_spec("deepspeed") is not None


def load(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def case(name, **parallel):
    c = load(CORPUS, name)
    c["parallel"].update(parallel)
    return c


@unittest.skipUnless(HAVE_DEEPSPEED, "deepspeed is not installed in this environment")
class DeepSpeedReductionTest(unittest.TestCase):
    def test_the_zero_configuration_takes_the_cases_bucket_and_overlap(self):
        from shardfuzz_worker.targets.deepspeed_zero import BUCKET, TARGET

        plain = TARGET.config(case("zero2-bf16.json"), 2)["zero_optimization"]
        self.assertEqual(plain["reduce_bucket_size"], BUCKET)
        self.assertNotIn("overlap_comm", plain, "absent, DeepSpeed's own default")
        for overlap in (True, False):
            z = TARGET.config(case("zero2-bf16.json", reduce_bucket=7, overlap_comm=overlap), 2)["zero_optimization"]
            self.assertEqual((z["reduce_bucket_size"], z["overlap_comm"], z["allgather_bucket_size"]), (7, overlap, BUCKET))

    def test_the_configuration_takes_the_cases_collective_and_predivide_factor(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        plain = TARGET.config(case("zero2-bf16.json"), 2)
        self.assertNotIn("reduce_scatter", plain["zero_optimization"])
        self.assertNotIn("gradient_predivide_factor", plain)
        cfg = TARGET.config(case("zero2-bf16.json", reduce_scatter=False, grad_predivide=2), 2)
        self.assertEqual((cfg["zero_optimization"]["reduce_scatter"], cfg["gradient_predivide_factor"]), (False, 2.0))

    def test_the_configuration_takes_the_cases_gradient_layout_and_offload(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        plain = TARGET.config(case("zero2-bf16.json"), 2)
        for key in ("contiguous_gradients", "round_robin_gradients", "offload_optimizer"):
            self.assertNotIn(key, plain["zero_optimization"], "absent, DeepSpeed's own default")
        z = TARGET.config(case("zero2-bf16.json", contiguous_grads=False, round_robin_grads=True), 2)["zero_optimization"]
        self.assertEqual((z["contiguous_gradients"], z["round_robin_gradients"]), (False, True))
        self.assertNotIn("use_multi_rank_bucket_allreduce", plain["zero_optimization"])
        for owner in (True, False):
            z = TARGET.config(case("zero2-bf16.json", reduce_to_owner=owner), 2)["zero_optimization"]
            self.assertEqual(z["use_multi_rank_bucket_allreduce"], not owner)
        cfg = TARGET.config(case("zero2-bf16.json", zero_offload=True), 2)
        self.assertEqual(cfg["zero_optimization"]["offload_optimizer"], {"device": "cpu"})
        self.assertFalse(cfg["zero_force_ds_cpu_optimizer"], "the case's torch optimizer runs on the host")
        self.assertNotIn("offload_optimizer", TARGET.config(case("zero2-bf16.json", zero_offload=True, zero_stage=0), 2)
                         ["zero_optimization"], "offloading is read only with a ZeRO stage")

    def test_zero3_persistence_and_sub_groups_are_read_at_stage_3_only(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET, zero3_layout_features

        z = TARGET.config(case("zero2-bf16.json", zero_stage=3), 2)["zero_optimization"]
        self.assertEqual(z["stage3_param_persistence_threshold"], 0, "absent: every parameter partitioned")
        self.assertNotIn("sub_group_size", z)
        z = TARGET.config(case("zero2-bf16.json", zero_stage=3, persist_below=32, optimizer_sub_group=50), 2)
        self.assertEqual((z["zero_optimization"]["stage3_param_persistence_threshold"],
                          z["zero_optimization"]["sub_group_size"]), (32, 50))
        z = TARGET.config(case("zero2-bf16.json", persist_below=32, optimizer_sub_group=50), 2)["zero_optimization"]
        self.assertNotIn("sub_group_size", z, "stage 2 has no sub-groups")
        p = {"zero_stage": 3, "persist_below": 32, "optimizer_sub_group": 50, "reshard_group": None,
             "prefetch_bucket": None, "max_live_parameters": None, "max_reuse_distance": None}
        self.assertEqual(zero3_layout_features("s", p, [8, 32, 64, 64], 2), ["s:persistent-some", "s:sub-groups-several"])
        self.assertEqual(zero3_layout_features("s", p | {"persist_below": 0, "optimizer_sub_group": 500},
                                               [8, 32], 2), ["s:persistent-none", "s:sub-groups-one"])
        self.assertEqual(zero3_layout_features("s", p | {"zero_stage": 2}, [8], 2), [])
        self.assertEqual(zero3_layout_features("s", p | {"persist_below": None, "optimizer_sub_group": None,
                                                         "reshard_group": 2}, [8], 4), ["s:reshard-partial"])

    def test_zero3_fetching_follows_the_case_at_stage_3_only(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET, zero3_layout_features

        z = TARGET.config(case("zero2-bf16.json", zero_stage=3), 2)["zero_optimization"]
        self.assertNotIn("stage3_max_live_parameters", z)
        self.assertNotIn("stage3_max_reuse_distance", z)
        fields = {"prefetch_bucket": 0, "max_live_parameters": 40, "max_reuse_distance": 7}
        z = TARGET.config(case("zero2-bf16.json", zero_stage=3, **fields), 2)["zero_optimization"]
        self.assertEqual((z["stage3_prefetch_bucket_size"], z["stage3_max_live_parameters"],
                          z["stage3_max_reuse_distance"]), (0, 40, 7))
        z = TARGET.config(case("zero2-bf16.json", **fields), 2)["zero_optimization"]
        self.assertNotIn("stage3_max_live_parameters", z, "read only with ZeRO-3")
        p = {"zero_stage": 3, "persist_below": None, "optimizer_sub_group": None, "reshard_group": None} | fields
        self.assertEqual(zero3_layout_features("s", p, [8, 32, 64], 2),
                         ["s:prefetch-none", "s:live-cap-below-a-parameter", "s:reuse-below-a-parameter"])
        p |= {"prefetch_bucket": 104, "max_live_parameters": 64, "max_reuse_distance": 1}
        self.assertEqual(zero3_layout_features("s", p, [8, 32, 64], 2),
                         ["s:prefetch-all", "s:live-cap-some", "s:reuse-below-a-parameter"])

    def test_the_reshard_group_is_hpzs_partition_size(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        self.assertNotIn("zero_hpz_partition_size", TARGET.config(case("zero2-bf16.json", zero_stage=3), 4)["zero_optimization"])
        z = TARGET.config(case("zero2-bf16.json", dp=4, zero_stage=3, reshard_group=2), 4)["zero_optimization"]
        self.assertEqual(z["zero_hpz_partition_size"], 2)
        c = case("zero2-bf16.json", dp=4, zero_stage=3, reshard_group=1)
        self.assertIn("hpZ partition size 1", TARGET.unsupported(c))
        self.assertNotIn("zero_hpz_partition_size", TARGET.config(case("zero2-bf16.json", dp=4, reshard_group=2), 4)
                         ["zero_optimization"], "read only with ZeRO-3")

    def test_the_accumulation_dtype_is_deepspeeds_data_type(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        c = case("zero2-bf16.json")
        self.assertNotIn("data_types", TARGET.config(c, 2))
        c["train"]["grad_accum_dtype"] = "f32"
        self.assertEqual(TARGET.config(c, 2)["data_types"], {"grad_accum_dtype": "fp32"})
        c["train"]["grad_accum_dtype"] = "f64"
        self.assertIn("accumulates gradients in fp32 / bf16 / fp16 only", TARGET.unsupported(c))
        c["train"]["dtype"], c["train"]["grad_accum_dtype"] = "f32", "bf16"
        self.assertIn("below the f32 compute dtype", TARGET.unsupported(c))

    def test_the_reduce_dtype_is_deepspeeds_communication_data_type(self):
        from shardfuzz_worker.targets.deepspeed_zero import TARGET

        c = case("zero2-bf16.json")
        c["train"].pop("reduce_dtype", None)
        self.assertNotIn("communication_data_type", TARGET.config(c, 2), "the compute dtype: DeepSpeed's default")
        for dt, rd, ds in (("bf16", "f32", "fp32"), ("f32", "bf16", "bf16"), ("f32", "f16", "fp16")):
            c["train"]["dtype"], c["train"]["reduce_dtype"] = dt, rd
            self.assertIsNone(TARGET.unsupported(c), (dt, rd))
            self.assertEqual(TARGET.config(c, 2)["communication_data_type"], ds)
        c["train"]["reduce_dtype"] = "f64"
        self.assertIn("communicates gradients in f32 / bf16 / f16 only", TARGET.unsupported(c))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class DdpReductionTest(unittest.TestCase):
    def test_the_bucket_cap_holds_the_cases_elements(self):
        import torch

        from shardfuzz_worker.targets.base import reduction_feature
        from shardfuzz_worker.targets.torch_ddp import bucket_cap_mb

        self.assertEqual(bucket_cap_mb(case("dp2-even-f32.json"), torch.float32), 1)
        self.assertEqual(bucket_cap_mb(case("dp2-even-f32.json", reduce_bucket=5), torch.bfloat16) * 2**20, 10)
        self.assertEqual(reduction_feature("ddp", case("dp2-even-f32.json", reduce_bucket=5)), "ddp:bucket-tiny:overlap-default")
        self.assertEqual(reduction_feature("x", case("dp2-even-f32.json", reduce_bucket=9, overlap_comm=False)),
                         "x:bucket-sized:overlap-off")

    def test_a_narrower_reduce_dtype_is_ddps_own_compression_hook(self):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        from shardfuzz_worker.targets.torch_ddp import TARGET, compress_hook

        c = case("dp2-even-f32.json")
        self.assertIsNone(compress_hook(c))
        for rd, hook in (("bf16", default_hooks.bf16_compress_hook), ("f16", default_hooks.fp16_compress_hook)):
            c["train"]["reduce_dtype"] = rd
            self.assertIsNone(TARGET.unsupported(c), rd)
            self.assertIs(compress_hook(c), hook)
        c["train"]["reduce_dtype"] = "f64"
        self.assertIn("through a compression hook, in bf16 / f16", TARGET.unsupported(c))
        c["train"].update(reduce_dtype="f16", optimizer={"kind": "sgd", "lr": 0.1})
        c["model"]["sparse_embedding"] = True
        self.assertIn("no CPU kernel adding the f16 sparse gradients", TARGET.unsupported(c))
        c["train"]["reduce_dtype"] = "bf16"
        self.assertIsNone(TARGET.unsupported(c))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class MasterDtypeTest(unittest.TestCase):
    def test_adam_under_f16_needs_master_weights_the_target_keeps(self):
        from shardfuzz_worker.targets.torch_ddp import TARGET as DDP
        from shardfuzz_worker.targets.torch_fsdp2 import TARGET as FSDP2

        c = case("dp2-even-f32.json")
        c["train"].update(dtype="f16", optimizer={"kind": "adam", "lr": 0.01})
        for target in (DDP, FSDP2):
            self.assertIn("Adam moments in f16", target.unsupported(c), target.name)
        c["train"]["master_dtype"] = "f32"
        self.assertIsNone(FSDP2.unsupported(c), "FSDP2 keeps the moments of its f32 parameters in f32")
        self.assertIn("Adam moments in f16", DDP.unsupported(c), "DDP holds the parameters in the compute dtype")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class ReshardGroupTest(unittest.TestCase):
    def test_fsdp2_reshards_after_forward_over_the_cases_group(self):
        from shardfuzz_worker.targets.torch_fsdp2 import TARGET, reshard_after_forward

        p = {"zero_stage": 3, "reshard_group": None}
        self.assertIs(reshard_after_forward(p, 4), True)
        self.assertIs(reshard_after_forward(p | {"zero_stage": 2}, 4), False)
        self.assertIs(reshard_after_forward(p | {"zero_stage": 2, "reshard_group": 2}, 4), False, "ZeRO-3 only")
        self.assertEqual([reshard_after_forward(p | {"reshard_group": g}, 4) for g in (1, 2, 4)], [False, 2, True])
        c = case("dp2-even-f32.json", dp=4, zero_stage=3, zero_shard_group=2, reshard_group=4)
        self.assertIn("4 does not divide them", TARGET.unsupported(c))
        c["parallel"]["reshard_group"] = 2
        self.assertIsNone(TARGET.unsupported(c))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class ParamShardDimTest(unittest.TestCase):
    def test_fsdp2_shards_along_the_cases_dim_where_it_divides_evenly(self):
        import torch
        from torch.distributed.tensor import Shard

        from shardfuzz_worker.targets.torch_fsdp2 import shard_dim_feature, shard_placement

        place = shard_placement(1, 4)
        self.assertEqual(place(torch.nn.Parameter(torch.zeros(3, 8))), Shard(1))
        self.assertIsNone(place(torch.nn.Parameter(torch.zeros(8, 6))), "6 columns over 4 ranks: FSDP2's Shard(0)")
        self.assertIsNone(place(torch.nn.Parameter(torch.zeros(8))), "a vector has no dimension 1")
        c = case("dp2-even-f32.json")
        c["model"].update(hidden=8, ffn=12)
        self.assertEqual([shard_dim_feature(c, d, r) for d, r in ((0, 4), (1, 4), (1, 3), (1, 5))],
                         ["shard-dim-0", "shard-dim-1-all", "shard-dim-1-some", "shard-dim-1-none"])


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class GradientDivideTest(unittest.TestCase):
    def test_fsdp2_refuses_only_the_divide_factors_gloo_cannot_reduce(self):
        from shardfuzz_worker.targets.torch_fsdp2 import unsupported_reduction

        def hsdp(dtype, group, **fields):
            c = case("dp2-even-f32.json", dp=4, zero_shard_group=group, **fields)
            c["train"]["dtype"] = dtype
            return c

        why = unsupported_reduction(hsdp("bf16", 2, explicit_grad_divide=True))
        self.assertIn("PREMUL_SUM", why)
        self.assertIn("(4)", why)
        self.assertIn("PREMUL_SUM", unsupported_reduction(hsdp("f32", 2, explicit_grad_divide=True)))
        for fine in (hsdp("bf16", 2, explicit_grad_divide=True, sum_collectives=True),  # summed, divided apart
                     hsdp("f16", 2, explicit_grad_divide=True),  # fp16 is pre- and post-divided
                     hsdp("f32", 1, explicit_grad_divide=True),  # one-rank shard groups: no reduce-scatter
                     hsdp("f32", None, explicit_grad_divide=True),  # the factor is the shard group's size: AVG
                     hsdp("bf16", 2, sum_collectives=False)):
            self.assertIsNone(unsupported_reduction(fine), fine["parallel"])
        resumed = hsdp("f32", None)
        resumed["train"]["resume_parallel"] = {**resumed["parallel"], "zero_shard_group": 2, "explicit_grad_divide": True}
        self.assertIn("PREMUL_SUM", unsupported_reduction(resumed), "the layout it resumes into counts too")

    def test_fsdp2_modules_take_the_cases_reduction(self):
        from shardfuzz_worker.targets.torch_fsdp2 import set_gradient_reduction

        class Module:
            def __init__(self):
                self.calls = []

            def set_force_sum_reduction_for_comms(self, enable):
                self.calls.append(("sum", enable))

            def set_gradient_divide_factor(self, factor):
                self.calls.append(("divide", factor))

        modules = [Module(), Module()]
        set_gradient_reduction(modules, True, 4)
        self.assertEqual([m.calls for m in modules], [[("sum", True), ("divide", 4.0)]] * 2)
        untouched = Module()
        set_gradient_reduction([untouched], None, None)
        self.assertEqual(untouched.calls, [], "absent fields leave FSDP2's own choice")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class SparseEmbeddingTest(unittest.TestCase):
    def test_what_a_sparse_embedding_gradient_cannot_meet_is_refused(self):
        from shardfuzz_worker.targets.torch_model import unsupported_sparse_embedding

        def sparse(**train):
            c = case("dp2-even-f32.json")
            c["model"]["sparse_embedding"] = True
            c["train"].update(train)
            return c

        self.assertIsNone(unsupported_sparse_embedding(case("dp2-even-f32.json")), "dense: nothing to refuse")
        self.assertIn("takes no sparse gradients", unsupported_sparse_embedding(sparse()))  # the seed's Adam
        self.assertIsNone(unsupported_sparse_embedding(sparse(optimizer={"kind": "sgd", "lr": 0.1})))
        self.assertIn("weight decay",
                      unsupported_sparse_embedding(sparse(optimizer={"kind": "sgd", "lr": 0.1, "weight_decay": 0.1})))
        self.assertIn("f16", unsupported_sparse_embedding(sparse(optimizer={"kind": "sgd", "lr": 0.1}, dtype="f16")))
        tied = sparse(optimizer={"kind": "sgd", "lr": 0.1})
        tied["model"]["tied_embeddings"] = True
        self.assertIn("tied", unsupported_sparse_embedding(tied))



@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class MegatronDistributedOptimizerTest(unittest.TestCase):
    def test_zero1_takes_the_shard_group_as_optimizer_instances_and_the_overlapped_param_gather(self):
        from shardfuzz_worker.targets.megatron_common import data_parallel_features, ddp_settings, optimizer_settings

        plain = ddp_settings(case("zero1-dp2.json", dp=4))
        self.assertEqual((plain["num_distributed_optimizer_instances"], plain["overlap_param_gather"]), (1, False))
        s = ddp_settings(case("zero1-dp2.json", dp=4, zero_shard_group=2, overlap_param_gather=True))
        self.assertEqual((s["num_distributed_optimizer_instances"], s["overlap_param_gather"]), (2, True))
        self.assertTrue(optimizer_settings(case("zero1-dp2.json", overlap_param_gather=True))["overlap_param_gather"],
                        "megatron's optimizer config carries the same switch as its DDP config")
        self.assertEqual(ddp_settings(case("zero1-dp2.json", dp=4, zero_shard_group=1))["num_distributed_optimizer_instances"], 4)
        self.assertEqual(data_parallel_features("p", case("zero1-dp2.json", dp=4, zero_shard_group=2, overlap_param_gather=False)),
                         ["p:instances-2", "p:param-gather-in-step"])

    def test_averaging_collectives_are_average_in_collective_and_refused_beside_the_per_token_loss(self):
        from shardfuzz_worker.targets.megatron_common import data_parallel_features, ddp_settings, unsupported_training

        self.assertNotIn("average_in_collective", ddp_settings(case("zero1-dp2.json")), "absent: megatron's default")
        self.assertNotIn("average_in_collective", ddp_settings(case("zero1-dp2.json", sum_collectives=True)),
                         "sums are megatron's default")
        averaged = case("zero1-dp2.json", sum_collectives=False)
        self.assertTrue(ddp_settings(averaged)["average_in_collective"])
        self.assertIn("p:average-in-collective", data_parallel_features("p", averaged))
        averaged["train"] |= {"per_token_loss": True, "dtype": "f32"}
        self.assertIn("cannot average in the collective", unsupported_training(averaged))

    def test_without_the_distributed_optimizer_neither_applies(self):
        from shardfuzz_worker.targets.megatron_common import data_parallel_features, ddp_settings

        # (megatron reads overlap_param_gather without the distributed optimizer as its layer-wise optimizer's switch)
        c = case("zero1-dp2.json", dp=4, zero_stage=0, zero_shard_group=2, overlap_param_gather=True)
        s = ddp_settings(c)
        self.assertEqual((s["num_distributed_optimizer_instances"], s["overlap_param_gather"]), (1, False))
        self.assertEqual(data_parallel_features("p", c), [])

    def test_bf16_accumulation_reduced_in_f32_is_the_all_to_all_reduce_scatter_under_zero1(self):
        from shardfuzz_worker.targets.megatron_common import ddp_settings, unsupported_training

        c = case("zero1-bf16-adamw.json", dp=2)
        c["train"] |= {"reduce_dtype": "f32", "grad_accum_dtype": "bf16"}
        s = ddp_settings(c)
        self.assertEqual((s["reduce_scatter_with_fp32_accumulation"], s["grad_reduce_in_fp32"]), (True, False))
        c["train"]["grad_accum_dtype"] = "f32"
        s = ddp_settings(c)
        self.assertEqual((s["reduce_scatter_with_fp32_accumulation"], s["grad_reduce_in_fp32"]), (False, True))
        c["train"]["grad_accum_dtype"] = "bf16"
        c["parallel"] |= {"dp": 4, "zero_shard_group": 2}
        self.assertIn("several distributed-optimizer instances", unsupported_training(c))
        c["parallel"]["zero_stage"] = 0  # (DDP all-reduces: the fp32 buffers)
        s = ddp_settings(c)
        self.assertEqual((s["reduce_scatter_with_fp32_accumulation"], s["grad_reduce_in_fp32"]), (False, True))



MOE_CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "python-megatron-moe")


def moe_case(name):
    return load(MOE_CASES, name)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed in this environment")
class MegatronMoeTest(unittest.TestCase):
    """What megatron-tp's MoELayer expresses of the case's MoE blocks, and the settings it hands megatron."""

    def test_a_capacity_that_drops_tokens_is_expressed_where_megatron_counts_a_sequence(self):
        import torch

        from shardfuzz_worker.targets.megatron_moe import drops_tokens, moe_config, unsupported_moe

        c = moe_case("moe-allgather-dp1-f32.json")  # seq 4, 4 experts, top 2: capacity 2.0 gives 4 slots
        self.assertIsNone(unsupported_moe(c))
        self.assertIsNone(moe_config(c, torch.float32, 1, False).moe_expert_capacity_factor)  # (dropless)
        c["model"]["moe"]["capacity_factor"] = 1.25  # 3 slots < seq 4, batch 4 in one micro-batch
        self.assertTrue(drops_tokens(c))
        self.assertIn("micro-batches of [4] sequences", unsupported_moe(c))
        c["train"]["grad_accumulation"] = 4  # one sequence per micro-batch: megatron counts a sequence
        self.assertIsNone(unsupported_moe(c))
        config = moe_config(c, torch.float32, 1, False)
        self.assertEqual((config.moe_expert_capacity_factor, config.moe_token_drop_policy), (1.25, "position"))
        c["model"]["moe"]["pad_to_capacity"] = True  # megatron's drop-and-pad dispatch
        self.assertTrue(moe_config(c, torch.float32, 1, False).moe_pad_expert_input_to_capacity)
        padded = moe_case("moe-allgather-dp1-f32.json")
        padded["model"]["moe"].update(capacity_factor=1.6, pad_to_capacity=True)  # 4 slots >= seq 4: none dropped
        # One micro-batch of 4 sequences: megatron's capacity over 16 tokens is ceil(8 x 1.6) = 13: it drops.
        self.assertFalse(drops_tokens(padded))
        self.assertIn("router call of 16 tokens drops tokens", unsupported_moe(padded))
        padded["train"]["grad_accumulation"] = 4  # one sequence per router call: ceil(2 x 1.6) = 4 slots
        self.assertIsNone(unsupported_moe(padded))
        c["parallel"]["tp"] = 2  # megatron routes seq / tp tokens of a sequence-parallel shard
        self.assertIn("sequence-parallel shard", unsupported_moe(c))
        c["parallel"]["tp"] = 1
        c["model"]["seq"] = 10  # 20 choices over 3 experts, capacity 1.05
        c["model"]["moe"].update(experts=3, capacity_factor=1.05)
        self.assertIn("megatron's rounding gives 8 slots, the case's 7", unsupported_moe(c))

    def test_an_auxiliary_loss_needs_equal_micro_batches(self):
        from shardfuzz_worker.targets.megatron_moe import unsupported_moe

        c = moe_case("tp2-sp-moe-dp2-ep2-aux-bf16.json")
        self.assertIsNone(unsupported_moe(c))
        c["model"]["batch"] = 5  # 3 and 2 rows on the two replicas
        self.assertIn("micro-batch", unsupported_moe(c))
        del c["model"]["moe"]["aux_loss"]
        self.assertIsNone(unsupported_moe(c))

    def test_gated_experts_freeze_gate_and_up_together(self):
        from shardfuzz_worker.targets.megatron_moe import unsupported_moe

        c = moe_case("moe-dp4-ep2-zero1-aux-swiglu-bf16.json")
        c["train"]["frozen"] = ["layers.1.moe.up"]
        self.assertIn("freeze together", unsupported_moe(c))
        c["train"]["frozen"] = ["layers.1.moe"]
        self.assertIsNone(unsupported_moe(c))

    def test_experts_split_over_tp_without_biases_and_not_with_them(self):
        from shardfuzz_worker.targets.megatron_moe import dispatcher, expert_tensor_parallel

        c = moe_case("tp2-sp-moe-dp2-ep2-aux-bf16.json")
        self.assertEqual((expert_tensor_parallel(c, 2), dispatcher(c)), (2, "alltoall"))
        self.assertEqual(expert_tensor_parallel(moe_case("tp2-sp-moe-bias-etp1-ep1-crash-f32.json"), 2), 1)
        self.assertEqual(dispatcher(moe_case("moe-allgather-dp1-f32.json")), "allgather")

    def test_megatron_parameter_names_map_to_the_case_s(self):
        from shardfuzz_worker.targets.megatron_moe import case_pieces, frozen_moe_param

        pre = "layers.1.moe.layer."
        self.assertEqual(case_pieces(pre + "experts.local_experts.3.linear_fc1.weight", swiglu=True),
                         [("layers.1.moe.gate.weight", "gate"), ("layers.1.moe.up.weight", "up")])
        self.assertEqual(case_pieces(pre + "experts.local_experts.0.linear_fc2.bias", swiglu=False),
                         [("layers.1.moe.down.bias", "down")])
        self.assertEqual(case_pieces(pre + "router.bias", swiglu=False), [])
        c = moe_case("moe-allgather-dp1-f32.json")
        self.assertTrue(frozen_moe_param(c, pre + "router.bias"), "megatron's router bias is held at zero")
        self.assertFalse(frozen_moe_param(c, pre + "router.weight"))


if __name__ == "__main__":
    unittest.main()
