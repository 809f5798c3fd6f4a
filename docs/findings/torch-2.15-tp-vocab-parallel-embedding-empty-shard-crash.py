"""torch 2.15 tensor parallel: a vocab-parallel embedding crashes on a rank whose vocabulary shard is empty.

The standard recipe, `parallelize_module(embedding, mesh, RowwiseParallel(input_layouts=Replicate()))`,
shards nn.Embedding's weight Shard(0) over the vocabulary. torch splits 6 rows over 4 ranks as 2, 2, 2, 0:
the last rank holds an empty [0, 8] table. DTensor's embedding rule (a masked lookup: each rank looks up
the ids in its range, zeroes the rest, and the partial results are summed) still runs the lookup there,
and index_select on an empty table raises
    RuntimeError: index_select(): self indexing axis dim should be positive
even though every id is masked on that rank; the other ranks then lose their peer. Single-device torch
runs the same embedding, and 8 rows (2 per rank) work. Found by shardfuzz on 2026-11-26 (torch-tp,
`bench guidance --targets torch-tp`, a random-generation run: vocabulary 5 over tp4, then `shardfuzz report`;
reduced by hand to this).

Run:  torchrun --nproc_per_node 4 torch-2.15-tp-vocab-parallel-embedding-empty-shard-crash.py
Prints each rank's local table and outcome; exits 1 on a crash or a wrong result.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

VOCAB = 6


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    emb, ref = nn.Embedding(VOCAB, 8), nn.Embedding(VOCAB, 8)
    ref.load_state_dict(emb.state_dict())
    parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))
    ids = torch.tensor([[0, 5, 1], [2, 3, 4]])
    try:
        out = emb(ids)
        out = out.full_tensor() if isinstance(out, DTensor) else out
        ok = torch.allclose(out, ref(ids))
        outcome = "OK" if ok else "MISMATCH"
    except RuntimeError as e:
        ok, outcome = False, f"CRASH on rank {rank}: {str(e).splitlines()[0][:120]}"
    print(f"rank {rank}: local table {tuple(emb.weight.to_local().shape)}: {outcome}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
