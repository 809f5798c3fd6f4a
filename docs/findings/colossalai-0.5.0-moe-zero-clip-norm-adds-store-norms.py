#!/usr/bin/env python3
"""Colossal-AI 0.5.0: with ep_size > 1, MoeHybridParallelPlugin's ZeRO optimizer clips by the sum of the dense and the
expert gradients' L2 norms, the experts' counted on each expert-parallel rank for its own experts only.

MoeHybridParallelZeroOptimizer (booster/plugin/moe_hybrid_parallel_plugin.py:39-107) hands LowLevelZeroOptimizer two
parameter lists (`pg_param_list`, 66-75): the dense parameters over the whole data-parallel group and the experts over
moe_dp_group (with ep 1 both are the same group and there is one list); LowLevelZeroOptimizer keeps a gradient store
for each (zero/low_level/low_level_optim.py:184-189). Its step (527-) then takes the norm of each store and ADDS them,
`norm_group += self._compute_grad_norm(dp_pg=grad_store.torch_pg, gradients=working_grads)` (572-575), where the
norms of disjoint sets of gradients combine in quadrature, sqrt(a^2 + b^2); and the experts' norm
(HybridParallelZeroOptimizer._compute_grad_norm, booster/plugin/hybrid_parallel_plugin.py:842-925) is all-reduced over
the store's group (moe_dp), tp and pp (911-921), never over the expert-parallel group whose other ranks hold the other
experts. The norm step records (`_current_grad_norm`, 583-584) and clips by (`_unscale_and_clip_grads`, 702-716) is
too large, and different on each ep rank: whenever max_norm clips, each rank's update is too small by (the model's
norm / its norm), a different factor on each rank. (The norm `get_grad_norm()` reports is the same wrong one.)

Found by reading LowLevelZeroOptimizer.step while analysing shardfuzz's colossalai-moe findings (clipping bugs of the
MoE plugin), confirmed by colossalai-moe on tests/python-colossalai-moe/dp2-ep2-zero1-clip-f16.json (final parameters
8-21 x the f16 noise; passes with the fix) -- in bf16 the same case passes shardfuzz's oracle (3.3 x), a miss. Here: a
2-layer Mixtral (vocab 13, hidden 8, 4 experts, top-2, no auxiliary loss; initializer_range 0.2, so that the experts'
gradients are not negligible beside the dense ones), MoeHybridParallelPlugin(tp 1, pp 1, ep 2, ZeRO 1, bf16, max_norm
0.1) on 2 ranks (dp 2 x ep 2, moe_dp 1), one SGD step (lr 1) with the model's own loss on a batch of 4 sequences split
over the 2 data-parallel ranks, against the same model on one device in fp32 on the whole batch with
torch.nn.utils.clip_grad_norm_(max_norm 0.1). bf16 has no loss scale: the norm the optimizer records is the
gradient's own. A separate bug scales expert gradients when moe_dp > 1 (colossalai.moe._operation.DPGradScalerIn/Out,
colossalai-0.5.0-moe-expert-gradients-scaled-by-active-data-parallel-ranks.py); with moe_dp 1 it does not act, but
both runs here make those scalers the identity anyway, as that script's --fixed does. Run:

    python -m torch.distributed.run --nproc_per_node 2 colossalai-0.5.0-moe-zero-clip-norm-adds-store-norms.py [--fixed]

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai). On the CPU it installs
the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found beside this file in the shardfuzz checkout;
none changes what Colossal-AI computes). Prints per rank the norms of its two stores, the norm it clipped by, and the
update of the fp32 master shards it owns (ZeRO 1: the dense parameters' half of it, its experts whole; each rank steps
its shards by its own clipping factor) against the same shards of the reference's update (from the bf16-rounded start
the masters begin at); the one-device norm; and MISMATCH (exit status 1):

    Mixtral, dp 2 x ep 2 (moe_dp 1), ZeRO 1, bf16, max_norm 0.1:
      rank 0: its stores' norms (dense, its experts) 1.4723 + 0.2390; clipped by norm 1.7112
              its fp32 master shards (29 parameters) updated 0.911x the reference's (relative error 0.089)
      rank 1: its stores' norms (dense, its experts) 1.4723 + 0.4524; clipped by norm 1.9246
              its fp32 master shards (29 parameters) updated 0.809x the reference's (relative error 0.191)
      one device: norm 1.5625 (clip_grad_norm_)
    MISMATCH

(the model's norm in bf16 is sqrt(1.4723^2 + 0.2390^2 + 0.4524^2) = 1.5587; each rank clipped by 1.4723 + its own
experts' norm, and its shards moved by about 1.5625 / that norm: 0.913 and 0.812. The stores' norms printed are what
step's calls of _compute_grad_norm returned.)

With `--fixed` (step's norm loop patched: the stores' norms combined in quadrature, the experts' squared norm first
summed over their expert-parallel group) every rank clips by the model's norm and every update matches the reference
within bf16's rounding: OK (exit status 0):

    Mixtral, dp 2 x ep 2 (moe_dp 1), ZeRO 1, bf16, max_norm 0.1:
      rank 0: its stores' norms (dense, its experts) 1.4723 + 0.2390; clipped by norm 1.5586
              its fp32 master shards (29 parameters) updated 1.001x the reference's (relative error 0.012)
      rank 1: its stores' norms (dense, its experts) 1.4723 + 0.4524; clipped by norm 1.5586
              its fp32 master shards (29 parameters) updated 0.999x the reference's (relative error 0.013)
      one device: norm 1.5625 (clip_grad_norm_)
    OK
"""
import copy
import datetime
import inspect
import os
import sys
import textwrap

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))

MAX_NORM = 0.1
NORM_RTOL = 0.02  # each rank's clipping norm against the one-device norm
UPDATE_RTOL = 0.05  # |update - reference update| / |reference update| on each rank (bf16 gradients: about 1 %)


def neutralise_dp_grad_scalers():
    """The separate moe_dp > 1 bug's scalers as the identity (their forward already is; with moe_dp 1 a no-op)."""
    from colossalai.moe import _operation

    def identity(ctx, *grad_outputs):
        return grad_outputs[0], None, None

    _operation.DPGradScalerIn.backward = staticmethod(identity)
    _operation.DPGradScalerOut.backward = staticmethod(identity)


def fixed_store_norm(opt, store, grads):
    """One store's norm; for the experts' store the squared norm summed over the experts' ep group."""
    from colossalai.tensor.moe_tensor.api import get_ep_group, is_moe_tensor

    norm = opt._compute_grad_norm(dp_pg=store.torch_pg, gradients=grads)
    experts = [p for p in opt.pg_to_param_list.get(store.torch_pg, ()) if is_moe_tensor(p)]
    ep = get_ep_group(experts[0]) if experts else None
    if ep is not None and dist.get_world_size(ep) > 1:
        squared = torch.tensor([float(norm) ** 2], dtype=torch.float64)
        dist.all_reduce(squared, group=ep)
        norm = squared.item() ** 0.5
    return norm


def fix():
    """LowLevelZeroOptimizer.step recompiled with its one norm line replaced (in its module's globals)."""
    from colossalai.zero.low_level import low_level_optim as module

    cls = module.LowLevelZeroOptimizer
    old = "norm_group += self._compute_grad_norm(dp_pg=grad_store.torch_pg, gradients=working_grads)\n"
    new = "norm_group = (norm_group**2 + _fixed_store_norm(self, grad_store, working_grads) ** 2) ** 0.5\n"
    source = textwrap.dedent(inspect.getsource(cls.step))
    assert source.count(old) == 1, "the released LowLevelZeroOptimizer.step has changed"
    module._fixed_store_norm = fixed_store_norm
    namespace = {}
    exec(compile(source.replace(old, new), inspect.getsourcefile(module), "exec"), module.__dict__, namespace)
    cls.step = namespace["step"]


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           output_router_logits=False, router_aux_loss_coef=0.0, tie_word_embeddings=False,
                           initializer_range=0.2, _attn_implementation="eager")
    torch.manual_seed(0)
    return MixtralForCausalLM(config).float()


def reference_step(reference, ids):
    """One device, fp32: the whole batch's loss, clip_grad_norm_, one SGD step. Returns the norm before clipping."""
    reference(input_ids=ids, labels=ids).loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    return float(norm)


def own_shards(cuts, tensors):
    """{name: this rank's ZeRO shard of tensors[name], flat}; cuts[name] = (group size, rank in it) of its store."""
    shards = {}
    for name, (world, rank) in cuts.items():
        flat = tensors[name].detach().float().flatten()
        flat = torch.nn.functional.pad(flat, [0, (world - flat.numel() % world) % world])  # (as ZeRO pads it)
        shards[name] = flat.chunk(world)[rank]
    return shards


def sharded_step(model, ids):
    """Returns this rank's (stores' norms, clipping norm, {name: its fp32 master shard's update}, cuts): ZeRO 1
    updates each shard on one rank, by that rank's clipping factor; own_shards(cuts, ...) cuts tensors the same way."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin

    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=2, zero_stage=1, precision="bf16",
                                     max_norm=MAX_NORM, enable_metadata_cache=False, overlap_p2p=False)
    booster = Booster(plugin=plugin)
    boosted, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=1.0))
    store_norms, compute = [], opt._compute_grad_norm  # (recorded: the norm of each store, in step's order)
    opt._compute_grad_norm = lambda **kw: store_norms.append(compute(**kw)) or store_norms[-1]
    named = dict(boosted.unwrap().named_parameters())  # (this rank's: the dense ones and its own experts)
    groups = {n: opt.param_to_pg[p] for n, p in named.items()}  # (its store's group: dp, or moe_dp for experts)
    cuts = {n: (dist.get_world_size(g), dist.get_rank(g)) for n, g in groups.items()}
    start = own_shards(cuts, named)  # (the fp32 masters start from the bf16 working parameters)
    rows = ids[2 * dist.get_rank():2 * dist.get_rank() + 2]
    booster.backward(boosted(input_ids=rows, labels=rows).loss, opt)
    opt.step()
    update = {n: opt.working_to_master_param[id(p)].detach().float() - start[n] for n, p in named.items()}
    return store_norms, float(opt._current_grad_norm), update, cuts


def compare(got, want):
    """(relative error, norm ratio) of this rank's shards' update against the same shards of the reference's."""
    got, want = torch.cat([got[n] for n in got]), torch.cat([want[n] for n in got])
    return float((got - want).norm() / want.norm()), float(got.norm() / want.norm())


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    neutralise_dp_grad_scalers()
    if "--fixed" in sys.argv:
        fix()
    rank = dist.get_rank()
    reference = mixtral()
    model = copy.deepcopy(reference)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    ids = torch.randint(0, 13, (4, 6), generator=torch.Generator().manual_seed(1))

    store_norms, norm, update, cuts = sharded_step(model, ids)
    reference_norm = reference_step(reference, ids)
    want = own_shards(cuts, {n: p.detach() - initial[n] for n, p in reference.named_parameters()})
    error, ratio = compare(update, want)
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (rank, store_norms, norm, error, ratio, len(update)))
    wrong = any(abs(n - reference_norm) > NORM_RTOL * reference_norm or e > UPDATE_RTOL for _, _, n, e, _, _ in rows)
    if rank == 0:
        print(f"Mixtral, dp 2 x ep 2 (moe_dp 1), ZeRO 1, bf16, max_norm {MAX_NORM}:")
        for r, stores, n, e, q, count in rows:
            parts = " + ".join(f"{s:.4f}" for s in stores)
            print(f"  rank {r}: its stores' norms (dense, its experts) {parts}; clipped by norm {n:.4f}")
            print(f"          its fp32 master shards ({count} parameters) updated {q:.3f}x the reference's"
                  f" (relative error {e:.3f})")
        print(f"  one device: norm {reference_norm:.4f} (clip_grad_norm_)")
        print("MISMATCH" if wrong else "OK")
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
