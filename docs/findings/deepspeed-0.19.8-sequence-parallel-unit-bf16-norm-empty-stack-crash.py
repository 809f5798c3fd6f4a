"""DeepSpeed 0.19.8 (an open issue, deepspeedai/DeepSpeed#7833, "Ulysses crashes in Stage 0"): the BF16_Optimizer
(bf16 with fp32 gradient accumulation; shown here at ZeRO stage 1) with DeepSpeed's own sequence-parallel unit
(`parallel_state_sp`, the ALST setup, passed as `mpu`) crashes on every sequence-parallel rank but the first.

`parallel_state_sp` aliases get_model_parallel_rank / _world_size / _group to its sequence-parallel ones and has no
tensor-parallel getters, so `bwc_tensor_model_parallel_rank` falls back to them. `BF16_Optimizer.get_grads_for_norm`
keeps a replicated gradient on tensor-parallel rank 0 only ("perform norm only on cards with tp_rank=0"), which is
sequence-parallel rank 0; sequence-parallel rank 1 keeps none, and `get_global_norm_of_tensors` stacks an empty list.

Found again by shardfuzz (deepspeed-zero target, a cp2 bf16 ZeRO-1 case with `ulysses_mpu`). Known fix
`deepspeed-sequence-parallel-unit-model-parallel-rank`: the unit says there is no tensor parallelism.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-sequence-parallel-unit-bf16-norm-empty-stack-crash.py [--fixed]
(CPU, gloo). Released: rank 1 fails with "RuntimeError: stack expects a non-empty TensorList". With `--fixed`: each
rank's gradient norm (equal) and OK.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.runtime.sequence_parallel import parallel_state_sp  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
parallel_state_sp.initialize_sequence_parallel(WORLD)

if "--fixed" in sys.argv:
    parallel_state_sp.get_tensor_model_parallel_rank = lambda: 0
    parallel_state_sp.get_tensor_model_parallel_world_size = lambda: 1

torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
x = torch.randn(2 * WORLD, 4)  # one sequence, two tokens per sp rank
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
       "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1},
       "zero_allow_untested_optimizer": True,
       "gradient_clipping": 1.0}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg,
                                  mpu=parallel_state_sp)
engine.backward(engine(x[2 * RANK:2 * RANK + 2].bfloat16()).float().pow(2).sum())
engine.step()  # the bug: sp rank 1 raises here, and torchrun ends rank 0 waiting in the norm's all-reduce
norms = [torch.zeros(()) for _ in range(WORLD)]
dist.all_gather(norms, torch.tensor(float(engine.get_global_grad_norm())))
if RANK == 0:
    print("gradient norm per rank:", ", ".join(f"{float(n):.4f}" for n in norms))
    print("OK")
