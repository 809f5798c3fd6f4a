"""DeepSpeed 0.19.8: AutoTP training under ZeRO-3 hangs in the first optimizer step when the tensor-parallel ranks hold
shards of different sizes (AutoTP splits a width tp does not divide unevenly) and a rank's partition spans several
optimizer sub-groups (`sub_group_size`).

ZeRO-3 cuts each rank's partition into sub-groups of `sub_group_size` elements, so tensor-parallel ranks whose shards
differ in size can have different numbers of sub-groups. `DeepSpeedZeroOptimizer_Stage3.step` computes the gradient
norm per sub-group (`_get_norm_groups`: one `get_grad_norm_direct` per sub-group), and each call all-reduces over the
data-parallel group and then over the model-parallel (tensor-parallel) group (`_model_parallel_all_reduce`). The rank
with fewer sub-groups leaves the loop early and goes on to its next collective while its tensor-parallel peer is still
in the norm's all-reduce: the ranks wait on each other for ever (or, where the next collectives happen to pair up,
combine unrelated tensors). The norm is computed on every step, with or without gradient clipping. With the default
`sub_group_size` (1e9) only partitions above a billion elements per rank meet it: large models, whose attention AutoTP
splits unevenly wherever tp does not divide the key-value head count.

Found by shardfuzz (deepspeed-zero target), campaign 301: dp 2 x AutoTP 2, ZeRO-3, `optimizer_sub_group` 8, an MLP
of width 3 (shards of 2 and 1), a frozen LM head: HANG, ranks 0 and 2 in the step's all-reduce, 1 and 3 already in the
next forward. Width 12 (even shards), one sub-group per rank, or ZeRO-1 pass.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-autotp-zero3-uneven-shards-sub-group-norm-hang.py [--fixed]
(CPU, gloo; tp 2, an MLP of width 3, `sub_group_size` 12: two sub-groups on the wider shard, one on the other). Prints each rank's number of optimizer sub-groups, then
HANG if the step has not returned within 30 s. `--fixed` is a control, not a fix: `sub_group_size` large enough for one
sub-group per rank, OK.
"""

import importlib
import os
import sys
import threading

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()


class Mlp(torch.nn.Module):
    """An MLP of width 3: AutoTP splits `up` (column-parallel) and `down` (row-parallel) 2 / 1 over tp 2."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 3, bias=False)
        self.down = torch.nn.Linear(3, 8, bias=False)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


torch.manual_seed(0)
model = Mlp()
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                             "sub_group_size": 1000 if "--fixed" in sys.argv else 12},
       "zero_allow_untested_optimizer": True,
       "tensor_parallel": {"autotp_size": WORLD, "partition_config": {"use_default_specs": False, "layer_specs": [
           {"patterns": [r"up\.weight$"], "partition_type": "column"},
           {"patterns": [r"down\.weight$"], "partition_type": "row"}]}}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg)
counts = [None] * WORLD
dist.all_gather_object(counts, len(engine.optimizer.fp16_groups))
if RANK == 0:
    print(f"optimizer sub-groups per tensor-parallel rank: {counts}")
engine.backward(engine(torch.randn(3, 8, generator=torch.Generator().manual_seed(1))).pow(2).mean())
done = threading.Event()
threading.Thread(target=lambda: done.wait(30) or (print(f"rank {RANK}: HANG (the step did not return in 30 s)",
                                                        flush=True), os._exit(1)), daemon=True).start()
engine.step()  # the bug: the rank with more sub-groups waits in the norm's all-reduce for ever
done.set()
dist.barrier()
if RANK == 0:
    print("OK")
