"""torch 2.15: FSDP1's `summon_full_params(with_grads=True)` aborts the process when the gradients are bfloat16 (or
float16) and one rank's shard of a flat parameter has no gradient.

`FlatParamHandle.unshard_grad` (torch/distributed/fsdp/_flat_param.py) all-gathers each rank's shard of the flat
gradient. A rank whose flat gradient is None while another rank's is not (with `use_orig_params=True`, a rank whose
shard covers only frozen parameters) contributes `torch.zeros(flat_param._sharded_size, device=self.device)`, which
is float32 whatever the gradients' dtype. The all-gather then mixes float32 and bfloat16 inputs: gloo aborts ("op.
preamble.length <= op.nbytes ... Received data size doesn't match expected size"); float32 models are unaffected.
pytorch/pytorch#112717 (2023, closed) fixed the dtype of the all-gather's output buffer, not these zeros.

Setup: 2 ranks, a bfloat16 model of one FSDP unit whose first parameters (rank 0's half of the flat parameter) are
frozen, FULL_SHARD, use_orig_params=True; one backward, then summon_full_params(with_grads=True). `--fixed` makes
the zeros in the flat parameter's dtype (shardfuzz's known fix `torch-fsdp1-summon-grads-zeros-dtype`).

Found by shardfuzz's torch-fsdp1 target (2026-12-05) on its first run over the test cases: every bf16 case with a
frozen block under a sharded strategy (`tests/python-frozen/dp2-zero3-frozen-mlp-and-attention-adamw-clip-bf16.json`).

Run: torchrun --nproc_per_node 2 torch-2.15-fsdp1-summon-full-params-grads-zeros-dtype.py [--fixed]  (CPU, gloo).
The unfixed run is killed by gloo's abort (torchrun reports the ranks' SIGABRT); with --fixed rank 0 prints OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

dist.init_process_group("gloo")
RANK = dist.get_rank()

if "--fixed" in sys.argv:  # the one-line fix, applied to the released method's source
    import inspect
    import textwrap

    from torch.distributed.fsdp import _flat_param

    source = textwrap.dedent(inspect.getsource(_flat_param.FlatParamHandle.unshard_grad))
    old = "torch.zeros(flat_param._sharded_size, device=self.device)"
    assert source.count(old) == 1, "the released code has changed"
    namespace = {}
    exec(source.replace(old, old[:-1] + ", dtype=flat_param.dtype)"), vars(_flat_param), namespace)
    _flat_param.FlatParamHandle.unshard_grad = namespace["unshard_grad"]

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
model[0].requires_grad_(False)  # 72 of the flat parameter's 90 elements: rank 0's whole shard
fsdp = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"), use_orig_params=True)
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(RANK)).to(torch.bfloat16)
fsdp(x).float().square().sum().backward()
with FSDP.summon_full_params(fsdp, writeback=False, with_grads=True):
    shapes = {n: None if p.grad is None else tuple(p.grad.shape) for n, p in fsdp.named_parameters()}
if RANK == 0:
    print("OK", shapes)
dist.destroy_process_group()
