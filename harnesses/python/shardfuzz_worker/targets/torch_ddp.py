"""torch-ddp: the case's model wrapped in DistributedDataParallel over the data-parallel ranks, its gradient buckets
of the case's `reduce_bucket` elements (by default 1 MB), its gradients views into those buckets with
`contiguous_grads` (`gradient_as_bucket_view`), `static_graph` and `find_unused` (`find_unused_parameters`) as the
case sets them, accumulated micro-batches under `no_sync` (reduced with the last) unless the case's
`sync_every_microbatch` asks for every one reduced, and a `reduce_dtype` below
the compute dtype as DDP's own compression hooks (`bf16_compress_hook`, `fp16_compress_hook`); with context
parallelism (`parallel.cp`), torch's own (`torch_context_parallel`), DDP over the dp x cp ranks together."""

from .base import dtype_name, parallel, reduce_bucket, reduce_dtype_name, reduction_feature, sync_every_microbatch, sync_feature
from . import torch_context_parallel as torch_cp
from .torch_common import TorchTarget, mesh
from .torch_model import build, sparse_embedding, unsupported_layout, unsupported_sparse_embedding
from .torch_release import clips_sparse_gradients
from .torch_training import combine_dp, single_device, train


class TorchDdp(TorchTarget):
    name = "torch-ddp"
    freezes = True
    smooths_labels = True

    def unsupported(self, case):
        why = (unsupported_layout(case, ("dp", "cp"), "DDP expresses data (and torch's context) parallelism only",
                                  loss_scaling=True, moe="torch")
               or unsupported_sparse_embedding(case) or torch_cp.unsupported_context_parallel(case))
        if why:
            return why
        p = parallel(case)
        if p["zero_stage"] > 0:
            return "ZeRO stages are not DDP (see torch-fsdp2, deepspeed-zero)"
        rd = reduce_dtype_name(case)
        if rd != dtype_name(case) and rd not in COMPRESS_HOOKS:
            return f"DDP reduces gradients in their own dtype or, through a compression hook, in {' / '.join(COMPRESS_HOOKS)}"
        if rd == "f16" and sparse_embedding(case):
            # Measured (campaign 114): the fp16 hook's sparse gradients come back through `"cadd_sparse" not
            # implemented for 'Half'` (torch has no CPU kernel adding f16 sparse tensors; bf16 has one).
            return "torch has no CPU kernel adding the f16 sparse gradients DDP's fp16 hook reduces"
        if sparse_embedding(case) and case["train"].get("clip_grad_norm") is not None and not clips_sparse_gradients():
            # Measured (campaign 219, torch 2.4.1): the sharded run crashes in clip_grad_norm_, as one device does.
            return "this torch's clip_grad_norm_ takes no sparse gradient (on one device either)"
        if case["model"].get("activation_checkpointing") == "reentrant" and p["find_unused"]:
            # DDP's documentation: with use_reentrant=True it works "when there are no unused parameters ... (make
            # sure you are not passing `find_unused_parameters=True` to DDP)"; its reducer then raises "Expected to
            # mark a variable ready only once" in the backward.
            return "DDP documents re-entrant activation checkpointing as unsupported with find_unused_parameters=True"
        if case["model"].get("activation_checkpointing") == "reentrant" and case["model"].get("layer_passes", 1) > 1 \
                and not p["static_graph"]:
            # The reducer's own error names this: "Reused parameters in multiple reentrant backward passes ... DDP does
            # not support such use cases in default. You can try to use _set_static_graph() as a workaround".
            return "DDP documents parameters reused by several re-entrant checkpointed passes as unsupported without static_graph"
        return None

    def run_rank(self, rank, world, case, inputs):
        from torch.nn.parallel import DistributedDataParallel as DDP

        model, dt = build(case, inputs, sparse_embedding(case))
        p = parallel(case)
        cp = p["cp"]
        seq = None
        if cp > 1:  # DDP over the dp x cp ranks, torch's context parallelism over the cp ones
            torch_cp.install(model)
            seq = torch_cp.TorchSequenceSplit(mesh((world // cp, cp), ("dp", "cp"))["cp"], torch_cp.rotate_method(case))
        ddp = DDP(model, bucket_cap_mb=bucket_cap_mb(case, dt), gradient_as_bucket_view=bool(p["contiguous_grads"]),
                  static_graph=bool(p["static_graph"]), find_unused_parameters=bool(p["find_unused"]))
        hook = compress_hook(case)
        if hook is not None:
            ddp.register_comm_hook(state=None, hook=hook)
        named = list(model.named_parameters())
        # Accumulated micro-batches under no_sync, reduced with the last, unless the case asks for every one reduced.
        no_sync = None if sync_every_microbatch(case, False) else ddp.no_sync
        out = train(case, inputs, ddp, [p for _, p in named], rank // cp, world // cp, no_sync=no_sync, named=named,
                    seq=seq)
        out["baseline"] = single_device(case, inputs, torch_cp.baseline_attention(case)) if rank == 0 else None
        return out

    def combine(self, case, outs):
        prefix = f"ddp:dp{len(outs) // parallel(case)['cp']}"
        sparse = [f"{prefix}:sparse-embedding"] if sparse_embedding(case) else []
        p = parallel(case)
        view = [f"{prefix}:bucket-view"] if p["contiguous_grads"] else []
        static = [] if p["static_graph"] is None else [f"{prefix}:{'static' if p['static_graph'] else 'dynamic'}-graph"]
        if p["find_unused"] is not None:
            static.append(f"{prefix}:{'finds-unused' if p['find_unused'] else 'expects-every-gradient'}")
        rd = reduce_dtype_name(case)
        hook = [f"{prefix}:{dtype_name(case)}-compressed-to-{rd}"] if rd != dtype_name(case) else []
        sync = sync_feature(prefix, case, False)
        cp = torch_cp.features(prefix, case)
        return combine_dp(case, outs, [prefix, reduction_feature(prefix, case), *sparse, *view, *static, *hook, *sync, *cp])


COMPRESS_HOOKS = {"bf16": "bf16_compress_hook", "f16": "fp16_compress_hook"}


def compress_hook_name(case):
    """The name in `default_hooks` of DDP's own hook reducing the case's gradients in its narrower `reduce_dtype`
    (None: no hook)."""
    rd = reduce_dtype_name(case)
    return None if rd == dtype_name(case) else COMPRESS_HOOKS[rd]


def compress_hook(case):
    """The hook of compress_hook_name(case) itself, or None."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    name = compress_hook_name(case)
    return None if name is None else getattr(default_hooks, name)


def bucket_cap_mb(case, dt):
    """DDP's bucket size in MB for the case's `reduce_bucket` elements of dtype `dt` (1 MB by default)."""
    b = reduce_bucket(case, None)
    return 1 if b is None else b * dt.itemsize / 2**20


TARGET = TorchDdp()
