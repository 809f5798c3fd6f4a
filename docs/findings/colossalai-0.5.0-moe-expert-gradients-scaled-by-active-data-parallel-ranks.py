#!/usr/bin/env python3
"""Colossal-AI 0.5.0: MoeHybridParallelPlugin scales an expert's gradient by moe_dp_size / (the data-parallel ranks on
which the expert received a token).

The expert-parallel MoE blocks of shardformer (EPMixtralSparseMoeBlock, and DeepSeek's and DeepSeek-V3's, through
`colossalai.moe._operation.DPGradScalerIn` / `DPGradScalerOut`) count, for each local expert, the ranks of the MoE
data-parallel group on which it was routed at least one token (`activate_experts`, all-reduced over moe_dp_group),
and multiply the gradient flowing into the expert's output by moe_dp_size / that count (dividing it back on the
expert's input). The expert's weight gradients are then averaged over the moe_dp group like every other gradient, so
an expert that received tokens on k of the group's n ranks ends with n / k times the gradient of the same model
trained on one device (or with any other data-parallel degree): silently, only where routing is uneven across the
ranks, which in real training is most steps for some experts. Every other parameter is right.

Found by a hand-written differential probe written while looking at Colossal-AI's MoE plugin for shardfuzz (which has
no Colossal-AI MoE target yet): a 1-layer Mixtral (hidden 8, 4 or 8 experts, top-1, no auxiliary loss), fp32,
MoeHybridParallelPlugin(tp 1, pp 1, ep 1, ZeRO 0: DDP over 2 ranks), one SGD step with lr 1 on a batch of 4
sequences, against the same model trained on one device on the whole batch. Run:

    python -m torch.distributed.run --nproc_per_node 2 colossalai-0.5.0-moe-expert-gradients-scaled-by-active-data-parallel-ranks.py

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai). On the CPU it installs
the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found beside this file in the shardfuzz checkout;
none changes what Colossal-AI computes). Prints each parameter whose update differs from the reference's and
MISMATCH (exit status 1): with 4 experts, expert 3's three weights updated 2.000x the reference's (it is routed tokens
on one of the two ranks); with 8 experts, experts 5 and 6. With `--fixed` (the scalers made the identity: every rank's
contribution is already its share of the average) every parameter matches: OK.

Also seen: with ep_size > 1 and ZeRO stage 0 the plugin's configure() means to refuse ("if pytorch DDP is used,
dp_group and moe_dp_group are expected to be the same ...") but the message names an undefined `dp_group` and the
refusal is a NameError (moe_hybrid_parallel_plugin.py:454).
"""
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))


def fix():
    """The scalers as the identity (their forward already is)."""
    from colossalai.moe import _operation

    def identity(ctx, *grad_outputs):
        return grad_outputs[0], None, None

    _operation.DPGradScalerIn.backward = staticmethod(identity)
    _operation.DPGradScalerOut.backward = staticmethod(identity)


def main(experts=int(os.environ.get("EXPERTS", 4))):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    if "--fixed" in sys.argv:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin
    from transformers import MixtralConfig, MixtralForCausalLM

    rank, world = dist.get_rank(), dist.get_world_size()
    config = MixtralConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=experts,
                           num_experts_per_tok=1, output_router_logits=False, router_aux_loss_coef=0.0,
                           tie_word_embeddings=False, _attn_implementation="eager")
    torch.manual_seed(0)
    reference = MixtralForCausalLM(config).float()
    model = copy.deepcopy(reference)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    ids = torch.randint(0, 16, (2 * world, 4), generator=torch.Generator().manual_seed(1))
    rows = [ids[2 * r:2 * r + 2] for r in range(world)]

    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=1, zero_stage=0, precision="fp32", max_norm=0.0,
                                     enable_metadata_cache=False, overlap_p2p=False)
    booster = Booster(plugin=plugin)
    model, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=1.0))
    booster.backward(model(input_ids=rows[rank], labels=rows[rank]).loss, opt)
    opt.step()

    # The reference: one device, the whole batch; the loss the mean of the ranks' (equal-sized) losses.
    reference_opt = torch.optim.SGD(reference.parameters(), lr=1.0)
    (sum(reference(input_ids=x, labels=x).loss for x in rows) / world).backward()
    reference_opt.step()

    trained = dict(model.unwrap().named_parameters())
    wrong = []
    for name, p in reference.named_parameters():
        expected, got = p.detach() - initial[name], trained[name].detach() - initial[name]
        error = ((got - expected).norm() / expected.norm()).item()
        if error > 1e-4:
            wrong.append(f"  {name}: updated {(got.norm() / expected.norm()).item():.3f}x the reference's")
    if rank == 0:
        print(f"{experts} experts, dp {world} (moe_dp {world}), ZeRO 0, fp32:")
        print("\n".join(wrong) if wrong else "  every parameter's update matches the single-device run's")
        print("MISMATCH" if wrong else "OK")
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
