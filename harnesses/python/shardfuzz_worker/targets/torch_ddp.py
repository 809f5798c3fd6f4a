"""torch-ddp: the case's model wrapped in DistributedDataParallel over the data-parallel ranks, its gradient buckets
of the case's `reduce_bucket` elements (by default 1 MB), its gradients views into those buckets with
`contiguous_grads` (`gradient_as_bucket_view`), `static_graph` and `find_unused` (`find_unused_parameters`) as the
case sets them, accumulated micro-batches under `no_sync` (reduced with the last) unless the case's
`sync_every_microbatch` asks for every one reduced, and a `reduce_dtype` below
the compute dtype as DDP's own compression hooks (`bf16_compress_hook`, `fp16_compress_hook`); with context
parallelism (`parallel.cp`), torch's own (`torch_context_parallel`), DDP over the dp x cp ranks together. Under
`zero_stage` 1 the optimizer is torch's ZeroRedundancyOptimizer (`torch_zero_redundancy`). `resume_after` saves the
model's and the optimizer's state dicts on rank 0 (a ZeroRedundancyOptimizer's consolidated there first), as torch's
DDP tutorial does, and loads them on every rank into a fresh model, DDP wrapper and optimizer."""

from .base import (dtype_name, parallel, reduce_bucket, reduce_dtype_name, reduction_feature, resume_feature,
                   sync_every_microbatch, sync_feature)
from . import torch_context_parallel as torch_cp
from . import torch_zero_redundancy as zero
from .torch_common import TorchTarget, check_compiled, compiled, compiling, mesh
from .torch_model import build, make_optimizer, sparse_embedding, unsupported_layout, unsupported_sparse_embedding
from .torch_release import clips_sparse_gradients
from .torch_training import combine_dp, single_device, train


class TorchDdp(TorchTarget):
    name = "torch-ddp"
    freezes = True
    rotates = True
    smooths_labels = True
    clip_norms = ("l1", "l2", "inf")
    optimizer_implementations = True

    def unsupported(self, case):
        why = (unsupported_layout(case, ("dp", "cp"), "DDP expresses data (and torch's context) parallelism only",
                                  loss_scaling=True, moe="torch")
               or unsupported_sparse_embedding(case) or torch_cp.unsupported_context_parallel(case))
        if why:
            return why
        p = parallel(case)
        if p["zero_stage"] > 1:
            return "torch's ZeroRedundancyOptimizer beside DDP shards optimizer states only (ZeRO 1; see torch-fsdp2)"
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
        p = parallel(case)
        cp = p["cp"]
        compiling(case)
        run = DdpRun(case, inputs, world, rank)
        named = run.wrap()
        # Accumulated micro-batches under no_sync, reduced with the last, unless the case asks for every one reduced.
        no_sync = None if sync_every_microbatch(case, False) else lambda: run.ddp.no_sync()
        out = train(case, inputs, run.ddp, [p for _, p in named], rank // cp, world // cp, no_sync=no_sync, named=named,
                    seq=run.seq, forward=lambda ids: run.forward(ids), resume=run.resume, optimizer=run.optimizer)
        check_compiled(case)
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
        return combine_dp(case, outs, [prefix, reduction_feature(prefix, case), *sparse, *view, *static, *hook, *sync, *cp,
                                       *zero_features(prefix, case, len(outs)), *resume_feature(prefix, case),
                                       *([f"{prefix}:compiled"] if case["train"].get("compiled") else [])])


class DdpRun:
    """One rank's DDP-wrapped model as `train` drives it: the wrapper (`ddp`, replaced when the run resumes), its
    forward (`forward`: the wrapper, or under the case's `compiled` the wrapper compiled), its context-parallel split
    (`seq`) and the optimizer the case asks for (`optimizer`: make_optimizer's, or under ZeRO 1 a
    ZeroRedundancyOptimizer over `group`, None: every rank)."""

    def __init__(self, case, inputs, world, rank):
        p = parallel(case)
        self.case, self.inputs, self.ddp, self.forward, self.seq, self.group = case, inputs, None, None, None, None
        if p["cp"] > 1:  # DDP over the dp x cp ranks, torch's context parallelism over the cp ones
            self.seq = torch_cp.TorchSequenceSplit(mesh((world // p["cp"], p["cp"]), ("dp", "cp"))["cp"],
                                                   torch_cp.rotate_method(case))
        if p["zero_stage"] == 1:
            self.group = zero.shard_group(p["zero_shard_group"], world, rank)

    def optimizer(self, params):
        """`train`'s `optimizer`: make_optimizer's, or under ZeRO 1 a ZeroRedundancyOptimizer over `group`."""
        p = parallel(self.case)
        if p["zero_stage"] == 1:
            return zero.zero_redundancy_optimizer(self.case, params, self.group, bool(p["param_buckets"]))
        return make_optimizer(self.case, params)

    def wrap(self, state=None):
        """A fresh model (its parameters from `state`, a state dict, where given) in DDP as the case asks; returns its
        (name, parameter) pairs."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        case, p = self.case, parallel(self.case)
        model, dt = build(case, self.inputs, sparse_embedding(case))
        if state is not None:
            model.load_state_dict(state)
        if p["cp"] > 1:
            torch_cp.install(model)
        self.ddp = DDP(model, bucket_cap_mb=bucket_cap_mb(case, dt), gradient_as_bucket_view=bool(p["contiguous_grads"]),
                       static_graph=bool(p["static_graph"]), find_unused_parameters=bool(p["find_unused"]))
        hook = compress_hook(case)
        if hook is not None:
            self.ddp.register_comm_hook(state=None, hook=hook)
        self.forward = compiled(case, self.ddp)  # (compiled whole: Dynamo's DDPOptimizer splits it at the buckets)
        return list(model.named_parameters())

    def resume(self, opt):
        """`train`'s `resume`: the model's and optimizer's state dicts saved by rank 0, loaded on every rank into a
        fresh model, wrapper and optimizer."""
        saved = zero.saved_and_loaded(self.ddp.module, opt)
        named = self.wrap(saved["model"])
        opt = self.optimizer([q for _, q in named])
        opt.load_state_dict(saved["optim"])
        return named, opt


def zero_features(prefix, case, world):
    """The ZeRO-1 layout: `prefix:zero1` and its shard group and parameter buckets where the case sets them."""
    p = parallel(case)
    if p["zero_stage"] != 1:
        return []
    out = [f"{prefix}:zero1"]
    g = p["zero_shard_group"]
    if g is not None and g != world:
        out.append(f"{prefix}:zero1:shard-group{g}")
    if p["param_buckets"] is not None:
        out.append(f"{prefix}:zero1:{'param-buckets' if p['param_buckets'] else 'separate-params'}")
    return out


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
