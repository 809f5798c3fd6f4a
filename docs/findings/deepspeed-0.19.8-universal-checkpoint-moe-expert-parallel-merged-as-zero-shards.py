"""DeepSpeed 0.19.8: ds_to_universal cannot convert a ZeRO-1/2 checkpoint of a model with DeepSpeed's MoE layer under
expert parallelism (ep_size > 1).

DeepSpeed's MoE layer keeps each expert-parallel rank's own experts under the same local names (`...deepspeed_experts.0`
is expert 0 on ep rank 0 and expert 2 on ep rank 1 of four), and ZeRO partitions the expert parameter groups over the
expert-data-parallel group. ds_to_universal's ZeRO-1/2 path (`extract_zero_shards`, `_merge_zero_shards`) reads every
data-parallel rank's optimizer file as a ZeRO shard of one parameter per name and concatenates them, so an expert's
fragments from different ep ranks, which are different experts, are merged into one tensor twice its size: "shape
'[8]' is invalid for input of size 16" (here an expert's bias: both ep ranks' copies). It prints "assuming native
DeepSpeed MoE and skipping AutoEP consolidation" first, and the engine's universal loader has MoE branches, so the
layer is meant to convert. Without expert parallelism (ep_size 1) it converts and resumes correctly.

Found by shardfuzz (deepspeed-zero target) through `train.checkpoint_layout` universal: dp 2 x ep 2, a MoE block of 4
experts, ZeRO-1 and ZeRO-2, f32: CRASH in `_merge_zero_shards` ("shape '[12, 8]' is invalid for input of size
192"); ep 1 passes.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-universal-checkpoint-moe-expert-parallel-merged-as-zero-shards.py
[--ep 1] (CPU, gloo). Prints CRASH with the error, or OK once the converted checkpoint loads, on rank 0.
"""

import argparse
import importlib
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.checkpoint import ds_to_universal  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
EP = int(sys.argv[sys.argv.index("--ep") + 1]) if "--ep" in sys.argv else 2
X = torch.randn(WORLD, 6, 8, generator=torch.Generator().manual_seed(1))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(8, 8)
        self.moe = MoE(hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=4, ep_size=EP, k=1,
                       capacity_factor=4.0, eval_capacity_factor=4.0, min_capacity=0)

    def forward(self, x):
        out, aux, _ = self.moe(self.inp(x))
        return out.pow(2).mean() + 0.01 * aux


def engine(universal):
    m = Model()
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(m.parameters()), "name": "dense"})
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    return deepspeed.initialize(model=m, optimizer=torch.optim.Adam(groups, lr=0.01), config=cfg)[0]


def main():
    path = [tempfile.mkdtemp() if RANK == 0 else None]
    dist.broadcast_object_list(path)
    path = path[0]
    first = engine(universal=False)
    first.backward(first(X[RANK]))
    first.step()
    first.save_checkpoint(path, tag="step1")
    failure = [None]
    if RANK == 0:
        try:
            ds_to_universal.main(argparse.Namespace(input_folder=os.path.join(path, "step1"),
                                                    output_folder=os.path.join(path, "step1_universal"),
                                                    num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                                    strict=True, inject_missing_state=True))
        except Exception as e:  # noqa: BLE001 (the conversion's failure is what this script reports)
            failure[0] = f"{type(e).__name__}: {e} at {traceback.extract_tb(e.__traceback__)[-1].name}"
    dist.broadcast_object_list(failure)
    if failure[0] is None:
        engine(universal=True).load_checkpoint(path, tag="step1_universal")
    if RANK == 0:
        print(f"ep_size {EP}, ZeRO-2 checkpoint through ds_to_universal: {failure[0] or 'converted and loaded'}")
        print(f"CRASH: {failure[0]}" if failure[0] else "OK")


main()
