"""DeepSpeed 0.19.8: ZeRO-3 with `gradient_predivide_factor` equal to the data-parallel world size divides
every gradient by the world size twice.

`gradient_predivide_factor` f splits gradient averaging around the reduction: divide by f before it, by W / f
after it (W the world size), to keep large sums in range. ZeRO-1/2 do exactly that
(stage_1_and_2.py:1499-1506: `mul(1/f)`, all-reduce, `mul(f / W)` unless f == W). ZeRO-3 without
reduce-scatter (`"reduce_scatter": false`; with it, stage 3 refuses f != 1) divides by f *and* by W before
the reduction, then multiplies by f afterwards, but only when f != W (stage3.py:1872-1883 with contiguous
gradients, :1922-1935 without, where reduce_scatter_coalesced divides by W itself). So f == W (f = 2 on 2
ranks, the natural "pre-divide fully" choice) leaves every gradient divided by W² instead of W: halved on 2
ranks, a quarter on 4. Any other f gives the right average; ZeRO-2 with the same settings is right.

Found by shardfuzz (deepspeed-zero target): read in the code while adding the case fields `reduce_scatter`
and `grad_predivide`, then confirmed by the target on a dp2 ZeRO-3 bf16 case (step-0 gradients 0.500 of the
reference's norm; f = 4 and ZeRO-2 pass).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero3-predivide-factor-equal-to-world-size.py [--fixed]
(CPU, gloo; `--fixed` multiplies by f whenever f != 1, as ZeRO-1/2's arithmetic amounts to). Prints MISMATCH
or OK on rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()

if "--fixed" in sys.argv:
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    for name in ("_DeepSpeedZeroOptimizer_Stage3__avg_scatter_contiguous_grads",
                 "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads"):
        original = getattr(Stage3, name)

        def avg_scatter(self, *args, _original=original):
            partitions = _original(self, *args)
            f = self.gradient_predivide_factor
            if self.postscale_gradients and f != 1.0 and f == dist.get_world_size(self.dp_process_group):
                for p in partitions:
                    p.mul_(f)
            return partitions

        setattr(Stage3, name, avg_scatter)


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    xs = torch.randn(WORLD, 2, 4)  # one micro-batch per rank
    return model, xs


def loss_of(model, x):
    return model(x).pow(2).sum()


def zero_grad(stage, predivide):
    """The full weight gradient after one backward of the engine (each rank on its own rows)."""
    model, xs = model_and_data()
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "gradient_predivide_factor": predivide, "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": stage, "reduce_scatter": False, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg)
    engine.backward(loss_of(engine, xs[RANK]))
    return deepspeed.utils.safe_get_full_grad(engine.module.weight).detach().clone()


model, xs = model_and_data()
expected = sum(torch.autograd.grad(loss_of(model, x), model.weight)[0] for x in xs) / WORLD
results = {(stage, f): zero_grad(stage, f) for stage, f in ((3, float(WORLD)), (3, 2.0 * WORLD), (2, float(WORLD)))}
if RANK == 0:
    for (stage, f), g in results.items():
        print(f"ZeRO-{stage}, gradient_predivide_factor {f:g} on {WORLD} ranks: |grad| / |expected| = "
              f"{float(g.norm() / expected.norm()):.6f}")
    bad = any(not torch.allclose(g, expected, rtol=1e-5, atol=1e-6) for g in results.values())
    print("MISMATCH" if bad else "OK")
