"""torch's own ZeRO stage 1, `torch.distributed.optim.ZeroRedundancyOptimizer`, as torch-ddp runs it under the case's
`zero_stage` 1: DDP all-reduces every gradient, each rank steps the case's optimizer over its partition of the
parameters (greedy by size within each parameter group) and broadcasts the updated partition to the others. With the
case's `zero_shard_group` g, the partitions split within each group of g consecutive ranks (the optimizer's
`process_group`) and are replicated across the groups; with `param_buckets`, each partition is one contiguous bucket
the parameters are views of (`parameters_as_bucket_view`)."""

from .torch_common import shared_tempdir
from .torch_model import optimizer_parts


def shard_group(g, world, rank):
    """The process group of `rank`'s g consecutive ranks (the case's `zero_shard_group`) where g is below `world`
    (every rank creates every group, in the same order), or None: the optimizer partitions over all ranks."""
    import torch.distributed as dist

    if g is None or g == world:
        return None
    groups = [dist.new_group(list(range(start, start + g))) for start in range(0, world, g)]
    return groups[rank // g]


def zero_redundancy_optimizer(case, params, group, buckets):
    """The case's optimizer (make_optimizer's class, parameter groups and settings) as this rank's partition of a
    ZeroRedundancyOptimizer over `group` (None: every rank), its partitions parameter buckets where `buckets`."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls, groups, kw = optimizer_parts(case, params)
    return ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=group, parameters_as_bucket_view=buckets,
                                   **kw)


def saved_and_loaded(module, opt):
    """The module's and the optimizer's state dicts (`model`, `optim`) saved by global rank 0 with torch.save, as
    torch's DDP tutorial checkpoints, and loaded by every rank; a ZeroRedundancyOptimizer is consolidated on rank 0
    first, as its documentation asks (every rank calls this)."""
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(opt, ZeroRedundancyOptimizer):
        opt.consolidate_state_dict(to=0)  # (rank 0 of each group: global rank 0's group holds it)
    with shared_tempdir() as path:
        file = os.path.join(path, "checkpoint.pt")
        if dist.get_rank() == 0:
            torch.save({"model": module.state_dict(), "optim": opt.state_dict()}, file)
        dist.barrier()
        return torch.load(file)
