"""DeepSpeed 0.19.8: gradient clipping never scales sparse gradients (nn.Embedding(sparse=True), fp32, no ZeRO),
though it counts them in the norm.

Without ZeRO and in fp32 the engine clips with deepspeed.runtime.utils.clip_grad_norm_ (engine.py:3503), which
takes the global norm over every gradient, sparse ones included, and then scales each gradient by
`p.grad.data.mul_(clip_coef)` (utils.py:426). For a sparse tensor `.data` is a separate shallow copy: the sparse
in-place product replaces that copy's values and leaves `p.grad` as it was. So a sparse embedding's gradient
stays unclipped while every dense gradient is scaled by the coefficient it helped to compute, and the update
is off (torch's own clip_grad_norm_ scales `p.grad` itself and clips sparse gradients correctly).

Found by shardfuzz (deepspeed-zero target) on its first cases with the case field `model.sparse_embedding` and
clipping (dp2 f32, SGD, clip 0.5: `loss/step1` 10,000x the noise; the same case with a dense embedding, or on
torch-ddp, passes).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-sparse-gradient-not-clipped.py [--fixed]
(CPU, gloo; `--fixed` scales sparse gradients by the same coefficient). Prints MISMATCH or OK on rank 0.
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
CLIP, LR = 0.1, 1.0

if "--fixed" in sys.argv:
    import deepspeed.runtime.engine as engine_module

    original = engine_module.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, norm_type=2, mpu=None):
        parameters = [p for p in parameters if p.grad is not None]
        total_norm = original(parameters, max_norm, norm_type=norm_type, mpu=mpu)
        coef = min(1.0, float(max_norm) / (float(total_norm) + 1e-6))
        for p in parameters:
            if p.grad.is_sparse:
                p.grad = p.grad * coef
        return total_norm

    engine_module.clip_grad_norm_ = clip_grad_norm_


class Model(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(5, 3, sparse=sparse)
        self.head = torch.nn.Linear(3, 1)

    def forward(self, ids):
        return self.head(self.embed(ids)).pow(2).sum()


IDS = torch.tensor([[0, 1, 2], [2, 3, 4], [4, 0, 1], [3, 3, 2]])  # one row per rank


def step(sparse):
    """The embedding table after one clipped SGD step of the engine (each rank its own row)."""
    model = Model(sparse)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
           "gradient_clipping": CLIP, "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), config=cfg)
    engine.backward(engine(IDS[RANK]))
    engine.step()
    return model.embed.weight.detach().clone()


reference = Model(False)
opt = torch.optim.SGD(reference.parameters(), lr=LR)
(sum(reference(IDS[r]) for r in range(WORLD)) / WORLD).backward()
torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
opt.step()
expected = reference.embed.weight.detach()
moved = {sparse: float((step(sparse) - Model(False).embed.weight.detach()).norm()) for sparse in (False, True)}
want = float((expected - Model(False).embed.weight.detach()).norm())
if RANK == 0:
    for sparse, got in moved.items():
        print(f"sparse={sparse!s:5}: |embedding update| = {got:.6f} (clipped by torch: {want:.6f})")
    print("MISMATCH" if any(abs(got - want) > 1e-5 * max(want, 1.0) for got in moved.values()) else "OK")
