"""torch's own ZeRO stage 1, `torch.distributed.optim.ZeroRedundancyOptimizer`, as torch-ddp runs it under the case's
`zero_stage` 1: DDP all-reduces every gradient, each rank steps the case's optimizer over its partition of the
parameters (greedy by size within each parameter group) and broadcasts the updated partition to the others. With the
case's `zero_shard_group` g, the partitions split within each group of g consecutive ranks (the optimizer's
`process_group`) and are replicated across the groups; with `param_buckets`, each partition is one contiguous bucket
the parameters are views of (`parameters_as_bucket_view`)."""

from .base import parallel


def shard_group(case, world, rank):
    """The process group of `rank`'s g consecutive ranks for the case's `zero_shard_group` g below `world` (every rank
    creates every group, in the same order), or None: the optimizer partitions over all ranks."""
    import torch.distributed as dist

    g = parallel(case)["zero_shard_group"]
    if g is None or g == world:
        return None
    groups = [dist.new_group(list(range(start, start + g))) for start in range(0, world, g)]
    return groups[rank // g]


def sharded_optimizer(case, group):
    """`train`'s `optimizer`: the case's optimizer (make_optimizer's class, parameter groups and settings) as each
    rank's partition of a ZeroRedundancyOptimizer over `group` (None: every rank)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from .torch_model import optimizer_parts

    def make(params):
        cls, groups, kw = optimizer_parts(case, params)
        return ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=group,
                                       parameters_as_bucket_view=bool(parallel(case)["param_buckets"]), **kw)

    return make


def optimizer_state(opt):
    """The optimizer's whole state dict on global rank 0 (None elsewhere): a ZeroRedundancyOptimizer's consolidated
    there first, as its documentation asks before saving (every rank calls this)."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(opt, ZeroRedundancyOptimizer):
        opt.consolidate_state_dict(to=0)  # (rank 0 of its group: global rank 0's group holds it)
    return opt.state_dict() if dist.get_rank() == 0 else None
