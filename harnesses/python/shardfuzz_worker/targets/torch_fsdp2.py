"""torch-fsdp2: the case's model with `fully_shard` on every block and on the root, over the
data-parallel ranks (ZeRO-3 resharding after forward when the case asks for stage 3)."""

from .base import parallel, reduce_dtype_name
from .torch_common import TorchTarget, mesh, torch_dtype
from .torch_model import build, unsupported_layout
from .torch_training import combine_dp, single_device, train


class TorchFsdp2(TorchTarget):
    name = "torch-fsdp2"

    def unsupported(self, case):
        return unsupported_layout(case, ("dp",), "torch-fsdp2 shards over data-parallel ranks only",
                                  loss_scaling=True)

    def run_rank(self, rank, world, case, inputs):
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model, dt = build(case, inputs)
        named_before = [n for n, _ in model.named_parameters()]
        dm = mesh((world,), ("dp",))
        mp = MixedPrecisionPolicy(reduce_dtype=torch_dtype(reduce_dtype_name(case)))
        reshard = parallel(case)["zero_stage"] == 3
        for layer in model.layers:
            fully_shard(layer, mesh=dm, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=dm, mp_policy=mp, reshard_after_forward=reshard)
        params = dict(model.named_parameters())
        named = [(n, params[n]) for n in named_before]
        torch.manual_seed(0)
        out = train(case, inputs, model, [p for _, p in named], rank, world, named=named)
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        return combine_dp(case, outs, [f"fsdp2:dp{len(outs)}:zero{parallel(case)['zero_stage']}"])


TARGET = TorchFsdp2()
