"""DeepSpeed 0.19.8: under sequence parallelism, ZeRO-1/2 with `gradient_predivide_factor` equal to the world size
leave every gradient sequence_parallel_size times too small.

`gradient_reduction_w_predivide` (stage_1_and_2.py:1485-1514; ZeRO-1/2 with `reduce_scatter` off and a predivide
factor f) divides each gradient by f, all-reduces it over the sequence-and-data-parallel group of W ranks, and then
multiplies by f / (W / sequence_parallel_size), the division by dp only that every DeepSpeed reduction under
sequence parallelism does (the sp ranks' gradients are summed). It skips that multiplication `if
self.gradient_predivide_factor != dp_world_size` fails, i.e. when f == W: right without sequence parallelism, where
the factor is then f / W = 1, but with sp > 1 the factor is sp, and the gradients stay sp times too small (f = W, the
natural "predivide fully" choice, on one sequence-parallel group of 2: halved). Any other f is right.

Found by shardfuzz (deepspeed-zero target, its context parallelism as DeepSpeed-Ulysses; campaign 256): a cp2 ZeRO-2 bf16
case with `grad_predivide` 2 diverged (every gradient 0.5 of the reference's) with every other known fix on; cut down
to cp2, ZeRO-1 or 2, `reduce_scatter: false`, `grad_predivide: 2`; ZeRO-0 and f = 1 pass.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-predivide-factor-equal-to-world-size-under-sequence-parallelism.py [--fixed]
(CPU, gloo; sp 2 through DeepSpeed's own sequence-parallel mpu, `parallel_state_sp`; `--fixed` skips the
multiplication only when its factor is 1). Prints each configuration's gradient against the sum of the sp ranks'
gradients, then MISMATCH or OK on rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.runtime.sequence_parallel import parallel_state_sp  # noqa: E402
from deepspeed.utils import safe_get_full_grad  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
parallel_state_sp.initialize_sequence_parallel(WORLD)

if "--fixed" in sys.argv:
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Zero

    released = Zero.gradient_reduction_w_predivide

    def gradient_reduction_w_predivide(self, tensor, communication_data_type):
        out = released(self, tensor, communication_data_type)
        world, f, sp = dist.get_world_size(group=self.dp_process_group), self.gradient_predivide_factor, self.sequence_parallel_size
        if self.gradient_average and self.postscale_gradients and f == world and sp > 1:
            tensor.mul_(f / (world / sp))  # (the skipped factor; `tensor` is what the released code reduced in place)
        return out

    Zero.gradient_reduction_w_predivide = gradient_reduction_w_predivide


def model_and_sequence():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.randn(2 * WORLD, 4)  # one sequence, two tokens per sp rank


def local_loss(model, x):
    """This rank's tokens' loss: the sp ranks' losses add up to the sequence's."""
    return model(x[2 * RANK:2 * RANK + 2]).pow(2).sum()


def gradient(stage, predivide):
    """This rank's full weight gradient after one backward, sp = WORLD through DeepSpeed's sequence-parallel mpu."""
    model, x = model_and_sequence()
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
           "zero_allow_untested_optimizer": True, "gradient_predivide_factor": predivide,
           "zero_optimization": {"stage": stage, "reduce_scatter": False}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg,
                                      mpu=parallel_state_sp)
    engine.backward(local_loss(engine, x))
    g = safe_get_full_grad(engine.module.weight).detach().clone()
    engine.destroy()
    return g


model, x = model_and_sequence()
expected = sum(torch.autograd.grad(model(x[2 * r:2 * r + 2]).pow(2).sum(), model.weight)[0] for r in range(WORLD))
bad = False
for stage, predivide in ((1, 1.0), (1, float(WORLD)), (2, 1.0), (2, float(WORLD))):
    g = gradient(stage, predivide)
    ratios = [torch.zeros(()) for _ in range(WORLD)]
    dist.all_gather(ratios, g.norm() / expected.norm())
    bad |= any(abs(float(r) - 1) > 1e-5 for r in ratios)
    if RANK == 0:
        print(f"ZeRO-{stage}, gradient_predivide_factor {predivide:g}, sp {WORLD}: |grad| / |sum over sp ranks| per rank = "
              + ", ".join(f"{float(r):.3f}" for r in ratios))
if RANK == 0:
    print("MISMATCH" if bad else "OK")
