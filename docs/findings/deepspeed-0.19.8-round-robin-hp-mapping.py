"""DeepSpeed 0.19.8: with ZeRO-1/2 `round_robin_gradients`, safe_get_full_fp32_param / safe_get_full_grad (and
everything else built on the low-to-high precision fragment mapping) return another parameter's values.

`round_robin_gradients` reorders each parameter group (`_round_robin_reorder`) and flattens it in that order
(stage_1_and_2.py:469-520), so the fp32 partitions and the reduced-gradient lists follow the round-robin order.
`_link_all_hp_params` (stage_1_and_2.py:824) passes that layout's offsets to `link_hp_params` only when some
parameter carries alignment padding (`if any(self.round_robin_bit16_padding[i])`); with no padding it passes
`param_offsets=None`, and `_init_lp_to_hp_mapping` (utils/mixed_precision_linkage.py:73) then accumulates the
offsets in *model* order. Each parameter is linked to the fragment of whichever parameter sits at its model-order
offset: equal-sized parameters silently read each other's master weights and gradients; differently sized ones
raise "The size of tensor a (..) must match the size of tensor b (..)" in get_full_hp_grad. Training itself
(the flat partitions) is unaffected; what reads or writes a single parameter's fp32 value or gradient is not:
safe_get_full_fp32_param / safe_set_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state and the
universal checkpoint, which is built on the same mapping.

Found by shardfuzz (deepspeed-zero target) on its first cases with the case field
`parallel.round_robin_grads` (dp2, ZeRO-1 and -2, f32 and bf16: a crash in get_full_hp_grad at step 0; the same
cases without it pass).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-round-robin-hp-mapping.py [--fixed]
(CPU, gloo; `--fixed` passes the round-robin offsets whenever the order is round robin). Prints MISMATCH or OK
on rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()

if "--fixed" in sys.argv:
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from deepspeed.utils import link_hp_params

    def _link_all_hp_params(self):
        if self.cpu_offload:
            self._get_offload_gradient_dict()
        for i, _ in enumerate(self.optimizer.param_groups):
            group = self.real_dp_process_group[i]
            size = self.bit16_groups_flat[i].numel() // dist.get_world_size(group=group)
            offsets = None
            if self.round_robin_gradients or any(self.round_robin_bit16_padding[i]):
                by_param = {id(p): o for p, o in zip(self.round_robin_bit16_groups[i], self.round_robin_bit16_offsets[i])}
                offsets = [by_param[id(p)] for p in self.bit16_groups[i]]
            link_hp_params(lp_param_list=self.bit16_groups[i], flat_hp_partition=self.single_partition_of_fp32_groups[i],
                           gradient_dict=self.averaged_gradients, offload_gradient_dict=self.offload_gradient_dict,
                           use_offload=self.cpu_offload, param_group_index=i, partition_start=dist.get_rank(group) * size,
                           partition_size=size, dp_group=group, param_offsets=offsets)

    DeepSpeedZeroOptimizer._link_all_hp_params = _link_all_hp_params


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4, bias=False) for _ in range(4)])


X = torch.randn(WORLD, 3, 4, generator=torch.Generator().manual_seed(1))


def read_back(round_robin):
    """Each parameter's fp32 master value and reduced gradient as DeepSpeed reports them after one backward."""
    m = model()
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "zero_optimization": {"stage": 1, "round_robin_gradients": round_robin}, "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), config=cfg)
    engine.backward(engine(X[RANK]).pow(2).sum())
    return [(safe_get_full_fp32_param(p), safe_get_full_grad(p)) for p in engine.module.parameters()]


reference = model()
(sum(reference(X[r]).pow(2).sum() for r in range(WORLD)) / WORLD).backward()
expected = [(p.detach(), p.grad) for p in reference.parameters()]
bad = []
for round_robin in (False, True):
    for i, ((value, grad), (want_value, want_grad)) in enumerate(zip(read_back(round_robin), expected)):
        for what, got, want in (("fp32 param", value, want_value), ("grad", grad, want_grad)):
            if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
                bad.append(f"round_robin_gradients={round_robin}: layer {i} {what} off by {float((got - want).norm()):.4f}"
                           f" (|{what}| {float(want.norm()):.4f})")
if RANK == 0:
    print("\n".join(bad))
    print("MISMATCH" if bad else "OK")
