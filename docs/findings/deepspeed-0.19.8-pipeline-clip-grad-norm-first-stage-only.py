"""DeepSpeed 0.19.8: under pipeline parallelism (no tensor parallelism, fp32, no ZeRO) gradient clipping's norm counts
only the first stage's gradients; every stage is clipped by it.

The engine clips with deepspeed.runtime.utils.clip_grad_norm_(..., mpu=self.mpu) (engine.py:3503), and a
PipelineModule's mpu is its PipelineParallelGrid. clip_grad_norm_ adds a gradient to the norm only where
`mpu.get_model_parallel_rank() == 0 or is_model_parallel_parameter(p)` (utils.py:394), Megatron's rule for not
counting tensor-parallel replicas twice. But the grid's "model parallel" rank is the rank's index among all ranks of
its data-parallel replica (topology.py:313, `ds_model_rank`: pipeline stages x tensor slices), so on every stage after
the first it is non-zero and none of that stage's gradients is counted; the all-reduce that follows sums the first
stage's squares only. The global norm comes out too small: clipping is skipped when it should apply, or too weak.
(DeepSpeed's ZeRO and BF16 optimizers compute their norms elsewhere.)

Found by shardfuzz (deepspeed-pp target) on its first clipped case: pp2 f32 AdamW clip 0.5, params after the second
step up to 1,478x the noise (the first step's norm happened to be below the threshold); without clipping the case
passes.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-pipeline-clip-grad-norm-first-stage-only.py [--fixed]
(CPU, gloo; `--fixed` counts every stage's gradients in the norm). Prints MISMATCH or OK on rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.pipe import PipelineModule  # noqa: E402

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # (a JIT extension for inference only)
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
CLIP, LR = 0.05, 1.0

if "--fixed" in sys.argv:
    import deepspeed.runtime.engine as engine_module
    import deepspeed.runtime.utils as utils

    def clip_grad_norm_(parameters, max_norm, norm_type=2, mpu=None):
        # Each stage's own gradients (no tensor parallelism here: nothing is replicated), summed over the stages.
        return utils.clip_grad_norm_(parameters, max_norm, norm_type, mpu=None if mpu is None else StageGrid(mpu))

    class StageGrid:
        def __init__(self, grid):
            self.grid = grid

        def get_model_parallel_rank(self):
            return 0

        def get_model_parallel_group(self):
            return self.grid.get_model_parallel_group()

    engine_module.clip_grad_norm_ = clip_grad_norm_


def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 4) for _ in range(4)]


G = torch.Generator().manual_seed(1)
X, Y = torch.randn(2, 4, generator=G), torch.randn(2, 4, generator=G)


def loss_fn(out, y):
    return ((out - y) ** 2).sum()


module = PipelineModule(layers=layers(), num_stages=2, loss_fn=loss_fn, partition_method="uniform")
cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 2,
       "gradient_clipping": CLIP, "zero_optimization": {"stage": 0}, "steps_per_print": 1 << 30}
engine, *_ = deepspeed.initialize(model=module, optimizer=torch.optim.SGD(module.parameters(), lr=LR), config=cfg)
engine.train_batch(iter([(X, Y)]))
mine = {name: p.detach().clone() for name, p in module.named_parameters()}
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, mine)

reference = torch.nn.Sequential(*layers())
loss_fn(reference(X), Y).backward()
norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
with torch.no_grad():
    for p in reference.parameters():
        p -= LR * p.grad
if dist.get_rank() == 0:
    expected = dict(reference.named_parameters())
    worst = max((v - expected[k]).abs().max().item() for stage in gathered for k, v in stage.items())
    print(f"global gradient norm {norm:.4f} (clip to {CLIP}); largest parameter difference after one step: {worst:.3e}")
    print("OK" if worst < 1e-6 else "MISMATCH: the pipeline engine clipped by another norm than the gradients' global one")
