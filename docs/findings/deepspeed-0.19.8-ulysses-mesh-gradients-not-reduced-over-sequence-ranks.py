"""DeepSpeed 0.19.8: sequence parallelism (DeepSpeed-Ulysses) configured by `sequence_parallel_size` and
`data_parallel_size` in the config (or by `deepspeed.initialize(..., mesh_param=(dp, sp))`) never combines the
sequence-parallel ranks' gradients.

Under Ulysses each rank of a sequence-parallel group holds a part of every sequence, so a parameter's gradient is
the sum of its sp ranks' gradients. The engine and ZeRO reduce gradients over `groups._get_sequence_data_parallel_group()`
("When sequence parallelism is enabled, the process group for zero sharding and gradient allreduce must be across both
dimensions of data and sequence parallelism", groups.py:913) and divide by that group's size over
`sequence_parallel_size` (engine.py:3884, stage_1_and_2.py:1506 / :1688 / :2380). With an mpu that has
`get_sequence_data_parallel_group` (Megatron-DeepSpeed's, DeepSpeed's own `parallel_state_sp`) that is right. With the
config keys or `mesh_param`, deepspeed.initialize builds a (data_parallel, sequence_parallel) device mesh
(`__init__.py:537-546`) and no mpu, and `_get_sequence_data_parallel_group()` falls back to
`_get_data_parallel_group()`: the mesh's data-parallel dimension alone (groups.py:771-772). The division by
sequence_parallel_size stays. So at ZeRO 0, 1 and 2 each rank keeps its own gradient times sp, steps on it, and the
sp ranks' replicas of every parameter drift apart from the first step.

Found by shardfuzz (deepspeed-zero target, its new context parallelism as DeepSpeed-Ulysses): the first cp2 case run
had every step-0 gradient wrong (`grad/lm_head.weight` norm 1.5x the reference's, the replicas on the two ranks
3.5 million eps apart) while the logits and the loss matched; every cp case of ZeRO 0-2 passes with the fix below.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-ulysses-mesh-gradients-not-reduced-over-sequence-ranks.py [--fixed]
(CPU, gloo; `--fixed` makes the sequence-and-data-parallel group span both mesh dimensions). Prints, for ZeRO 0-2,
each rank's gradient against the sum of the two ranks' gradients (what DeepSpeed's `parallel_state_sp` mpu gives on
the same model), then MISMATCH or OK on rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.runtime.sequence_parallel import parallel_state_sp  # noqa: E402
from deepspeed.utils import groups, safe_get_full_grad  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
parallel_state_sp.initialize_sequence_parallel(WORLD)

if "--fixed" in sys.argv:
    released = groups._get_sequence_data_parallel_group

    def sequence_data_parallel_group():
        if groups.mesh_device is not None and groups.mpu is None:
            mesh = groups.mesh_device
            if not hasattr(mesh, "_both"):
                mesh._both = mesh["data_parallel", "sequence_parallel"]._flatten()
            return mesh._both.get_group()
        return released()

    groups._get_sequence_data_parallel_group = sequence_data_parallel_group


def model_and_sequence():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.randn(2 * WORLD, 4)  # one sequence, two tokens per sp rank


def local_loss(model, x):
    """This rank's tokens' loss: the sp ranks' losses add up to the sequence's."""
    return model(x[2 * RANK:2 * RANK + 2]).pow(2).sum()


def fresh_process_state():
    """What a new process has: no mesh and no mpu left in deepspeed.utils.groups by an earlier engine."""
    groups.mesh_device, groups.mpu = None, None


def gradient(stage, mesh):
    """This rank's full weight gradient after one backward: sp = WORLD set by the config keys (`mesh`) or by DeepSpeed's
    own sequence-parallel mpu."""
    fresh_process_state()
    model, x = model_and_sequence()
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
           "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": stage}}
    kw = {}
    if mesh:
        cfg |= {"sequence_parallel_size": WORLD, "data_parallel_size": 1}
    else:
        kw["mpu"] = parallel_state_sp
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg,
                                      **kw)
    engine.backward(local_loss(engine, x))
    g = safe_get_full_grad(engine.module.weight).detach().clone()
    engine.destroy()
    return g


model, x = model_and_sequence()
expected = sum(torch.autograd.grad(model(x[2 * r:2 * r + 2]).pow(2).sum(), model.weight)[0] for r in range(WORLD))
bad = False
for stage in (0, 1, 2):
    for mesh in (False, True):
        g = gradient(stage, mesh)
        ratios = [torch.zeros(()) for _ in range(WORLD)]
        dist.all_gather(ratios, (g - expected).norm() / expected.norm())
        bad |= any(float(r) > 1e-5 for r in ratios)
        if RANK == 0:
            how = "config sequence_parallel_size (mesh)" if mesh else "mpu=parallel_state_sp            "
            print(f"ZeRO-{stage}, sp {WORLD} by {how}: |grad - sum over sp ranks| / |sum| per rank = "
                  + ", ".join(f"{float(r):.3f}" for r in ratios))
if RANK == 0:
    print("MISMATCH" if bad else "OK")
