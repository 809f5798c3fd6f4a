"""DeepSpeed's checkpoints for `train.resume_after`, in the case's `train.checkpoint_layout`:

- sharded (the default): the engine's own checkpoint (`save_checkpoint` / `load_checkpoint`: the module, each
  rank's ZeRO partitions and optimizer states), which loads into the layout that wrote it;
- universal: that checkpoint converted by DeepSpeed's `ds_to_universal` (one folder per parameter holding its fp32
  value and optimizer states, as a user runs `python -m deepspeed.checkpoint.ds_to_universal --input_folder ...
  --output_folder ... --inject_missing_state`) and loaded with `checkpoint.load_universal`, the path DeepSpeed gives
  for resuming under another ZeRO stage or parallel layout.
"""

import argparse
import os

from .base import checkpoint_layout, parallel, resume_after, resumed_case

TAG = "resume"


def universal(case):
    return resume_after(case) is not None and checkpoint_layout(case) == "universal"


def family(stage):
    """The checkpoint family of a ZeRO stage: DeepSpeed lays out stage 0's (the optimizer's state dict beside the
    module), stages 1-2's (flat partitions: DeepSpeedZeroOptimizer, BF16_Optimizer) and stage 3's (per-rank model
    files, sub-groups) checkpoints, universal ones included, differently."""
    return "stage 0" if stage == 0 else "stages 1-2" if stage in (1, 2) else "stage 3"


def unsupported_checkpoint(case):
    """Why DeepSpeed cannot write the case's resume checkpoint or load it into the resumed layout, or None (measured
    on 0.19.8: a universal checkpoint of stage 0 fails in ds_to_universal, "can't find *_optim_states.pt files"; a
    load into another family fails in DeepSpeed's loader: stage 3 from stages 1-2 and back, universal or not,
    "assert len(self.ckpt_list) > 0" in check_ckpt_list (the model files are named per stage; with them renamed,
    KeyError 'optimizer_state_dict' or "Empty ds_version"), stage 0 from stages 1-2 "'NoneType' object has no
    attribute 'copy'" in the torch optimizer's load_state_dict, and stages 1-2 from stage 0 FileNotFoundError of the
    partitions)."""
    if resume_after(case) is None:
        return None
    p, q = parallel(case), parallel(resumed_case(case))
    saved, resumed = p["zero_stage"], q["zero_stage"]
    if universal(case) and saved == 0:
        # (Measured as well: a bf16 pipeline without ZeRO, whose BF16_Optimizer writes fp32 partitions but no
        # param_shapes beside the module, "DeepSpeed checkpoint param_shapes must contain dictionaries".)
        return "DeepSpeed's universal checkpoint converts ZeRO checkpoints (stages 1-3); stage 0 writes none"
    if family(saved) != family(resumed):
        return (f"DeepSpeed's checkpoints load into the ZeRO stages that wrote them ({family(saved)}), universal ones "
                f"too (train.resume_parallel zero_stage {resumed})")
    if universal(case) and p.get("auto_ep") and p["tp"] > 1:
        # Measured: ZeRO-1/2 fail ds_to_universal's strict check of the tensor-parallel patterns first ("Unused
        # patterns=[...experts.w1...]"), its own NotImplementedError after it; ZeRO-3 raises a NotImplementedError.
        return "DeepSpeed's universal checkpoint does not convert AutoEP folded onto AutoTP (its NotImplementedError)"
    if degrees(case) != degrees(resumed_case(case)):
        why = unsupported_degree_change(case, p, q)
        if why:
            return why
    if saved == 3 and not universal(case) and p["optimizer_sub_group"] != q["optimizer_sub_group"]:
        # Measured: torch's load_state_dict, "loaded state dict contains a parameter group that doesn't match the size
        # of optimizer's group".
        return ("DeepSpeed's own ZeRO-3 checkpoint keeps the optimizer's sub-groups: another sub_group_size needs the "
                "universal checkpoint (train.checkpoint_layout universal)")
    return None


def degrees(case):
    """The case's data-, tensor- and context-parallel degrees (what a resume into other degrees trades)."""
    p = parallel(case)
    return p["dp"], p["tp"], p["cp"]


def unsupported_degree_change(case, saved, resumed):
    """Why the run cannot resume into other data-, tensor- and context-parallel degrees (`saved`, `resumed`: the two
    layouts), or None. Another tensor-parallel degree only through the universal checkpoint, which stores every
    parameter whole (measured on 0.19.8: DeepSpeed's own checkpoint fails to load into one, the module's state dict on
    its shapes, "size mismatch for layers.0.attn.q.weight", or its model-parallel resizing on Megatron's names, "key:
    attention.dense.weight is not found in the checkpoint"); data-parallel ranks traded for Ulysses' sequence-parallel
    ones from either (ZeRO partitions over both)."""
    if not universal(case) and saved["tp"] != resumed["tp"]:
        return ("DeepSpeed's own checkpoint loads into the tensor-parallel degree that wrote it: another needs the "
                "universal checkpoint (train.checkpoint_layout universal)")
    m = case.get("model") or {}
    if saved["ep"] > 1 or resumed["ep"] > 1 or "moe" in m.get("layers", ()):
        return "resuming a MoE model into other degrees is not expressed (the experts' layout would change with them)"
    return None


def save(engine, path, case):
    """Write the engine's checkpoint under `path` (every rank); with a universal layout rank 0 converts it while the
    others wait. Returns the tag to load."""
    import torch.distributed as dist

    engine.save_checkpoint(path, tag=TAG)
    if not universal(case):
        return TAG
    out = f"{TAG}_universal"
    if dist.get_rank() == 0:
        convert_to_universal(os.path.join(path, TAG), os.path.join(path, out))
    dist.barrier()
    return out


def convert_to_universal(source, target):
    """ds_to_universal's main with its command line's defaults, in this process (one worker: a rank is a daemonic
    process, which cannot start a pool)."""
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(input_folder=source, output_folder=target, num_extract_workers=1, num_merge_workers=1,
                              keep_temp_folder=False, strict=True, inject_missing_state=True)
    ds_to_universal.main(args)


def load_config(cfg, case):
    """The resumed engine's config: `checkpoint.load_universal` where the checkpoint is universal."""
    return {**cfg, "checkpoint": {"load_universal": True}} if universal(case) else cfg
