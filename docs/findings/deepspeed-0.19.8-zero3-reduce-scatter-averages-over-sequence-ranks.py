"""DeepSpeed 0.19.8: under sequence parallelism (DeepSpeed-Ulysses) ZeRO-3's default gradient reduction averages
over the sequence-parallel ranks where every other reduction path sums: ZeRO-3's gradients come out 1/sp of ZeRO-1/2's
and of ZeRO-3's own with `"reduce_scatter": false`.

Under Ulysses each rank of a sequence-parallel group holds a part of every sequence; DeepSpeed reduces gradients over the
sequence-and-data-parallel group and divides by that group's size over `sequence_parallel_size`, i.e. it sums over the
sp ranks and averages over the data-parallel ones: the engine at ZeRO 0 (engine.py:3884), ZeRO-1/2 (stage_1_and_2.py:1506,
:1688, :2380) and ZeRO-3's all-reduce path `__avg_scatter_contiguous_grads` (stage3.py:1878,
`div_(averaging_world_sz / float(self.sequence_parallel_size))`). ZeRO-3's reduce-scatter path `__avg_scatter_grads`
(stage3.py:1912-1946, taken whenever `reduce_scatter` is on, its default) calls `reduce_scatter_coalesced`, which divides
by the whole group's size (coalesced_collectives.py:124), and corrects only for expert parallelism
(`_gradient_averaging_world_size`), never for sequence_parallel_size. So with sp = 2 ZeRO-3's gradients are half of
ZeRO-2's on the same model and data: gradient clipping sees a different norm, SGD a different step, Adam a different
epsilon balance, and switching ZeRO stage (or `reduce_scatter`) changes the training.

Found by shardfuzz (deepspeed-zero target, its new context parallelism as DeepSpeed-Ulysses): with the fix of the
config-mesh group bug (deepspeed-0.19.8-ulysses-mesh-gradients-not-reduced-over-sequence-ranks.py) every cp case of
ZeRO 0-2 passed, and every ZeRO-3 case still diverged with step-0 gradients exactly 0.500 of the reference's norm,
except with `"reduce_scatter": false`.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero3-reduce-scatter-averages-over-sequence-ranks.py [--fixed]
(CPU, gloo; sp 2 through DeepSpeed's own sequence-parallel mpu, `deepspeed.runtime.sequence_parallel.parallel_state_sp`,
as its ALST / Ulysses-for-HF path sets it up; `--fixed` multiplies the reduce-scatter path's partitions by
sequence_parallel_size). Prints each configuration's gradient against the sum of the sp ranks' gradients, then MISMATCH
or OK on rank 0.
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
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    NAME = "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads"
    released = getattr(Stage3, NAME)

    def avg_scatter_grads(self, params, communication_data_type):
        return [g.mul(self.sequence_parallel_size) for g in released(self, params, communication_data_type)]

    setattr(Stage3, NAME, avg_scatter_grads)


def model_and_sequence():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.randn(2 * WORLD, 4)  # one sequence, two tokens per sp rank


def local_loss(model, x):
    """This rank's tokens' loss: the sp ranks' losses add up to the sequence's."""
    return model(x[2 * RANK:2 * RANK + 2]).pow(2).sum()


def gradient(stage, reduce_scatter):
    """This rank's full weight gradient after one backward, sp = WORLD through DeepSpeed's sequence-parallel mpu."""
    model, x = model_and_sequence()
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
           "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": stage, "reduce_scatter": reduce_scatter, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg,
                                      mpu=parallel_state_sp)
    engine.backward(local_loss(engine, x))
    g = safe_get_full_grad(engine.module.weight).detach().clone()
    engine.destroy()
    return g


model, x = model_and_sequence()
expected = sum(torch.autograd.grad(model(x[2 * r:2 * r + 2]).pow(2).sum(), model.weight)[0] for r in range(WORLD))
bad = False
for stage, reduce_scatter in ((2, True), (3, False), (3, True)):
    g = gradient(stage, reduce_scatter)
    ratios = [torch.zeros(()) for _ in range(WORLD)]
    dist.all_gather(ratios, g.norm() / expected.norm())
    bad |= any(abs(float(r) - 1) > 1e-5 for r in ratios)
    if RANK == 0:
        print(f"ZeRO-{stage}, reduce_scatter {str(reduce_scatter):5}, sp {WORLD}: |grad| / |sum over sp ranks| per rank = "
              + ", ".join(f"{float(r):.3f}" for r in ratios))
if RANK == 0:
    print("MISMATCH" if bad else "OK")
