"""DeepSpeed 0.19.8: sparse gradients (nn.Embedding(sparse=True), no ZeRO) come out `gradient_predivide_factor`
times the data-parallel average.

`gradient_predivide_factor` f splits gradient averaging around the reduction: divide by f before it, by W / f
after it (W the world size). The engine's dense all-reduce does so (engine.py:3807-3813: `mul(1/f)`,
all-reduce, `mul(f / W)`). Its sparse path, `sparse_allreduce` (engine.py:3963-3965), multiplies the values by
f / W and all-gathers them (a sum), never dividing by f: every sparse gradient is f times the average. With the
default f = 1 both agree; f = 2 doubles the embedding's gradient while every dense gradient is right.

Found by shardfuzz (deepspeed-zero target) on its first cases with the case fields `model.sparse_embedding` and
`grad_predivide` (dp2 f32 and bf16: `grad/embed.weight` norm error 1.000, every other tensor within noise), after
reading the predivide arithmetic of the ZeRO-3 bug beside it.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-sparse-gradient-predivide-factor.py [--fixed]
(CPU, gloo; `--fixed` divides the values by f first). Prints MISMATCH or OK on rank 0.
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
    from deepspeed.runtime.engine import DeepSpeedEngine

    original = DeepSpeedEngine.sparse_allreduce

    def sparse_allreduce(self, sparse, dp_group, dp_world_size=None):
        f = self.gradient_predivide_factor()
        if self.gradient_average and self.postscale_gradients() and f != 1.0:
            sparse.values = sparse.values / f
        return original(self, sparse, dp_group, dp_world_size)

    DeepSpeedEngine.sparse_allreduce = sparse_allreduce


class Model(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(5, 3, sparse=sparse)
        self.head = torch.nn.Linear(3, 1)

    def forward(self, ids):
        return self.head(self.embed(ids)).pow(2).sum()


IDS = torch.tensor([[0, 1, 2], [2, 3, 4], [4, 0, 1], [3, 3, 2]])  # one row per rank


def grads(sparse, predivide):
    """The embedding's and the head's gradients after one backward of the engine (each rank its own row)."""
    model = Model(sparse)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "gradient_predivide_factor": predivide, "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg)
    engine.backward(engine(IDS[RANK]))
    g = model.embed.weight.grad
    return (g.to_dense() if g.is_sparse else g), model.head.weight.grad.clone()


model = Model(False)
expected = [sum(torch.autograd.grad(model(IDS[r]), (model.embed.weight, model.head.weight))[i] for r in range(WORLD))
            / WORLD for i in (0, 1)]
bad = False
for sparse in (False, True):
    for f in (1.0, 2.0):
        embed, head = grads(sparse, f)
        ratio = float(embed.norm() / expected[0].norm())
        bad |= not (torch.allclose(embed, expected[0], atol=1e-6) and torch.allclose(head, expected[1], atol=1e-6))
        if RANK == 0:
            print(f"sparse={sparse!s:5} gradient_predivide_factor {f:g}: |embedding grad| / |average| = {ratio:.6f}")
if RANK == 0:
    print("MISMATCH" if bad else "OK")
