"""DTensor binary_cross_entropy_with_logits (reduction "mean") over a target sharded unevenly.

torch 2.15.0: 5 rows over 2 ranks (Shard(0), uneven), input replicated or sharded alike, with or
without a weight: the mean comes out 0.2-0.4 % off in float64 (the same wrong mean over uneven shards
as mse_loss and soft_margin_loss, in another loss's sharding rule); 6 rows (even shards) are exact.
Found by a 15-minute torch-dtensor campaign (2026-11-25: sample 37, target S(0) on a 1x2 mesh, f64),
confirmed on real gloo ranks; this script is the minimal version.

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-bce-with-logits-uneven-mean.py
Prints one line per mesh shape and placement: the largest difference from single-device torch.
"""
import torch, torch.distributed as dist, torch.nn.functional as F, logging
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
dist.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn(5, 5, dtype=torch.float64); t = torch.rand(5, 5, dtype=torch.float64); w = torch.rand(1, 5, dtype=torch.float64)
for shape in [(2,), (1, 2), (2, 1)]:
    mesh = init_device_mesh("cpu", shape)
    R = [Replicate()] * len(shape)
    for xs, ts, use_w in [(R, [Shard(0)] + R[1:], True), (R, [Shard(0)] + R[1:], False), ([Shard(0)] + R[1:], [Shard(0)] + R[1:], True)]:
        ref = F.binary_cross_entropy_with_logits(x, t, weight=w if use_w else None)
        out = F.binary_cross_entropy_with_logits(distribute_tensor(x, mesh, xs), distribute_tensor(t, mesh, ts),
                                                 weight=distribute_tensor(w, mesh, R) if use_w else None).full_tensor()
        if dist.get_rank() == 0:
            print(shape, "x", xs, "t", ts, "weight" if use_w else "", "diff %.3g" % (out - ref).abs().item())
