"""DeepSpeed 0.19.8: a ZeRO-3 run resumed from a universal checkpoint advances Adam's step count once per optimizer
sub-group per step, so every update after the resume is bias-corrected for the wrong step (silently wrong training).

ZeRO-3 splits each rank's partition into optimizer sub-groups of `sub_group_size` elements and steps them one at a
time. Its universal-checkpoint loader, `load_hp_checkpoint_state_from_checkpoint_dir_stage3` (stage3.py), reads one
`step` from the checkpoint's optimizer_state.pt and assigns that same object to every sub-group:

    state_step = optim_sd[OPTIMIZER_STATE_DICT]['state'][0]['step']
    ...
        self.optimizer.state[fp32_param]['step'] = state_step      # one tensor for all sub-groups

torch's Adam keeps `step` as a tensor and increments it in place (`_single_tensor_adam` / `_foreach_add_`), so with n
sub-groups the shared count moves n times per optimizer step. With one sub-group (the default sub_group_size, 1e9,
on a small model) nothing shows; a rank partition above sub_group_size elements (a large model, or the small
sub-groups NVMe / CPU offload runs use) trains wrongly after every resume from a universal checkpoint. DeepSpeed's
own checkpoints (not universal) load one step per sub-group and are unaffected.

Found by shardfuzz (deepspeed-zero target) through `train.checkpoint_layout` universal: dp 2, ZeRO-3,
`optimizer_sub_group` 100 (two or more sub-groups per rank), Adam, checkpointed after step 1 and converted with
ds_to_universal: `loss/step2` 14,600x its noise; the same resume from DeepSpeed's own checkpoint, or with one
sub-group, passes.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero3-universal-checkpoint-shared-step-across-sub-groups.py
[--fixed] (CPU, gloo; `--fixed` gives each sub-group its own copy of the step). Prints the resumed optimizer's step
counts after one more step and MISMATCH or OK on rank 0.
"""

import argparse
import importlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.checkpoint import ds_to_universal  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()

if "--fixed" in sys.argv:
    import inspect
    import textwrap

    from deepspeed.runtime.zero import stage3

    cls = stage3.DeepSpeedZeroOptimizer_Stage3
    name = "load_hp_checkpoint_state_from_checkpoint_dir_stage3"
    source = textwrap.dedent(inspect.getsource(getattr(cls, name))).replace(
        "self.optimizer.state[fp32_param]['step'] = state_step",
        "self.optimizer.state[fp32_param]['step'] = state_step.clone() if torch.is_tensor(state_step) else state_step")
    namespace = {}
    exec(compile(source, stage3.__file__, "exec"), stage3.__dict__, namespace)
    setattr(cls, name, namespace[name])

X = torch.randn(WORLD, 3, 8, generator=torch.Generator().manual_seed(1))


def engine(universal):
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(8, 8, bias=False) for _ in range(4)])
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           # sub_group_size 40: each rank's partition of 4 x 64 / 2 elements spans several optimizer sub-groups.
           "zero_optimization": {"stage": 3, "sub_group_size": 40, "stage3_param_persistence_threshold": 0},
           "zero_allow_untested_optimizer": True}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    return deepspeed.initialize(model=m, optimizer=torch.optim.Adam(m.parameters(), lr=0.01), config=cfg)[0]


def train_step(e):
    e.backward(e(X[RANK]).pow(2).mean())
    e.step()


def steps(e):
    return sorted({float(s["step"]) for s in e.optimizer.optimizer.state.values() if "step" in s})


def main():
    path = [tempfile.mkdtemp() if RANK == 0 else None]
    dist.broadcast_object_list(path)
    path = path[0]
    first = engine(universal=False)
    train_step(first)
    first.save_checkpoint(path, tag="step1")
    if RANK == 0:
        ds_to_universal.main(argparse.Namespace(input_folder=os.path.join(path, "step1"),
                                                output_folder=os.path.join(path, "step1_universal"),
                                                num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                                strict=True, inject_missing_state=True))
    dist.barrier()
    train_step(first)  # the uninterrupted run's step 2

    resumed = engine(universal=True)
    resumed.load_checkpoint(path, tag="step1_universal")
    sub_groups = len(resumed.optimizer.fp16_groups)
    train_step(resumed)  # step 2 after the resume
    counts = steps(resumed)
    off = max(float((p.ds_tensor - q.ds_tensor).abs().max()) for p, q in
              zip(first.module.parameters(), resumed.module.parameters()))
    if RANK == 0:
        print(f"{sub_groups} optimizer sub-groups on rank 0; Adam step counts after step 2: {counts} (want [2.0]); "
              f"parameters after step 2 differ from the uninterrupted run's by up to {off:.3e}")
        print("MISMATCH" if counts != [2.0] or off > 1e-6 else "OK")


main()
