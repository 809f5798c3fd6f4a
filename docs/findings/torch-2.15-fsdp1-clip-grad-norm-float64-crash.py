"""torch 2.15: FSDP1's `clip_grad_norm_` crashes on a float64 model under a sharded strategy.

`FullyShardedDataParallel.clip_grad_norm_` computes each rank's local norm with `_get_grad_norm`
(torch/distributed/fsdp/fully_sharded_data_parallel.py), which calls `torch.linalg.vector_norm(grad, norm_type,
dtype=torch.float32)` on every gradient, meant to compute low-precision norms in float32. For a float64 gradient
that is a narrowing cast, which vector_norm refuses: "RuntimeError: linalg.vector_norm: the dtype of the input
(Double) should be convertible without narrowing to the specified dtype (Float)". NO_SHARD is unaffected (it takes
torch.nn.utils.clip_grad_norm_), and so is every float32 / bfloat16 / float16 model.

Setup: 2 ranks, a float64 two-layer model, FULL_SHARD (SHARD_GRAD_OP is the same), one backward, clip_grad_norm_(0.1),
compared with torch.nn.utils.clip_grad_norm_ on the same model on one process. `--fixed` computes the norm in float64
where a gradient is float64 (shardfuzz's known fix `torch-fsdp1-clip-grad-norm-float64`).

Found by shardfuzz's torch-fsdp1 target (2026-12-05) on the seed `corpus/zero2-dp3-padded.json` (f64, clipping 1.0).

Run: torchrun --nproc_per_node 2 torch-2.15-fsdp1-clip-grad-norm-float64-crash.py [--fixed]  (CPU, gloo).
Prints CRASH, MISMATCH or OK on rank 0.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()

if "--fixed" in sys.argv:
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp_module

    def _get_grad_norm(params, norm_type, zero, device):
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return zero
        dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
        norms = [torch.linalg.vector_norm(g.detach(), norm_type, dtype=dtype) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms), norm_type, dtype=dtype).to(device=device)

    fsdp_module._get_grad_norm = _get_grad_norm


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()


x = torch.randn(4 * WORLD, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
ref = model()
ref(x).square().mean().backward()
ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)

fsdp = FSDP(model(), sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"), use_orig_params=True)
fsdp(x[RANK * 4:(RANK + 1) * 4]).square().mean().backward()
try:
    norm = fsdp.clip_grad_norm_(0.1)
except RuntimeError as e:
    if RANK == 0:
        print(f"CRASH: {e}")
    sys.exit(1)
if RANK == 0:
    ok = torch.allclose(norm, ref_norm, rtol=1e-12)
    print(f"{'OK' if ok else 'MISMATCH'}: FSDP1 norm {float(norm):.15f}, one process {float(ref_norm):.15f}")
dist.destroy_process_group()
