#!/usr/bin/env python3
"""Colossal-AI 0.5.0: HybridParallelModule.sync_dp_grads all-reduces only the parameters that have a gradient on the
calling rank, so where a MoE expert is routed no token on one data-parallel rank the ranks' all-reduces pair up
different experts' gradients (or abort in gloo, or hang).

With ZeRO 0 and pp_size > 1, MoeHybridParallelPlugin.configure does not wrap the model in PyTorch DDP (`use_ddp` is
False: booster/plugin/moe_hybrid_parallel_plugin.py:438-443, 456-467; DDP only where use_ddp,
hybrid_parallel_plugin.py:113-117) and its fp32/AMP optimizer is no HybridParallelZeroOptimizer, so after the
schedule's backward passes execute_pipeline (hybrid_parallel_plugin.py:1387-) synchronises the data-parallel
gradients with `model.sync_dp_grads()` (1428-1431). That loops over the stage's parameters and all-reduces, over the
data-parallel group, each one whose `p.grad is not None` (hybrid_parallel_plugin.py:161-183, the test at 179), then
divides it by the group's size. The test is rank-local: shardformer's EPMixtralSparseMoeBlock runs no expert that
received no token (shardformer/modeling/mixtral.py:176-180, the `continue` at 179-180; with one expert per rank the
`if output_states.size(0) > 0` at 167), so an expert routed no token in any micro-batch of one data-parallel rank has
no gradient there while the other ranks have one. The ranks then issue different sequences of all-reduces:
 - where the sequences line up in size (every expert's w1, w2, w3 has the same shape), gradients of DIFFERENT
   experts are averaged together, silently; the ranks also end with different replicas (the expert that had no
   gradient on a rank is not stepped there);
 - where sizes differ, gloo aborts (SIGABRT) the rank whose tensor is the smaller:
   "terminate called after throwing an instance of 'gloo::EnforceNotMet' what(): [enforce fail at
   ../third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 96 vs 8" (an expert's 12x8
   weight against an 8-element RMSNorm weight); the others then fail with "Connection reset by peer";
 - where one rank issues fewer all-reduces than another, it can also hang until the collective timeout.
(Under DDP, pp 1, the plugin sets find_unused_parameters, moe_hybrid_parallel_plugin.py:445-450; ZeRO 1/2 syncs its
own flat buffers. HybridParallelPlugin's dense models call the same sync_dp_grads, where every rank usually has the
same parameters with gradients.)

A separate Colossal-AI bug also distorts expert gradients wherever moe_dp > 1: DPGradScalerIn/DPGradScalerOut
(moe/_operation.py:335-376) scale an expert's gradient by moe_dp_size / (the ranks that routed it tokens), see
colossalai-0.5.0-moe-expert-gradients-scaled-by-active-data-parallel-ranks.py. This script makes their backward the
identity in BOTH modes (with and without --fixed), so only the sync bug shows. (Without that, --fixed below still
reports layer 0's experts 0-2 and layer 1's experts 0 and 2 at up to 2.000x the reference's.)

Found by shardfuzz's colossalai-moe target: campaign 317's gloo abort (the message above) on a dp 3 x pp 2
interleaved bf16 case; then, on dp 2 x pp 2 1F1B f32 cases with 4 experts, top-1, both the abort
(tests/python-colossalai-moe/dp2-pp2-zero0-experts4-top1-unrouted-abort-f32.json) and the silent form
(tests/python-colossalai-moe/dp2-pp2-zero0-experts4-top1-unrouted-mixed-f32.json: experts' down-projection gradients
off by ~60 % in direction). Here: a 2-layer Mixtral (vocab 13, hidden 8, intermediate 12, 2 heads, 4 experts, top-1,
no auxiliary loss, untied embeddings), MoeHybridParallelPlugin(tp 1, pp 2 1F1B, 2 micro-batches, ep 1, ZeRO 0,
fp32) on 4 ranks (dp 2 x pp 2), the model's own loss on a batch of 4 sequences of 4 tokens (each data-parallel rank 2,
one per micro-batch), one pass; each stage's gradients after the sync against the same model's on one device on the
whole batch (with equal micro-batches and no ignored labels the pipeline's mean of micro-batch means, averaged over
dp, is the whole batch's mean). The batch (seed 21) routes, in layer 0, no token to expert 1 on dp rank 0 and none to
expert 0 on dp rank 1: dp rank 0 all-reduces experts 0, 2, 3, dp rank 1 experts 1, 2, 3, so dp rank 0's expert 0 is
averaged with dp rank 1's expert 1 (both ranks hold that average, one as expert 0, the other as expert 1). Run:

    python -m torch.distributed.run --nproc_per_node 4 colossalai-0.5.0-moe-pipeline-dp-sync-skips-unrouted-experts.py [--fixed]

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai). On the CPU it installs
the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found beside this file in the shardfuzz checkout;
none changes what Colossal-AI computes). Prints which experts each data-parallel rank routed no token, each
(stage, dp rank)'s gradients that differ from the reference's (an expert's three weights together), and MISMATCH
(exit status 1; 20-60 s on 2 shared CPU cores):

    Mixtral (2 layers, 4 experts, top-1), dp 2 x pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32, seed 21
      (DPGradScalerIn/Out's backward made the identity, both modes):
      layer 0 (stage 0): experts routed no token: dp rank 0 [1], dp rank 1 [0]
      layer 1 (stage 1): experts routed no token: dp rank 0 [1], dp rank 1 [1]
      stage 0, dp rank 0: layer 0 expert 0: relative error 1.724, norm 1.923x the reference's, cosine 0.449
      stage 0, dp rank 0: layer 0 expert 1: no gradient (reference's norm 0.0023)
      stage 0, dp rank 1: layer 0 expert 0: no gradient (reference's norm 0.00133)
      stage 0, dp rank 1: layer 0 expert 1: relative error 0.580, norm 1.115x the reference's, cosine 0.855
    MISMATCH

SEED=0 shows the abort form instead (layer 1: dp rank 0 routes no token to expert 3, dp rank 1 routes every expert):
global rank 1 (stage 1, dp rank 0) dies with the gloo message above.

With `--fixed` (sync_dp_grads gives a parameter that takes gradients but has none on this rank a zero gradient before
the all-reduce: its share of the average; every rank issues the same all-reduces) every gradient matches: OK (exit
status 0; 30-65 s), for SEED=0 too:

    Mixtral (2 layers, 4 experts, top-1), dp 2 x pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32, seed 21
      (DPGradScalerIn/Out's backward made the identity, both modes):
      layer 0 (stage 0): experts routed no token: dp rank 0 [1], dp rank 1 [0]
      layer 1 (stage 1): experts routed no token: dp rank 0 [1], dp rank 1 [1]
      every gradient matches the single-device run's
    OK
"""
import copy
import datetime
import os
import re
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))

SEED = int(os.environ.get("SEED", 21))  # the batch's seed
EXPERTS, DP, MICROBATCHES = 4, 2, 2
RTOL, ATOL = 1e-4, 1e-6  # fp32: |grad - reference grad| <= RTOL |reference grad| + ATOL (top-1 gate grads are ~0)


def neutralise_dp_grad_scalers():
    """Both modes: DPGradScalerIn/Out's backward as the identity (their forward already is), so that the separate bug
    of colossalai-0.5.0-moe-expert-gradients-scaled-by-active-data-parallel-ranks.py does not show here."""
    from colossalai.moe import _operation

    def identity(ctx, *grad_outputs):
        return grad_outputs[0], None, None

    _operation.DPGradScalerIn.backward = staticmethod(identity)
    _operation.DPGradScalerOut.backward = staticmethod(identity)


def fix():
    """--fixed: the released sync_dp_grads with one change: a parameter that takes gradients but got none on this rank
    joins the all-reduce with zeros (its share of the average), so every rank issues the same all-reduces."""
    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelModule

    def sync_dp_grads(self):
        if self.dp_group.size() == 1:
            return
        for p in self.module.parameters():
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)  # the fix
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.dp_group)
                p.grad.div_(self.dp_group.size())

    HybridParallelModule.sync_dp_grads = sync_dp_grads


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=EXPERTS,
                           num_experts_per_tok=1, output_router_logits=False, router_aux_loss_coef=0.0,
                           tie_word_embeddings=False, _attn_implementation="eager")
    torch.manual_seed(0)
    return MixtralForCausalLM(config).float()


def batch(seed=SEED):
    """4 sequences of 4 tokens; data-parallel rank r gets rows 2r, 2r + 1 (one per micro-batch)."""
    ids = torch.randint(0, 13, (2 * DP, 4), generator=torch.Generator().manual_seed(seed))
    return ids, [ids[2 * r:2 * r + 2] for r in range(DP)]


def unrouted(model, rows):
    """{layer: [the experts routed no token by these rows]} (top-1: the gate's argmax), on one device."""
    chosen = {}
    hooks = [layer.block_sparse_moe.gate.register_forward_hook(
        lambda m, i, out, n=n: chosen.setdefault(n, set()).update(out.argmax(-1).tolist()))
        for n, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(input_ids=rows)
    for h in hooks:
        h.remove()
    return {n: [e for e in range(EXPERTS) if e not in s] for n, s in chosen.items()}


def pipeline_grads(model, rows):
    """One 1F1B pass over this data-parallel rank's rows; returns (stage, dp rank, {name: gradient after the sync})."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin

    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=2, ep_size=1, zero_stage=0, precision="fp32",
                                     num_microbatches=MICROBATCHES, pp_style="1f1b", max_norm=0.0,
                                     enable_metadata_cache=False, overlap_p2p=False)
    booster = Booster(plugin=plugin)
    boosted, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=1.0))
    dp_rank = dist.get_rank(plugin.dp_group)
    ids = rows[dp_rank]
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    booster.execute_pipeline(iter([data]), boosted, lambda outputs, _: outputs.loss, opt, return_loss=True)
    grads = {n: p.grad for n, p in boosted.unwrap().named_parameters()}  # (this stage's parameters only)
    return plugin.stage_manager.stage, dp_rank, grads


def compare(grads, reference):
    """Lines for the parameters whose gradient differs from the reference's; experts' three weights together."""
    expected = {n: p.grad for n, p in reference.named_parameters()}
    groups = {}
    for name, got in grads.items():
        m = re.match(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.", name)
        key = f"layer {m[1]} expert {m[2]}" if m else name
        groups.setdefault(key, []).append((got, expected[name]))
    lines = []
    for key, pairs in groups.items():
        want = torch.cat([w.flatten() for _, w in pairs])
        if all(g is None for g, _ in pairs):
            if want.norm() > ATOL:
                lines.append(f"{key}: no gradient (reference's norm {want.norm():.3g})")
            continue
        got = torch.cat([(w * 0 if g is None else g).flatten() for g, w in pairs])
        if (got - want).norm() > RTOL * want.norm() + ATOL:
            cos = torch.nn.functional.cosine_similarity(got, want, dim=0)
            lines.append(f"{key}: relative error {(got - want).norm() / want.norm():.3f}, norm "
                         f"{got.norm() / want.norm():.3f}x the reference's, cosine {cos:.3f}")
    return lines


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    neutralise_dp_grad_scalers()
    if "--fixed" in sys.argv:
        fix()
    assert dist.get_world_size() == 2 * DP, "run with --nproc_per_node 4 (dp 2 x pp 2)"
    reference = mixtral()
    model = copy.deepcopy(reference)
    ids, rows = batch()
    routing = [unrouted(reference, r) for r in rows]
    stage, dp_rank, grads = pipeline_grads(model, rows)
    reference(input_ids=ids, labels=ids).loss.backward()  # one device, the whole batch (the same mean)
    report = [None] * dist.get_world_size()
    dist.all_gather_object(report, (stage, dp_rank, compare(grads, reference)))
    wrong = any(lines for _, _, lines in report)
    if dist.get_rank() == 0:
        print_report(routing, report, wrong)
    dist.destroy_process_group()
    return 1 if wrong else 0


def print_report(routing, report, wrong):
    print(f"Mixtral (2 layers, {EXPERTS} experts, top-1), dp {DP} x pp 2 (1F1B, {MICROBATCHES} micro-batches), "
          f"ZeRO 0, fp32, seed {SEED}\n  (DPGradScalerIn/Out's backward made the identity, both modes):")
    for layer in sorted(routing[0]):
        print(f"  layer {layer} (stage {layer}): experts routed no token: "
              + ", ".join(f"dp rank {r} {routing[r][layer]}" for r in range(DP)))
    for stage, dp_rank, lines in sorted(report):
        for line in lines:
            print(f"  stage {stage}, dp rank {dp_rank}: {line}")
    if not wrong:
        print("  every gradient matches the single-device run's")
    print("MISMATCH" if wrong else "OK")


if __name__ == "__main__":
    sys.exit(main())
