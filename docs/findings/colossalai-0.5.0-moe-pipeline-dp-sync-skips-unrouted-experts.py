#!/usr/bin/env python3
"""Colossal-AI 0.5.0: HybridParallelModule.sync_dp_grads all-reduces only the parameters that have a gradient on the
calling rank, so where a MoE expert is routed no token on one data-parallel rank the ranks' all-reduces pair up
different experts' gradients (or abort in gloo, or hang).

DOCSTRING_TAIL
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
                lines.append(f"{key}: no gradient (reference's norm {want.norm():.4g})")
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
          f"ZeRO 0, fp32, batch seed {SEED}; DPGradScalerIn/Out neutralised:")
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
