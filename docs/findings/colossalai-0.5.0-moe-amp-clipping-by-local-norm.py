#!/usr/bin/env python3
"""Colossal-AI 0.5.0: MoeHybridParallelPlugin's bf16/fp16 optimizer (ZeRO 0) clips each pipeline stage's gradients by
that stage's own gradient norm, not the model's.

MoeHybridParallelPlugin.configure builds ZeRO stage 0's mixed-precision optimizer as `HybridParallelAMPOptimizer(...)`
without `pp_process_group=self.pp_group, tp_process_group=self.tp_group`
(booster/plugin/moe_hybrid_parallel_plugin.py:473-481), where its fp32 branch (HybridParallelNaiveOptimizer, 483-491)
and HybridParallelPlugin's own AMP optimizer (hybrid_parallel_plugin.py:1331-1341) pass both. The optimizer then takes
pp_size = tp_size = 1 (hybrid_parallel_plugin.py:513-516) and its `_compute_grad_norm` (584-) all-reduces the squared
norm over neither group: the norm MixedPrecisionOptimizer.step clips by (amp/naive_amp/mixed_precision_optimizer.py:
195-197, `_unscale_and_clip_grads` 108-137) is each stage's local norm (under tp each tp rank's), smaller than the
model's, and different on every stage. Whenever max_norm clips, each stage's update is scaled by its own factor: too
large everywhere, and not the direction of the clipped gradient. (The norm `get_grad_norm()` reports is the local
one too.) fp32 (HybridParallelNaiveOptimizer) and ZeRO 1/2 are right.

Found by shardfuzz's colossalai-moe target: campaign 317's six f16 pipeline divergences (a 2-stage 1F1B pipeline,
2 micro-batches, fp16, max_norm 0.1: stage 0 clipped by norm 0.149, stage 1 by 0.327 in the same step). Here: a
2-layer Mixtral (hidden 8, 4 experts, top-2, no auxiliary loss), MoeHybridParallelPlugin(tp 1, pp 2 1F1B, 2
micro-batches, ep 1, ZeRO 0, bf16, max_norm 0.1), one SGD step (lr 1) on a batch of 4 sequences with the model's own
loss, against the same model on one device in fp32 with torch.nn.utils.clip_grad_norm_(max_norm 0.1). bf16 is used
(no loss scale: the norm the optimizer records is the gradient's own); PRECISION=fp16 shows the same. Run:

    python -m torch.distributed.run --nproc_per_node 2 colossalai-0.5.0-moe-amp-clipping-by-local-norm.py [--fixed]

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai). On the CPU it installs
the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found beside this file in the shardfuzz checkout;
none changes what Colossal-AI computes). Prints the norm each stage clipped by, the one-device norm, each stage's
update against the reference's, and MISMATCH (exit status 1):

    Mixtral, pp 2 (1F1B, 2 micro-batches), ZeRO 0, bf16, max_norm 0.1:
      stage 0: clipped by norm 0.6121; its 20 parameters' update 1.383x the reference's (relative error 0.384)
      stage 1: clipped by norm 0.5848; its 21 parameters' update 1.447x the reference's (relative error 0.447)
      one device: norm 0.8458 (clip_grad_norm_)
    MISMATCH

(each stage's norm is its own share: sqrt(0.6121^2 + 0.5848^2) = 0.8466, the model's; PRECISION=fp16: 0.6113 and
0.5845, updates 1.383x and 1.447x.)

With `--fixed` (the plugin's AMP optimizer given its pp and tp groups, as HybridParallelPlugin gives them) both stages
clip by the model's norm and every update matches the reference within bf16's rounding: OK (exit status 0):

    Mixtral, pp 2 (1F1B, 2 micro-batches), ZeRO 0, bf16, max_norm 0.1:
      stage 0: clipped by norm 0.8466; its 20 parameters' update 1.000x the reference's (relative error 0.016)
      stage 1: clipped by norm 0.8466; its 21 parameters' update 0.999x the reference's (relative error 0.017)
      one device: norm 0.8458 (clip_grad_norm_)
    OK

(PRECISION=fp16 --fixed: both stages 0.8458, relative errors 0.002.)
"""
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))

MAX_NORM = 0.1
NORM_RTOL = 0.02  # the stages' norms against each other and the one-device norm (bf16 is well within it)
UPDATE_RTOL = 0.05  # |update - reference update| / |reference update| on each stage (bf16 rounding: about 1 %)


def fix(plugin_of):
    """The MoE plugin's AMP optimizer given the plugin's pp and tp groups (the module imports the class by name)."""
    from colossalai.booster.plugin import moe_hybrid_parallel_plugin as moe

    class HybridParallelAMPOptimizer(moe.HybridParallelAMPOptimizer):
        def __init__(self, *args, **kwargs):
            plugin = plugin_of()
            kwargs.setdefault("pp_process_group", plugin.pp_group)
            kwargs.setdefault("tp_process_group", plugin.tp_group)
            super().__init__(*args, **kwargs)

    moe.HybridParallelAMPOptimizer = HybridParallelAMPOptimizer


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           output_router_logits=False, router_aux_loss_coef=0.0, tie_word_embeddings=False,
                           _attn_implementation="eager")
    torch.manual_seed(0)
    return MixtralForCausalLM(config).float()


def reference_step(reference, ids):
    """One device, fp32: the whole batch's loss, clip_grad_norm_, one SGD step. Returns the norm before clipping."""
    reference(input_ids=ids, labels=ids).loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    return float(norm)


def pipeline_step(model, ids, precision, plugin_box):
    """Returns (this stage's clipping norm, {name: this stage's updated fp32 master parameter})."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin

    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=2, ep_size=1, zero_stage=0, precision=precision,
                                     num_microbatches=2, pp_style="1f1b", max_norm=MAX_NORM,
                                     enable_metadata_cache=False, overlap_p2p=False)
    plugin_box.append(plugin)
    booster = Booster(plugin=plugin)
    boosted, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=1.0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    booster.execute_pipeline(iter([batch]), boosted, lambda outputs, _: outputs.loss, opt, return_loss=True)
    scale = opt.mixed_precision.loss_scale if precision == "fp16" else 1.0  # (the recorded norm is the scaled one)
    opt.step()
    norm = float(opt._current_grad_norm) / float(scale)
    masters = {n: opt.working_to_master_map[p].detach().float() for n, p in boosted.unwrap().named_parameters()}
    return norm, masters


def main(precision=os.environ.get("PRECISION", "bf16")):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    plugin_box = []
    if "--fixed" in sys.argv:
        fix(lambda: plugin_box[0])
    rank = dist.get_rank()
    reference = mixtral()
    model = copy.deepcopy(reference)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    ids = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(1))

    norm, masters = pipeline_step(model, ids, precision, plugin_box)
    reference_norm = reference_step(reference, ids)
    expected = dict(reference.named_parameters())
    got_update = torch.cat([(p - initial[n]).flatten() for n, p in masters.items()])
    want_update = torch.cat([(expected[n].detach() - initial[n]).flatten() for n in masters])
    error = float((got_update - want_update).norm() / want_update.norm())
    ratio = float(got_update.norm() / want_update.norm())
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (rank, norm, error, ratio, len(masters)))
    wrong = any(abs(n - reference_norm) > NORM_RTOL * reference_norm or e > UPDATE_RTOL for _, n, e, _, _ in rows)
    if rank == 0:
        print(f"Mixtral, pp 2 (1F1B, 2 micro-batches), ZeRO 0, {precision}, max_norm {MAX_NORM}:")
        for stage, n, e, r, count in rows:
            print(f"  stage {stage}: clipped by norm {n:.4f}; its {count} parameters' update {r:.3f}x the"
                  f" reference's (relative error {e:.3f})")
        print(f"  one device: norm {reference_norm:.4f} (clip_grad_norm_)")
        print("MISMATCH" if wrong else "OK")
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
