"""DeepSpeed 0.19.8: a ZeRO-1/2 checkpoint loaded with `round_robin_gradients` toggled trains every parameter from
another parameter's master weights and Adam moments, silently.

ZeRO-1/2 flatten each parameter group in round-robin order under `zero_optimization.round_robin_gradients`
(`_round_robin_reorder`, stage_1_and_2.py) and in model order otherwise, and partition the flat buffer over the
data-parallel ranks. Their checkpoint stores each rank's flat fp32 partition and the optimizer's flat states, not
the order. `_load_legacy_checkpoint` checks one property of that layout, the parameter-alignment paddings ("The ZeRO
checkpoint parameter-alignment layout does not match the current zero_optimization.parameter_alignment setting"),
but not the order: a run resumed with the option toggled (DeepSpeed recommends it for CPU offload, so a user turning
offload on when resuming turns it on too) copies the saved partitions verbatim into a buffer laid out in the other
order. The module's weights are loaded correctly from the model file, so the first step after the resume still
looks right; its update is computed from the mixed-up master weights and moments and overwrites the weights.

Found by shardfuzz (deepspeed-zero target) through `train.resume_parallel`: dp 2, ZeRO-2, Adam, checkpointed after
step 1 and resumed with round_robin_grads on: `loss/step2` 164,196x its noise (f32); dp 3 ZeRO-1, bf16, and the
option turned off again, alike. The universal checkpoint (ds_to_universal) of the same run resumes correctly (with
DeepSpeed's round-robin fragment mapping fixed: deepspeed-0.19.8-round-robin-hp-mapping.py).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero12-checkpoint-round-robin-order-loaded-verbatim.py [--fixed]
(CPU, gloo; `--fixed` refuses the load as DeepSpeed refuses another alignment layout: the order saved beside the
paddings and compared). Prints how far the resumed run's parameters are from the uninterrupted run's after the step
that follows the resume, and MISMATCH, OK, or REFUSED (with the fix) on rank 0.
"""

import importlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()

if "--fixed" in sys.argv:
    state_dict, load = DeepSpeedZeroOptimizer.state_dict, DeepSpeedZeroOptimizer._load_legacy_checkpoint

    def with_order(self):
        return {**state_dict(self), "param_order": self.round_robin_bit16_indices}

    def checked_load(self, state_dict_list, load_optimizer_states=True, load_from_fp32_weights=False):
        saved = state_dict_list[dist.get_rank(group=self.dp_process_group)].get("param_order")
        if saved is not None and saved != self.round_robin_bit16_indices and (load_optimizer_states
                                                                              or load_from_fp32_weights):
            raise RuntimeError("The ZeRO checkpoint's parameter order does not match the current "
                               "zero_optimization.round_robin_gradients setting.")
        return load(self, state_dict_list, load_optimizer_states, load_from_fp32_weights)

    DeepSpeedZeroOptimizer.state_dict = with_order
    DeepSpeedZeroOptimizer._load_legacy_checkpoint = checked_load

X = torch.randn(WORLD, 3, 8, generator=torch.Generator().manual_seed(1))


def engine(round_robin):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 4), torch.nn.Linear(4, 8))
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "zero_optimization": {"stage": 2, "round_robin_gradients": round_robin}, "zero_allow_untested_optimizer": True}
    return deepspeed.initialize(model=m, optimizer=torch.optim.Adam(m.parameters(), lr=0.01), config=cfg)[0]


def train_step(e):
    e.backward(e(X[RANK]).pow(2).mean())
    e.step()


def main():
    path = [tempfile.mkdtemp() if RANK == 0 else None]
    dist.broadcast_object_list(path)
    first = engine(round_robin=False)
    train_step(first)
    first.save_checkpoint(path[0], tag="step1")
    train_step(first)  # the uninterrupted run's step 2

    resumed = engine(round_robin=True)
    try:
        resumed.load_checkpoint(path[0], tag="step1")
    except RuntimeError as e:
        if RANK == 0:
            print(f"load refused: {e}\nREFUSED")
        return
    train_step(resumed)  # step 2 after the resume
    off = max(float((p - q).abs().max()) for p, q in zip(first.module.parameters(), resumed.module.parameters()))
    if RANK == 0:
        print(f"parameters after step 2 differ from the uninterrupted run's by up to {off:.3e}")
        print("MISMATCH" if off > 1e-6 else "OK")


main()
