#!/usr/bin/env python3
"""Colossal-AI 0.5.0: MoeHybridParallelPlugin with ep_size > 1, ZeRO 0 and a pipeline averages each expert's gradient
with another expert's (the one at the same local index on the other expert-parallel rank), and clips by a norm that
counts only this expert-parallel rank's experts.

MoeHybridParallelPlugin refuses ep > 1 only where it would use PyTorch DDP: `use_ddp` is True only at pp 1 with ZeRO 0
(booster/plugin/moe_hybrid_parallel_plugin.py:438-443), and only then does it check that the data-parallel and the
MoE data-parallel groups agree (445-455: "... since DDP can only reduce grad across a single group ..., you might
want to modify your config to bypass DDP"; as released that message's f-string names an undefined `dp_group`, so
the refusal would itself surface as a NameError -- read, not run). Beside a pipeline it wraps the model in
HybridParallelModule with dp_group=self.mixed_dp_group (457-467, the argument at 461), the moe_dp x ep group (345,
359), and no DDP; with ZeRO 0 after the schedule's backward passes execute_pipeline
(booster/plugin/hybrid_parallel_plugin.py:1387-1433) syncs the gradients with `model.sync_dp_grads()` (1431).

(1) sync_dp_grads (hybrid_parallel_plugin.py:161-183) all-reduces EVERY gradient over that whole group and divides it
by the group's size, the experts' included. But an expert-parallel rank holds only its own experts:
EPMixtralSparseMoeBlock.setup_process_groups (shardformer/modeling/mixtral.py:58-105) keeps experts
ep_rank * n/ep .. (ep_rank + 1) * n/ep - 1 (81-82) and sets the others' parameters to None (84); the all-to-all
brings each expert the tokens of every ep rank, and EPGradScalerIn/Out (166, 193; moe/_operation.py:295-332) scale
its gradient by 1/ep, so a rank's expert gradient already is the average over its ep group's ranks' batches and
wants averaging over moe_dp only (the block's `moe_dp_group`, 87). Each rank walks its parameters in the same order,
so ep rank 0's i-th local expert meets ep rank 1's i-th: expert e's gradient becomes (g_e + g_e')/2, e' = the expert
at e's local index on the other ep rank (with moe_dp 1 exactly that), on both ranks -- silently, as every expert's
weights have the same shapes. (Under ZeRO 1 MoeHybridParallelZeroOptimizer reduces the experts in a store of their
own over moe_dp_group, moe_hybrid_parallel_plugin.py:66-75.)

(2) With ZeRO 0 the plugin's optimizer is HybridParallelNaiveOptimizer (fp32, moe_hybrid_parallel_plugin.py:483-491)
or HybridParallelAMPOptimizer (bf16/fp16, 473-481). Their step (hybrid_parallel_plugin.py:357-378;
amp/naive_amp/mixed_precision_optimizer.py:169-196) clips by `_compute_grad_norm` (hybrid_parallel_plugin.py:380-456
and 584-663), which sums this rank's gradients' squared norms (441, 648) and all-reduces the sum over tp and pp only
(446-451, 653-658), never over ep, whose other ranks hold the other experts: every rank clips by sqrt(dense^2 + its
own ep rank's experts^2), too small, and different on each ep rank; wherever max_norm clips, each ep rank's update
is too large by (the model's norm / its norm), a different factor on each, and the dense parameters the ep ranks
replicate drift apart. (The MoE plugin also builds the AMP optimizer without the pp and tp groups, a separate bug:
colossalai-0.5.0-moe-amp-clipping-by-local-norm.py.)

Two separate Colossal-AI bugs are kept out of the way in BOTH modes (with and without --fixed):
DPGradScalerIn/DPGradScalerOut (moe/_operation.py:335-376) scale an expert's gradient by moe_dp / (the ranks that
routed it tokens) -- with dp 2 = ep 2 moe_dp is 1 and they do nothing, but their backward is made the identity anyway
(colossalai-0.5.0-moe-expert-gradients-scaled-by-active-data-parallel-ranks.py); and sync_dp_grads skips a parameter
without a gradient on the calling rank, which pairs mismatched all-reduces where an expert is routed no token
(colossalai-0.5.0-moe-pipeline-dp-sync-skips-unrouted-experts.py): its fix (a trainable parameter without a gradient
joins the all-reduce with zeros) is applied, so only the two bugs above show.

Found by shardfuzz's colossalai-moe target (eleventh session) once it stopped refusing ep > 1 without ZeRO beside a
pipeline, which the plugin accepts (a helper writing the unrouted-expert script pointed at it):
tests/python-colossalai-moe/dp2-pp2-ep2-zero0-f32.json (layers.3 experts' down-projection gradient direction error
0.74, 431,215 x the f32 noise) and dp2-pp2-ep2-zero0-clip-f32.json (param/embed.weight 1,870 x). Here: a 2-layer
Mixtral (vocab 13, hidden 8, intermediate 12, 2 heads, 2 kv heads, 4 experts, top-2, no auxiliary loss,
initializer_range 0.2, untied embeddings), MoeHybridParallelPlugin(tp 1, pp 2 1F1B, 2 micro-batches, ep 2, ZeRO 0,
fp32) on 4 ranks (dp 2 = ep 2, moe_dp 1, x pp 2: one decoder layer per stage; ep rank 0 holds experts 0, 1, ep rank
1 experts 2, 3), the model's own loss (labels = input_ids) on a batch of 4 sequences of 4 tokens (each data-parallel
rank 2, one per micro-batch), against the same model on one device on the whole batch (with equal micro-batches and
no ignored labels the pipeline's mean of micro-batch means, averaged over dp, is the whole batch's mean).

Part 1 (default, max_norm 0): each (stage, ep rank)'s gradients after the sync, before any step, against the
reference's; an expert's three weights together, with what it equals where it is the average of two experts'.
Part 2 (CLIP=1 or --clip; fix (1) applied in both modes so that only (2) shows): max_norm 0.1, one SGD step with lr
10; the norm each rank clipped by (the optimizer's `_current_grad_norm`, beside sqrt(dense^2 + its ep rank's
experts^2) from its synced gradients), its update (its stage's parameters, its ep rank's experts) against the same
parameters' update on one device (torch.nn.utils.clip_grad_norm_, then SGD; "error": the relative error). Run:

    python -m torch.distributed.run --nproc_per_node 4 colossalai-0.5.0-moe-pipeline-dp-sync-averages-experts-over-ep.py [--fixed]
    CLIP=1 python -m torch.distributed.run --nproc_per_node 4 colossalai-0.5.0-moe-pipeline-dp-sync-averages-experts-over-ep.py [--fixed]

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai; add --master_port PORT
where 29500 is taken). On the CPU it installs the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found
beside this file in the shardfuzz checkout; none changes what Colossal-AI computes). MISMATCH: exit status 1, OK: 0;
each 20-50 s on 2 shared CPU cores.

Part 1 without --fixed: every expert's gradient is the average of its own and its partner's, to f32 rounding; the
dense parameters' gradients match (MISMATCH, exit status 1):

    Mixtral (2 layers, 4 experts, top-2), dp 2 = ep 2 (moe_dp 1) x pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32,
      seed 3, max_norm 0.0; both modes: DPGradScalerIn/Out's backward the identity,
      unrouted experts join the sync with zeros:
      stage 0, ep rank 0: layer 0 expert 0: relative error 0.714, norm 0.801x the reference's, cosine 0.706
          = (reference's experts 0 + 2) / 2, relative error 1.8e-07
      stage 0, ep rank 0: layer 0 expert 1: relative error 1.143, norm 1.145x the reference's, cosine 0.438
          = (reference's experts 1 + 3) / 2, relative error 2.0e-07
      stage 0, ep rank 1: layer 0 expert 2: relative error 0.626, norm 0.702x the reference's, cosine 0.785
          = (reference's experts 2 + 0) / 2, relative error 1.8e-07
      stage 0, ep rank 1: layer 0 expert 3: relative error 0.555, norm 0.556x the reference's, cosine 0.900
          = (reference's experts 3 + 1) / 2, relative error 2.0e-07
      stage 1, ep rank 0: layer 1 expert 0: relative error 0.726, norm 0.737x the reference's, cosine 0.690
          = (reference's experts 0 + 2) / 2, relative error 2.6e-07
      stage 1, ep rank 0: layer 1 expert 1: relative error 1.329, norm 1.245x the reference's, cosine 0.314
          = (reference's experts 1 + 3) / 2, relative error 3.6e-07
      stage 1, ep rank 1: layer 1 expert 2: relative error 0.680, norm 0.691x the reference's, cosine 0.735
          = (reference's experts 2 + 0) / 2, relative error 2.6e-07
      stage 1, ep rank 1: layer 1 expert 3: relative error 0.560, norm 0.525x the reference's, cosine 0.917
          = (reference's experts 3 + 1) / 2, relative error 3.6e-07
    MISMATCH

Part 2 without --fixed: each ep rank clips by its own, smaller, norm, its update too large by 1.9789 / its norm
(1.023x, 1.013x; MISMATCH, exit status 1):

    Mixtral (2 layers, 4 experts, top-2), dp 2 = ep 2 (moe_dp 1) x pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32,
      seed 3, max_norm 0.1, SGD lr 10.0; both modes: DPGradScalerIn/Out's backward the identity,
      unrouted experts join the sync with zeros; fix (1): experts' gradients averaged over moe_dp only:
      stage 0, ep rank 0: clipped by norm 1.9348 (dense + its experts: 1.9348); update 1.023x the reference's (error 2.28e-02)
      stage 0, ep rank 1: clipped by norm 1.9541 (dense + its experts: 1.9541); update 1.013x the reference's (error 1.27e-02)
      stage 1, ep rank 0: clipped by norm 1.9348 (dense + its experts: 1.9348); update 1.023x the reference's (error 2.28e-02)
      stage 1, ep rank 1: clipped by norm 1.9541 (dense + its experts: 1.9541); update 1.013x the reference's (error 1.27e-02)
      one device: norm 1.9789 (clip_grad_norm_; dense + every expert: 1.9789)
    MISMATCH

With `--fixed`, fix (1) (sync_dp_grads averages an expert's gradient over its MoE block's moe_dp_group, the rest over
dp_group) and fix (2) (_compute_grad_norm sums each expert gradient's squared norm over its param.ep_group before
adding it) are monkeypatched in, and both parts print OK (exit status 0):

    Mixtral (2 layers, 4 experts, top-2), dp 2 = ep 2 (moe_dp 1) x pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32,
      seed 3, max_norm 0.0, fixed; both modes: DPGradScalerIn/Out's backward the identity,
      unrouted experts join the sync with zeros:
      every gradient matches the single-device run's
    OK

    Mixtral (2 layers, 4 experts, top-2), dp 2 = ep 2 (moe_dp 1) x pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32,
      seed 3, max_norm 0.1, SGD lr 10.0, fixed; both modes: DPGradScalerIn/Out's backward the identity,
      unrouted experts join the sync with zeros; fix (1): experts' gradients averaged over moe_dp only:
      stage 0, ep rank 0: clipped by norm 1.9789 (dense + its experts: 1.9348); update 1.000x the reference's (error 2.44e-07)
      stage 0, ep rank 1: clipped by norm 1.9789 (dense + its experts: 1.9541); update 1.000x the reference's (error 2.39e-07)
      stage 1, ep rank 0: clipped by norm 1.9789 (dense + its experts: 1.9348); update 1.000x the reference's (error 3.01e-07)
      stage 1, ep rank 1: clipped by norm 1.9789 (dense + its experts: 1.9541); update 1.000x the reference's (error 3.19e-07)
      one device: norm 1.9789 (clip_grad_norm_; dense + every expert: 1.9789)
    OK
"""
import copy
import datetime
import inspect
import os
import re
import sys
import textwrap

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))

SEED = int(os.environ.get("SEED", 3))  # the batch's seed
EXPERTS, TOP_K, EP, MICROBATCHES = 4, 2, 2, 2
CLIP = "--clip" in sys.argv or os.environ.get("CLIP", "0") not in ("", "0")
FIXED = "--fixed" in sys.argv
MAX_NORM, LR = (0.1, 10.0) if CLIP else (0.0, 1.0)
RTOL, ATOL = 1e-4, 1e-6  # fp32: |got - reference| <= RTOL |reference| + ATOL


def neutralise_dp_grad_scalers():
    """Both modes: DPGradScalerIn/Out's backward as the identity (their forward already is; with moe_dp 1 they do
    nothing anyway), the fix of colossalai-0.5.0-moe-expert-gradients-scaled-by-active-data-parallel-ranks.py."""
    from colossalai.moe import _operation

    def identity(ctx, *grad_outputs):
        return grad_outputs[0], None, None

    _operation.DPGradScalerIn.backward = staticmethod(identity)
    _operation.DPGradScalerOut.backward = staticmethod(identity)


def expert_dp_group(wrapper, p):
    """Fix (1): the group an expert's gradient is averaged over: its MoE block's moe_dp_group (others: dp_group)."""
    if not hasattr(p, "ep_group"):
        return wrapper.dp_group
    groups = wrapper.__dict__.get("_expert_dp_groups")
    if groups is None:
        groups = {id(q): m.moe_dp_group for m in wrapper.module.modules() if hasattr(m, "moe_dp_group")
                  for q in m.parameters() if hasattr(q, "ep_group")}
        wrapper.__dict__["_expert_dp_groups"] = groups
    return groups.get(id(p), wrapper.dp_group)


def install_sync_dp_grads(fix_expert_group):
    """HybridParallelModule.sync_dp_grads as released (hybrid_parallel_plugin.py:161-183), in BOTH modes with the fix of
    colossalai-0.5.0-moe-pipeline-dp-sync-skips-unrouted-experts.py (a trainable parameter without a gradient joins
    the all-reduce with zeros), and with fix (1) where fix_expert_group (experts averaged over moe_dp only)."""
    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelModule

    def sync_dp_grads(self):
        if self.dp_group.size() == 1:
            return
        for p in self.module.parameters():
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)  # (the unrouted-expert fix, both modes)
            if p.grad is not None:
                group = expert_dp_group(self, p) if fix_expert_group else self.dp_group
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(group.size())

    HybridParallelModule.sync_dp_grads = sync_dp_grads


def over_ep(param, exponentiated):
    """Fix (2): an expert gradient's squared norm summed over its expert-parallel group."""
    group = getattr(param, "ep_group", None)
    if group is None or dist.get_world_size(group) == 1:
        return exponentiated
    total = torch.tensor([float(exponentiated)], dtype=torch.float64)
    dist.all_reduce(total, group=group)
    return total.item()


def fix_clip_norm():
    """Fix (2): _compute_grad_norm of both ZeRO-0 optimizers recompiled (in their module's globals) with its one
    accumulation line replaced by one that first sums an expert's term over its ep group."""
    from colossalai.booster.plugin import hybrid_parallel_plugin as module

    old = "total_norm_exponentiated += grad_norm_exponentiated\n"
    new = "total_norm_exponentiated += _over_ep(grad_to_param_mapping[id(grad)], grad_norm_exponentiated)\n"
    module._over_ep = over_ep
    for cls in (module.HybridParallelNaiveOptimizer, module.HybridParallelAMPOptimizer):
        source = textwrap.dedent(inspect.getsource(cls._compute_grad_norm))
        assert source.count(old) == 1, "the released _compute_grad_norm has changed"
        namespace = {}
        exec(compile(source.replace(old, new), inspect.getsourcefile(module), "exec"), module.__dict__, namespace)
        cls._compute_grad_norm = namespace["_compute_grad_norm"]


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=EXPERTS,
                           num_experts_per_tok=TOP_K, output_router_logits=False, router_aux_loss_coef=0.0,
                           tie_word_embeddings=False, initializer_range=0.2, _attn_implementation="eager")
    torch.manual_seed(0)
    return MixtralForCausalLM(config).float()


def batch():
    """4 sequences of 4 tokens; data-parallel rank r gets rows 2r, 2r + 1 (one per micro-batch)."""
    ids = torch.randint(0, 13, (2 * EP, 4), generator=torch.Generator().manual_seed(SEED))
    return ids, [ids[2 * r:2 * r + 2] for r in range(EP)]


def pipeline_run(model, rows):
    """One 1F1B pass over this data-parallel rank's rows (and, with CLIP, one step). Returns (stage, ep rank,
    {name: gradient after the sync}, {name: update}, the norm the optimizer clipped by)."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin

    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=2, ep_size=EP, zero_stage=0, precision="fp32",
                                     num_microbatches=MICROBATCHES, pp_style="1f1b", max_norm=MAX_NORM,
                                     enable_metadata_cache=False, overlap_p2p=False)
    booster = Booster(plugin=plugin)
    boosted, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=LR))
    assert dist.get_world_size(plugin.dp_group) == EP and dist.get_world_size(plugin.moe_dp_group) == 1
    dp_rank = dist.get_rank(plugin.dp_group)  # (= its rank in ep_group: moe_dp is 1)
    ids = rows[dp_rank]
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    booster.execute_pipeline(iter([data]), boosted, lambda outputs, _: outputs.loss, opt, return_loss=True)
    named = dict(boosted.unwrap().named_parameters())  # (this stage's parameters, its ep rank's experts)
    grads = {n: p.grad.detach().clone() for n, p in named.items()}
    before = {n: p.detach().clone() for n, p in named.items()}
    opt.step()
    update = {n: p.detach() - before[n] for n, p in named.items()}
    return plugin.stage_manager.stage, dist.get_rank(plugin.ep_group), grads, update, opt._current_grad_norm


def expert_key(name):
    m = re.match(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(.*)", name)
    return (int(m[1]), int(m[2]), m[3]) if m else None


def relative(got, want):
    return float((got - want).norm() / want.norm())


def compare_grads(grads, expected):
    """Lines for this rank's gradients that differ from the reference's; an expert's three weights together, with the
    average of it and its partner (the expert at its local index on the other ep rank) where that is what it got."""
    groups = {}
    for name, got in grads.items():
        key = expert_key(name)
        groups.setdefault(key[:2] if key else name, []).append(name)
    lines = []
    for key, names in groups.items():
        got = torch.cat([grads[n].flatten() for n in names])
        want = torch.cat([expected[n].flatten() for n in names])
        if (got - want).norm() <= RTOL * want.norm() + ATOL:
            continue
        cos = float(torch.nn.functional.cosine_similarity(got, want, dim=0))
        line = (f"{'layer %d expert %d' % key if isinstance(key, tuple) else key}: relative error "
                f"{relative(got, want):.3f}, norm {got.norm() / want.norm():.3f}x the reference's, cosine {cos:.3f}")
        if isinstance(key, tuple):
            partner = (key[1] + EXPERTS // EP) % EXPERTS
            other = [n.replace(f".experts.{key[1]}.", f".experts.{partner}.") for n in names]
            mix = (want + torch.cat([expected[n].flatten() for n in other])) / 2
            line += f"\n      = (reference's experts {key[1]} + {partner}) / 2, relative error {relative(got, mix):.1e}"
        lines.append(line)
    return lines


def squared_norms(grads):
    """(dense, this rank's experts) squared gradient norms."""
    dense = sum(float(g.double().norm() ** 2) for n, g in grads.items() if not expert_key(n))
    return dense, sum(float(g.double().norm() ** 2) for n, g in grads.items() if expert_key(n))


def reference_run(reference, ids):
    """One device, the whole batch: gradients, then (CLIP) clip_grad_norm_ and one SGD step. Returns (grads, update,
    norm)."""
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    reference(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in reference.named_parameters()}
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM if CLIP else float("inf"))
    torch.optim.SGD(reference.parameters(), lr=LR).step()
    return grads, {n: p.detach() - initial[n] for n, p in reference.named_parameters()}, float(norm)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    neutralise_dp_grad_scalers()
    install_sync_dp_grads(fix_expert_group=FIXED or CLIP)
    if FIXED:
        fix_clip_norm()
    assert dist.get_world_size() == 2 * EP, "run with --nproc_per_node 4 (dp 2 = ep 2, x pp 2)"
    reference = mixtral()
    model = copy.deepcopy(reference)
    ids, rows = batch()
    stage, ep_rank, grads, update, norm = pipeline_run(model, rows)
    ref_grads, ref_update, ref_norm = reference_run(reference, ids)
    if CLIP:
        got = torch.cat([update[n].flatten() for n in update])
        want = torch.cat([ref_update[n].flatten() for n in update])
        row = (stage, ep_rank, norm, squared_norms(grads), relative(got, want), float(got.norm() / want.norm()))
    else:
        row = (stage, ep_rank, compare_grads(grads, ref_grads))
    rows_out = [None] * dist.get_world_size()
    dist.all_gather_object(rows_out, row)
    if CLIP:
        wrong = any(abs(r[2] - ref_norm) > RTOL * ref_norm or r[4] > RTOL for r in rows_out)
    else:
        wrong = any(r[2] for r in rows_out)
    if dist.get_rank() == 0:
        print_header()
        (print_clip if CLIP else print_grads)(sorted(rows_out), ref_norm)
        print("MISMATCH" if wrong else "OK")
    dist.destroy_process_group()
    return 1 if wrong else 0


def print_header():
    print(f"Mixtral (2 layers, {EXPERTS} experts, top-{TOP_K}), dp 2 = ep 2 (moe_dp 1) x pp 2 (1F1B, {MICROBATCHES} "
          f"micro-batches), ZeRO 0, fp32,\n  seed {SEED}, max_norm {MAX_NORM}" + (f", SGD lr {LR}" if CLIP else "")
          + (", fixed" if FIXED else "") + "; both modes: DPGradScalerIn/Out's backward the identity,\n"
          + "  unrouted experts join the sync with zeros"
          + ("; fix (1): experts' gradients averaged over moe_dp only" if CLIP else "") + ":")


def print_grads(rows, _):
    for stage, ep_rank, lines in rows:
        for line in lines:
            print(f"  stage {stage}, ep rank {ep_rank}: {line}")
    if not any(lines for _, _, lines in rows):
        print("  every gradient matches the single-device run's")


def print_clip(rows, ref_norm):
    dense = sum(r[3][0] for r in rows if r[1] == 0)  # (the dense gradients, both stages, once)
    for stage, ep_rank, norm, _, error, ratio in rows:
        own = sum(r[3][1] for r in rows if r[1] == ep_rank)
        print(f"  stage {stage}, ep rank {ep_rank}: clipped by norm {norm:.4f} (dense + its experts: "
              f"{(dense + own) ** 0.5:.4f}); update {ratio:.3f}x the reference's (error {error:.2e})")
    every = sum(r[3][1] for r in rows)
    print(f"  one device: norm {ref_norm:.4f} (clip_grad_norm_; dense + every expert: {(dense + every) ** 0.5:.4f})")


if __name__ == "__main__":
    sys.exit(main())
