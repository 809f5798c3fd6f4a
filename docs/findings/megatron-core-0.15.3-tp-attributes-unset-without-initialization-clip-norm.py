"""megatron-core 0.15.3 (and 0.13.1): tensor-parallel layers built with `perform_initialization=False` leave their
weight unmarked, so gradient clipping under tp > 1 uses a norm without the other ranks' shards.

`ColumnParallelLinear`, `RowParallelLinear` and `VocabParallelEmbedding` set `tensor_model_parallel`,
`partition_dim` and `partition_stride` on their weight only inside `_initialize_affine_weight_cpu` / `_gpu`, which
they skip when `config.perform_initialization` is False (a model built to receive loaded weights). The optimizer's
gradient norm (`MegatronOptimizer.get_main_grads_for_grad_norm`) keeps a parameter on a tensor-parallel rank only
if `param_is_not_tensor_parallel_duplicate(param)`: `tensor_model_parallel` set, or tp rank 0. Unmarked, a sharded
weight counts on tp rank 0 only: the all-reduced norm misses every other rank's shards and clipping scales the
gradients by the wrong factor (a silent change of the update). 0.19.2 sets the attributes either way (`else:
set_tensor_model_parallel_attributes(...)`). Known upstream: NVIDIA-NeMo/Megatron-Bridge#992 (2025-10-17) keeps
initialisation on as a workaround and names the missing call.

Found by shardfuzz's megatron-tp target against megatron-core 0.15.3 (2026-12-01): a tp 2 x dp 3 f32 SGD step
clipped at 0.1 (`tests/python-megatron-ddp/tp2-dp3-ddp-uneven-batch-sgd-clip-f32.json`) has gradient norm 0.961
against 1.294 (the f64 reference's, and 0.19.2's); its second-step loss is 3,765 x the noise off. With the known fix
`megatron-tp-attributes-without-initialization` it passes.

This script builds one layer of each kind, once with and once without initialisation (one process, tp 1), and
reports which weights lack the attribute.

Run: python megatron-core-0.15.3-tp-attributes-unset-without-initialization-clip-norm.py (one process, CPU). Prints
BUG (exit 1) or OK.
"""

import os
import sys

import torch
import torch.distributed as dist
from megatron.core import ModelParallelConfig, parallel_state
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
dist.init_process_group("gloo", rank=0, world_size=1)
parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, create_gloo_process_groups=False)


def layers(initialise):
    config = ModelParallelConfig(use_cpu_initialization=True, perform_initialization=initialise)
    init = torch.nn.init.zeros_
    return {
        "ColumnParallelLinear": ColumnParallelLinear(8, 8, config=config, init_method=init, bias=False).weight,
        "RowParallelLinear": RowParallelLinear(8, 8, config=config, init_method=init, bias=False,
                                               input_is_parallel=True, skip_bias_add=False).weight,
        "VocabParallelEmbedding": VocabParallelEmbedding(16, 8, config=config, init_method=init).weight,
    }


unmarked = []
for initialise in (True, False):
    for name, weight in layers(initialise).items():
        marked = getattr(weight, "tensor_model_parallel", False)
        print(f"perform_initialization={initialise!s:5} {name:22} tensor_model_parallel={marked}")
        if not marked:
            unmarked.append(f"{name} (perform_initialization={initialise})")
dist.destroy_process_group()
if unmarked:
    print("BUG: unmarked sharded weights: " + ", ".join(unmarked))
    sys.exit(1)
print("OK")
