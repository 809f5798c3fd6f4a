"""torch 2.15: `torch.compile` of a DistributedDataParallel module built with `bucket_cap_mb` below 1 (MiB) fails at
its first forward: "AssertionError: First bucket should be smaller/equal to other buckets to get comms warmed up
ASAP" (torch/_dynamo/backends/distributed.py, DDPOptimizer.__init__). Eager DDP trains the same module, and torch
2.5.1 (`.venv-colossalai`) runs this script OK: a regression.

Root cause: under `torch._dynamo.config.optimize_ddp` (default "ddp_optimizer") Dynamo builds a DDPOptimizer to split
the compiled graph at DDP's bucket boundaries, passing it the module's `bucket_bytes_cap` only
(torch/_dynamo/convert_frame.py). DDPOptimizer then takes the first bucket's cap as `dist._DEFAULT_FIRST_BUCKET_BYTES`
(1 MiB) and asserts that it is no larger than the other buckets' cap. DDP itself (its BucketCapacityConfig) uses the
1 MiB first bucket only with the default cap and caps the first bucket at the given size otherwise, so any explicit
`bucket_cap_mb` under 1 is valid for DDP and fatal for the compiled module. Fix (`--fixed`): the first bucket's cap no
larger than the other buckets' (`min(_DEFAULT_FIRST_BUCKET_BYTES, bucket_bytes_cap)`; passing DDP's own
`first_bucket_bytes_cap` would do too); the compiled gradients then equal the eager ones.

Found by shardfuzz's torch-ddp target (2026-12-05) on its first case with the case field `train.compiled` and a small
`reduce_bucket` (`tests/python-compile/dp2-compiled-bucket5-bucket-view-accumulation-f32.json`: 5-element buckets);
with the fix (known fix `torch-ddp-compile-first-bucket-cap`) it passes.

Run: torchrun --nproc_per_node 2 torch-2.15-ddp-compile-bucket-below-1-mib-crash.py [--fixed] [BUCKET_CAP_MB]
(CPU, gloo; default 0.5). Prints CRASH, MISMATCH or OK on rank 0.
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
RANK = dist.get_rank()

if "--fixed" in sys.argv:
    from torch._dynamo.backends import distributed

    init = distributed.DDPOptimizer.__init__

    def __init__(self, bucket_bytes_cap, backend_compile_fn, first_bucket_cap=None):
        if first_bucket_cap is None:
            first_bucket_cap = min(dist._DEFAULT_FIRST_BUCKET_BYTES, bucket_bytes_cap)
        init(self, bucket_bytes_cap, backend_compile_fn, first_bucket_cap)

    distributed.DDPOptimizer.__init__ = __init__
    sys.argv.remove("--fixed")
CAP_MB = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
eager_model = copy.deepcopy(model)
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(RANK))
eager = DDP(eager_model, bucket_cap_mb=CAP_MB)  # (kept referenced: its reducer all-reduces in the backward)
eager(x).square().sum().backward()
try:
    compiled = torch.compile(DDP(model, bucket_cap_mb=CAP_MB), backend="aot_eager")
    compiled(x).square().sum().backward()
    same = all(torch.allclose(a.grad, b.grad) for a, b in zip(model.parameters(), eager_model.parameters()))
    verdict = "OK" if same else "MISMATCH: compiled gradients differ from eager DDP's"
except Exception as e:
    verdict = f"CRASH: {type(e).__name__}: {e}"
if RANK == 0:
    print(verdict)
dist.destroy_process_group()
