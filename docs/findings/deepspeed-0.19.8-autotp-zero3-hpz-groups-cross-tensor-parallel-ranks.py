"""DeepSpeed 0.19.8 (found by shardfuzz, 2026-12-04): AutoTP training (`tensor_parallel.autotp_size`) with ZeRO-3 and
ZeRO++ hierarchical partitioning (`zero_hpz_partition_size` > 1) computes with the wrong weights.

AutoTP lays its (data_parallel, tensor_parallel) mesh out with the tensor-parallel ranks consecutive (tp 2: ranks 0-1
and 2-3 hold the two shards of every sharded weight). ZeRO-3 cuts its hpZ secondary-partition groups from consecutive
global ranks as well (`groups._create_zero_param_parallel_group`, whose own TODO says it assumes no model
parallelism): with hpZ 2 the group {0, 1} is a tensor-parallel pair, not two data-parallel replicas, so a parameter
gathered from its secondary partition is put together from the shards of different tensor-parallel ranks. No error
is raised; the model's output is simply wrong (shardfuzz's deepspeed-zero target: logits 2 million x the noise off
on a dp 2 x tp 2 case, from the first forward).

Run: torchrun --nproc_per_node 4 deepspeed-0.19.8-autotp-zero3-hpz-groups-cross-tensor-parallel-ranks.py [--fixed]
(CPU, gloo; dp 2 x tp 2, hpZ 2). Released: MISMATCH, the engine's output against the same model on one process. With
`--fixed` (the hpZ groups cut from each rank's data-parallel ranks): OK.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.utils import groups  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD, TP = dist.get_rank(), dist.get_world_size(), 2

if "--fixed" in sys.argv:

    def create_zero_param_parallel_group(group_size):
        size = min(group_size, WORLD // TP)
        for t in range(TP):
            data_parallel_ranks = list(range(t, WORLD, TP))
            for i in range(0, len(data_parallel_ranks), size):
                ranks = data_parallel_ranks[i:i + size]
                group = dist.new_group(ranks)
                if RANK in ranks:
                    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = group

    groups._create_zero_param_parallel_group = create_zero_param_parallel_group


class Mlp(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 12)
        self.down = torch.nn.Linear(12, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


torch.manual_seed(0)
reference = Mlp()
model = Mlp()
model.load_state_dict(reference.state_dict())
x = torch.randn(3, 8)
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
       "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "stage3_param_persistence_threshold": 0},
       "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0,
       "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
           {"patterns": [r".*up\.(weight|bias)$"], "partition_type": "column"},
           {"patterns": [r".*down\.(weight|bias)$"], "partition_type": "row"}]}}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg)
out = engine(x)
engine.backward(out.sum())
engine.step()
second = engine(x).detach()
with torch.no_grad():
    expected = reference(x)
reference(x).sum().backward()  # the reference takes the same SGD step
torch.optim.SGD(reference.parameters(), lr=0.1).step()
with torch.no_grad():
    expected_second = reference(x)
error = max(float((out.detach() - expected).abs().max()), float((second - expected_second).abs().max()))
errors = [torch.zeros(()) for _ in range(WORLD)]
dist.all_gather(errors, torch.tensor(error))
if RANK == 0:
    print("first forward: max |engine - one process| on rank 0:", f"{float((out.detach() - expected).abs().max()):.3g}")
    print("max |engine - one process| over both forwards, per rank:", ", ".join(f"{float(e):.3g}" for e in errors))
    print("OK" if max(float(e) for e in errors) < 1e-5 else "MISMATCH")
