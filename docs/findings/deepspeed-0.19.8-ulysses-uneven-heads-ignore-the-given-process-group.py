"""DeepSpeed 0.19.8: DistributedAttention's uneven-heads all-to-all (a key-value head count that the sequence-parallel
size does not divide) takes each rank's share of the heads from the globally registered sequence-parallel rank, not
from the `sequence_process_group` the module was given.

`DistributedAttention(local_attention, sequence_process_group, ...)` sends its all-to-alls over the group it is
given, and for an even head count that is all it needs. `uneven_heads_all2all` (deepspeed/sequence/layer.py:157) also
needs this rank's position in the group to size its receive buffer and to know which heads it keeps, and reads it from
`groups._get_sequence_parallel_rank()` (layer.py:169, :202): the sp rank of a registered mpu or device mesh, and 0 when
there is neither. A caller who builds the group and passes it, as the constructor's arguments invite, gets rank 0's
share of the heads on every rank: the ranks disagree on the all-to-all's split sizes (gloo raises "enforce fail at
alltoallv.cc:138 inLengthPerRank[myRank] == outLengthPerRank[myRank]" on rank 1; NCCL has no such check). Inside a larger job with an mpu the registered sp rank and the
given group's rank can also simply differ.

Found while adding DeepSpeed-Ulysses to shardfuzz's deepspeed-zero target (probing DistributedAttention on its own, before
the target passed it the engine's group); not reported by a campaign: the target uses the engine's group, where the two
ranks agree.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-ulysses-uneven-heads-ignore-the-given-process-group.py [--fixed]
(CPU, gloo; 3 heads over sp 2; `--fixed` takes the rank from the given group). With `--fixed` rank 0 prints each
rank's error against single-device attention and OK (0 in f64); without it rank 1 fails inside the all-to-all with
gloo's enforce error above (torchrun then reports the failed rank): the bug.
"""

import importlib
import math
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.sequence import layer  # noqa: E402
from deepspeed.sequence.layer import DistributedAttention  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
GROUP = dist.new_group(list(range(WORLD)))  # the caller's own sequence-parallel group

if "--fixed" in sys.argv:
    released = layer.uneven_heads_all2all

    def uneven_heads_all2all(input, scatter_idx, gather_idx, batch_dim_idx, group, num_kv_heads):
        rank = dist.get_rank(group)
        original = layer.groups._get_sequence_parallel_rank
        layer.groups._get_sequence_parallel_rank = lambda: rank
        try:
            return released(input, scatter_idx, gather_idx, batch_dim_idx, group, num_kv_heads)
        finally:
            layer.groups._get_sequence_parallel_rank = original

    layer.uneven_heads_all2all = uneven_heads_all2all


def causal(q, k, v):
    """Causal attention in the batch-first layout [batch, seq, heads, head_dim]."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    s = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, -1) @ v).transpose(1, 2)


HEADS, SEQ = 3, 2 * WORLD  # 3 heads: sp 2 does not divide them
torch.manual_seed(0)
q, k, v = (torch.randn(1, SEQ, HEADS, 4, dtype=torch.float64) for _ in range(3))
part = slice(RANK * SEQ // WORLD, (RANK + 1) * SEQ // WORLD)  # this rank's part of the sequence
out = DistributedAttention(causal, GROUP, scatter_idx=2, gather_idx=1)(q[:, part], k[:, part], v[:, part], 0)
error = (out - causal(q, k, v)[:, part]).abs().max()
errors = [torch.zeros((), dtype=torch.float64) for _ in range(WORLD)]
dist.all_gather(errors, error)
if RANK == 0:
    print("max |DistributedAttention - single-device attention| per rank:", ", ".join(f"{float(e):.2e}" for e in errors))
    print("MISMATCH" if max(float(e) for e in errors) > 1e-12 else "OK")
