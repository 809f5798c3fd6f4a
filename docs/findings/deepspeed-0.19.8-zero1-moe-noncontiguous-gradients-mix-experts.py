"""DeepSpeed 0.19.8: ZeRO-1 with MoE and `contiguous_gradients: false` sums the gradients of different experts.

ZeRO-1 allows MoE without contiguous gradients, with a warning ("ZeRO Stage 1 has not been thoroughly tested with MoE.
This configuration is still experimental", stage_1_and_2.py:866-869; ZeRO-2 refuses the combination). Without
contiguous gradients `reduce_ipg_grads` reduces every gradient of its bucket through `buffered_reduce_fallback`
(stage_1_and_2.py:2237) -> `allreduce_no_retain` with no process group, i.e. over the whole data-parallel group
(:2369). Expert parameters are not replicas over that group: with expert parallelism each rank holds other experts, so
rank 0's expert-0 gradient is added to rank 1's expert-1 gradient and each rank steps its expert on the mixture. The
contiguous path (`average_tensor`) reduces each expert parameter group over its expert-data-parallel group
(`real_dp_process_group`), averaged over the data-parallel size as the engine does for experts.

Found by shardfuzz (deepspeed-zero target, campaign 253): a dp2 ep2 ZeRO-1 bf16 MoE case with `contiguous_grads:
false` diverged (expert gradients 12x the bf16 noise); in f32 the expert gradients came out with an error of the
order of their own size (2 million eps), the shared parameters exact, and everything passes with contiguous
gradients, at ZeRO-0, with ep 1, or with the fix below.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero1-moe-noncontiguous-gradients-mix-experts.py [--fixed]
(CPU, gloo; one expert per rank; `--fixed` reduces expert gradients over their expert-data-parallel group). Prints
each rank's expert weight after one SGD step without contiguous gradients against with them, then MISMATCH or OK on
rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()

if "--fixed" in sys.argv:
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Zero

    reduce_ipg_grads, fallback = Zero.reduce_ipg_grads, Zero.buffered_reduce_fallback

    def reduce_ipg_grads_fixed(self, comm_dtype=None):
        self._expert_groups = {}
        if not self.contiguous_gradients and getattr(self, "has_moe_layers", False):
            for bucket in self.ipg_buckets.values():
                for grad, (i, _, _) in zip(bucket.grads, bucket.params):
                    if self.is_moe_param_group[i]:
                        self._expert_groups[id(grad)] = self.real_dp_process_group[i]
        return reduce_ipg_grads(self, comm_dtype)

    def buffered_reduce_fallback_fixed(self, rank, grads, communication_data_type, elements_per_buffer=500000000,
                                       log=None):
        experts = getattr(self, "_expert_groups", {})
        for g in grads:
            if id(g) in experts:
                # Averaged over the whole data-parallel group, as average_tensor and the engine average expert
                # gradients ("to maintain the gradients value unaffected by ep_size"), summed over the expert group.
                g.div_(dist.get_world_size(group=self.dp_process_group) / float(self.sequence_parallel_size))
                self.allreduce_no_retain([g], communication_data_type, numel_per_bucket=elements_per_buffer,
                                         rank=rank, log=log, divide=False, process_group=experts[id(g)])
        rest = [g for g in grads if id(g) not in experts]
        if rest:
            fallback(self, rank, rest, communication_data_type, elements_per_buffer=elements_per_buffer, log=log)

    Zero.reduce_ipg_grads, Zero.buffered_reduce_fallback = reduce_ipg_grads_fixed, buffered_reduce_fallback_fixed


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.moe = MoE(hidden_size=4, expert=torch.nn.Linear(4, 4), num_experts=WORLD, ep_size=WORLD, k=1,
                       use_rts=False, drop_tokens=False)

    def forward(self, x):
        return self.moe(x)[0]


def expert_after_one_step(contiguous):
    """This rank's expert weight after one SGD step of ZeRO-1 over dp = ep = WORLD ranks (each on its own tokens)."""
    torch.manual_seed(0)
    model = Model()
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "all"})
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": 1, "contiguous_gradients": contiguous}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(groups, lr=0.5), config=cfg)
    torch.manual_seed(1 + RANK)
    engine.backward(engine(torch.randn(1, 8, 4)).pow(2).sum())
    engine.step()
    weight = dict(engine.module.named_parameters())["moe.deepspeed_moe.experts.deepspeed_experts.0.weight"]
    out = weight.detach().clone()
    engine.destroy()
    return out


reference, mixed = expert_after_one_step(True), expert_after_one_step(False)
errors = [torch.zeros(()) for _ in range(WORLD)]
dist.all_gather(errors, (mixed - reference).norm() / reference.norm())
if RANK == 0:
    print("|expert weight (contiguous_gradients false) - (true)| / |(true)| per rank after one step:",
          ", ".join(f"{float(e):.3e}" for e in errors))
    print("MISMATCH" if max(float(e) for e in errors) > 1e-6 else "OK")
