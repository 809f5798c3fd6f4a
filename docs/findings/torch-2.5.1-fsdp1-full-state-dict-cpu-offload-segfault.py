"""torch 2.5.1: FSDP1's full state dict of a sharded model on the CPU, offloaded to the CPU (the documented way to write
one file from a sharded model: `get_state_dict(..., StateDictOptions(full_state_dict=True, cpu_offload=True))`), kills
the process with SIGSEGV. A known bug, fixed in later releases (pytorch#188989; torch 2.15 runs this script).

`FlatParamHandle.to_cpu` (torch/distributed/fsdp/_flat_param.py:1652-1700), entered by the full state dict's
`_unshard_fsdp_state_params(offload_to_cpu=True)`, moves the unpadded unsharded flat parameter to the CPU
(`flat_param_to`, no copy for a parameter on the CPU already) and then frees the padded unsharded flat parameter
(`_free_unsharded_flat_param`), whose storage that parameter is a view of. The state-dict hook's `clone()` of each
parameter (_state_dict_utils.py:341) then reads freed memory. Later releases skip the move and the free where the flat
parameter is already on the CPU. NO_SHARD (nothing unsharded) is not affected.

Found by shardfuzz's torch-fsdp1 target on torch 2.5.1 (`--python torch-fsdp1=.venv-colossalai/bin/python`,
2026-12-07): dp 4, ZeRO-3 (FULL_SHARD) or ZeRO-2 (SHARD_GRAD_OP), Adam, a gathered checkpoint after step 1 (with or
without resuming into another sharding strategy): rank 0 killed by signal 11. With this fix the runs go on to meet
torch's aliased offloaded optimizer states (torch-2.15-fsdp1-cpu-full-optim-state-dict-moments-aliased.py, present in
2.5.1 too), and pass with both fixes.

This script: 4 ranks, a two-layer model under FSDP1 FULL_SHARD on the CPU, one Adam step, the full state dict with
`cpu_offload=True`. `--fixed`: `to_cpu` moves and frees nothing for a flat parameter on the CPU, as later releases do.

Run: torchrun --nproc_per_node 4 torch-2.5.1-fsdp1-full-state-dict-cpu-offload-segfault.py [--fixed] (CPU, gloo).
Prints OK, or the process dies with SIGSEGV (torchrun reports the child's signal 11; faulthandler prints the frames).
"""

import contextlib
import faulthandler
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp._flat_param import FlatParamHandle

if "--fixed" in sys.argv:
    to_cpu = FlatParamHandle.to_cpu

    @contextlib.contextmanager
    def to_cpu_fixed(self):
        if self.flat_param.device.type == "cpu":
            yield
            return
        with to_cpu(self):
            yield

    FlatParamHandle.to_cpu = to_cpu_fixed

faulthandler.enable()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = FSDP(torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 8)),
             sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"), use_orig_params=True)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.randn(4, 8)).sum().backward()
opt.step()
model_state, optim_state = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
dist.barrier()
if dist.get_rank() == 0:
    print(f"OK: the full state dict of {len(model_state)} parameters and their optimizer states (torch {torch.__version__})")
dist.destroy_process_group()
