"""DeepSpeed 0.19.8: ds_to_universal cannot convert a ZeRO-3 checkpoint written before the first optimizer step (a
seed checkpoint), nor, under AutoTP, AutoEP or DeepSpeed's MoE layer, a ZeRO-1/2 one.

A seed checkpoint (the initialised model and an optimizer with no state yet, written once and loaded into whatever
layout a run uses, as torchtitan's `create_seed_checkpoint` does) is exactly what a layout-free checkpoint is for.
DeepSpeed writes and loads its own checkpoint at that point, and ds_to_universal converts a plain ZeRO-1/2 one, but
its ZeRO-3 extraction reads Adam's state of group 0 (`extract_zero_shards_stage3`,
ds_to_universal.py:196: `optim_sd[OPTIMIZER_STATE_DICT]["state"][0]`), which does not exist yet: `KeyError: 0`.
The ZeRO-1/2 paths for the newer layouts fail the same way elsewhere (measured through shardfuzz, not in this
script): AutoTP, `StopIteration` in affine.py's `rebuild` or `IndexError` in `merge_tp_slices`; AutoEP, "Missing
AutoEP exp_avg fragments" in `consolidate_autoep_zero12_expert_states`; DeepSpeed's MoE layer, the load's
FileNotFoundError of an expert's fragment.

Found by shardfuzz (deepspeed-zero target, campaign 296, 25 of its crashes) through `train.checkpoint_layout`
universal with `train.resume_after` 0.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-universal-checkpoint-before-first-step-conversion-crash.py
[--stage N] (CPU, gloo; ZeRO stage 3 by default, 1 and 2 convert). Prints CRASH with the error, or OK once the
converted checkpoint loads, on rank 0.
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

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
STAGE = int(sys.argv[sys.argv.index("--stage") + 1]) if "--stage" in sys.argv else 3


def engine(universal):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "zero_optimization": {"stage": STAGE}, "zero_allow_untested_optimizer": True}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    return deepspeed.initialize(model=m, optimizer=torch.optim.Adam(m.parameters(), lr=0.01), config=cfg)[0]


def main():
    path = [tempfile.mkdtemp() if RANK == 0 else None]
    dist.broadcast_object_list(path)
    path = path[0]
    engine(universal=False).save_checkpoint(path, tag="seed")  # before any step
    failure = [None]
    if RANK == 0:
        try:
            ds_to_universal.main(argparse.Namespace(input_folder=os.path.join(path, "seed"),
                                                    output_folder=os.path.join(path, "seed_universal"),
                                                    num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                                    strict=True, inject_missing_state=True))
        except Exception as e:  # noqa: BLE001 (the conversion's failure is what this script reports)
            failure[0] = f"{type(e).__name__}: {e} at {traceback.extract_tb(e.__traceback__)[-1].name}"
    dist.broadcast_object_list(failure)
    if failure[0] is None:
        engine(universal=True).load_checkpoint(path, tag="seed_universal")
    if RANK == 0:
        print(f"ZeRO-{STAGE} seed checkpoint through ds_to_universal: {failure[0] or 'converted and loaded'}")
        print(f"CRASH: {failure[0]}" if failure[0] else "OK")


main()
