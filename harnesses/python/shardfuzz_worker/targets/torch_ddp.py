"""torch-ddp: the case's model wrapped in DistributedDataParallel over the data-parallel ranks."""

from .base import dtype_name, parallel, reduce_dtype_name
from .torch_common import TorchTarget, torch_dtype
from .torch_model import Model, load_case_params, model_defaults, unsupported_model
from .torch_training import combine_dp, single_device, train


class TorchDdp(TorchTarget):
    name = "torch-ddp"
    rejection_types = ("ValueError",)

    def unsupported(self, case):
        why = unsupported_model(case)
        if why:
            return why
        p = parallel(case)
        if p["tp"] > 1 or p["pp"] > 1 or p["cp"] > 1 or p["ep"] > 1:
            return "DDP expresses data parallelism only"
        if p["zero_stage"] > 0:
            return "ZeRO stages are not DDP (see torch-fsdp2, deepspeed-zero)"
        if reduce_dtype_name(case) != dtype_name(case):
            return "DDP reduces gradients in their own dtype"
        return None

    def run_rank(self, rank, world, case, inputs):
        from torch.nn.parallel import DistributedDataParallel as DDP

        dt = torch_dtype(dtype_name(case))
        model = Model(model_defaults(case)).to(dt)
        load_case_params(model, inputs, dt)
        ddp = DDP(model, bucket_cap_mb=1)
        named = list(model.named_parameters())
        out = train(case, inputs, ddp, [p for _, p in named], rank, world, no_sync=ddp.no_sync, named=named)
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        return combine_dp(case, outs, [f"ddp:dp{len(outs)}"])


TARGET = TorchDdp()
