"""DeepSpeed 0.19.8: a ZeRO-3 run resumed from a universal checkpoint gives every optimizer parameter group the first
group's hyperparameters (weight decay, learning rate, betas), silently.

ZeRO-3's universal-checkpoint loader, `load_hp_checkpoint_state_from_checkpoint_dir_stage3` (stage3.py), restores the
groups' hyperparameters with

    for param_group in self.optimizer.param_groups:
        # Generally, the hyperparameters of each parameter should be the same, we can obtain from any parameter.
        for key, value in optim_sd[OPTIMIZER_STATE_DICT]["param_groups"][0].items():
            ...
                param_group[key] = value

so the usual recipe, no weight decay on norms and biases (a second param group with weight_decay 0), resumes with
weight decay on every norm and bias; per-group learning rates (layer-wise decay, a lower rate for embeddings) become
the first group's. The checkpoint holds every group's values (optimizer_state.pt); ZeRO-1/2's universal loader and
DeepSpeed's own checkpoints restore each group's. (The same loader's step count is the subject of
deepspeed-0.19.8-zero3-universal-checkpoint-shared-step-across-sub-groups.py: two param groups are two sub-groups,
so this script applies that fix first, to show this bug alone.)

Found by shardfuzz (deepspeed-zero target, campaign 296) through `train.checkpoint_layout` universal: dp 2, ZeRO-3,
AdamW with weight decay 0.01 and none on vectors, checkpointed after step 1 and converted with ds_to_universal:
`param/final_norm.weight` 801x its noise; ZeRO-1 / ZeRO-2, DeepSpeed's own checkpoint, or one weight decay for all
pass.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero3-universal-checkpoint-first-param-group-everywhere.py
[--fixed] (CPU, gloo; `--fixed` restores each group from its own saved group). Prints each resumed group's weight
decay and MISMATCH or OK on rank 0.
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


def patch_loader(fix_groups):
    """The loader with the shared-step fix (the other bug), and with this one's where `fix_groups`."""
    import inspect
    import textwrap

    from deepspeed.runtime.zero import stage3

    cls = stage3.DeepSpeedZeroOptimizer_Stage3
    name = "load_hp_checkpoint_state_from_checkpoint_dir_stage3"
    source = textwrap.dedent(inspect.getsource(getattr(cls, name))).replace(
        "self.optimizer.state[fp32_param]['step'] = state_step",
        "self.optimizer.state[fp32_param]['step'] = state_step.clone() if torch.is_tensor(state_step) else state_step")
    if fix_groups:
        source = source.replace("for param_group in self.optimizer.param_groups:",
                                "for group_index, param_group in enumerate(self.optimizer.param_groups):").replace(
            'optim_sd[OPTIMIZER_STATE_DICT]["param_groups"][0]', 'optim_sd[OPTIMIZER_STATE_DICT]["param_groups"][group_index]')
    namespace = {}
    exec(compile(source, stage3.__file__, "exec"), stage3.__dict__, namespace)
    setattr(cls, name, namespace[name])


patch_loader("--fixed" in sys.argv)

X = torch.randn(WORLD, 3, 8, generator=torch.Generator().manual_seed(1))


def engine(universal):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
           "zero_allow_untested_optimizer": True}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    # The usual recipe: weight decay on the matrices, none on the vectors (biases, the norm).
    groups = [{"params": [p for p in m.parameters() if p.dim() > 1], "weight_decay": 0.1},
              {"params": [p for p in m.parameters() if p.dim() <= 1], "weight_decay": 0.0}]
    return deepspeed.initialize(model=m, optimizer=torch.optim.AdamW(groups, lr=0.01), config=cfg)[0]


def train_step(e):
    e.backward(e(X[RANK]).pow(2).mean())
    e.step()


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
    decays = [g["weight_decay"] for g in resumed.optimizer.optimizer.param_groups]
    train_step(resumed)  # step 2 after the resume
    off = max(float((p.ds_tensor - q.ds_tensor).abs().max()) for p, q in
              zip(first.module.parameters(), resumed.module.parameters()))
    if RANK == 0:
        print(f"resumed param groups' weight decay: {decays} (want [0.1, 0.0]); parameters after step 2 differ from "
              f"the uninterrupted run's by up to {off:.3e}")
        print("MISMATCH" if decays != [0.1, 0.0] or off > 1e-6 else "OK")

main()
