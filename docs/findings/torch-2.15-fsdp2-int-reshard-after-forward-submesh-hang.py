"""PyTorch 2.15: FSDP2 with an integer `reshard_after_forward` over a sub-mesh (2-D FSDP + tensor parallelism) hangs.

For `reshard_after_forward=g` (1 < g < the shard group's size), `_get_post_forward_mesh_info` builds the post-forward
mesh as `DeviceMesh(device_type, mesh_info.mesh.mesh.view(-1, g))`: from the ranks of *this rank's* data-parallel
mesh. Creating a DeviceMesh calls `new_group` for every sub-group of its tensor, a call every rank of the world must
make with the same arguments in the same order. Over a whole-world mesh (FSDP or HSDP alone) every rank passes the same
tensor; over the `dp` sub-mesh of a (dp, tp) mesh (torchtitan's FSDP + TP layout) the ranks of each tensor-parallel
index pass a different one (ranks 0, 2, 4, 6 build groups [0, 2], [4, 6]; ranks 1, 3, 5, 7 build [1, 3], [5, 7]), so
the group creations pair up wrongly: the run hangs in `fully_shard` or at the first collective. Any FSDP mesh that is
a sub-mesh is affected (beside pipeline parallelism too); this script's parameters are plain tensors. Where they are
tensor-parallel DTensors, FSDP2 does not support the mode at all: with the fix below the run reaches its own
`NotImplementedError: Resharding to smaller mesh is not supported for DTensor parameters yet` in the first forward, a
refusal the hang keeps the user from ever seeing.

Found by shardfuzz (torch-fsdp2 target, campaign seed 235, its first 5 minutes with FSDP2 beside tensor parallelism):
dp 4 × tp 2, sequence parallel, ZeRO-3 with `reshard_group` 2 (`reshard_after_forward=2`), bf16: every rank stuck
after 60 s, half of them in `_create_gloo_process_group` under `fully_shard`, the others in the forward's first
all-gather.

Run: torchrun --nproc_per_node 8 torch-2.15-fsdp2-int-reshard-after-forward-submesh-hang.py [--fix]
(CPU, gloo). Prints HANG (after 60 s) or OK on rank 0. `--fix` builds the post-forward mesh from the root mesh, the
same on every rank (the sub-mesh's dimensions last, split into groups of g), and keeps the row holding this rank.
"""

import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_init, _fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_common import HSDPMeshInfo

dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
TP, RESHARD = 2, 2
DP = WORLD // TP


def watchdog():
    if RANK == 0:
        print("HANG: no rank finished within 60 s (the post-forward meshes of fully_shard(reshard_after_forward="
              f"{RESHARD}) were created from different rank lists on different ranks)", flush=True)
    os._exit(1)


if "--fix" in sys.argv:
    original = _fsdp_init._get_post_forward_mesh_info

    def post_forward_mesh_info(reshard_after_forward, mesh_info):
        mesh = mesh_info.mesh
        root = mesh._get_root_mesh()
        plain = isinstance(reshard_after_forward, bool) or reshard_after_forward in (1, mesh_info.shard_mesh_size)
        if plain or root is mesh:
            return original(reshard_after_forward, mesh_info)
        names = root.mesh_dim_names
        inner = [names.index(n) for n in mesh.mesh_dim_names]
        outer = [i for i in range(len(names)) if i not in inner]
        every = root.mesh.permute(*outer, *inner).reshape(-1, reshard_after_forward)  # the same on every rank
        return HSDPMeshInfo(DeviceMesh(mesh.device_type, every), shard_mesh_dim=1, replicate_mesh_dim=0)

    _fsdp_init._get_post_forward_mesh_info = post_forward_mesh_info
    _fully_shard._get_post_forward_mesh_info = post_forward_mesh_info

timer = threading.Timer(60.0, watchdog)
timer.start()

mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=RESHARD)
fully_shard(model, mesh=mesh["dp"], reshard_after_forward=RESHARD)
x = torch.randn(3, 8)
model(x).square().sum().backward()
dist.barrier()
timer.cancel()
if RANK == 0:
    print("OK: forward and backward finished on every rank")
dist.destroy_process_group()
