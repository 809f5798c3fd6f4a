"""torch-fsdp1: the case's model in PyTorch's original FullyShardedDataParallel (FSDP1, `torch.distributed.fsdp.
FullyShardedDataParallel`: flat parameters), one FSDP unit per block and one at the root, over the data-parallel
ranks, with `use_orig_params=True` (the original parameters as views into the flat ones; frozen parameters allowed).
The case's ZeRO stage is the sharding strategy: 0 `NO_SHARD` (DDP-like), 2 `SHARD_GRAD_OP`, 3 `FULL_SHARD`; with a
`zero_shard_group` g dividing dp, sharded within each group of g consecutive ranks and replicated across the groups
(`HYBRID_SHARD` at stage 3, `_HYBRID_SHARD_ZERO2` at stage 2, over a (dp / g, g) device mesh). A `master_dtype` wider
than the compute dtype holds the model in it and computes in the case dtype (`MixedPrecision(param_dtype=...)`); a
`reduce_dtype` other than the compute dtype reduces gradients in it (`MixedPrecision(reduce_dtype=...)`). With
`flat_params`, `use_orig_params=False`: the optimizer steps the flat parameters. Accumulated micro-batches are reduced
with the last under the root's `no_sync()` where the case's `sync_every_microbatch` is false; a `loss_scale` is
FSDP1's `ShardedGradScaler`; clipping is FSDP1's own `clip_grad_norm_` (the norm over every rank's shard);
`resume_after` checkpoints through torch.distributed.checkpoint's state-dict API, and the run resumes into the sharding
strategy and shard group of `train.resume_parallel` where the case gives one. Full gradients and parameters are
read with `summon_full_params` (`Fsdp1Run`). `zero_offload` (`CPUOffload(offload_params=True)`) pins memory, which
needs CUDA: unsupported here."""

from .base import (dtype_name, master_dtype_name, parallel, reduce_dtype_name, resume_feature, resumed_case,
                   sync_every_microbatch, sync_feature, zero_offloaded)
from .torch_common import TorchTarget, check_compiled, compiled, compiling, mesh, shared_tempdir, torch_dtype
from .torch_dcp import load_checkpoint, save_checkpoint
from .torch_model import build, clip_norm_type, make_optimizer, to_case_layout, unsupported_layout
from .torch_training import combine_dp, single_device, train

#: The sharding strategy per ZeRO stage, and with a shard group smaller than the data-parallel ranks (hybrid).
STRATEGIES = {(0, False): "NO_SHARD", (2, False): "SHARD_GRAD_OP", (3, False): "FULL_SHARD",
              (2, True): "_HYBRID_SHARD_ZERO2", (3, True): "HYBRID_SHARD"}


class TorchFsdp1(TorchTarget):
    name = "torch-fsdp1"
    freezes = True
    rotates = True
    smooths_labels = True
    clip_norms = ("l1", "l2", "inf")
    checkpoint_layouts = ("sharded", "gathered")  # (torch_dcp: DCP shards, or full state dicts through rank 0)
    # A run resumes into another sharding strategy or shard group of the same ranks (torch.distributed.checkpoint
    # reshards the state dicts on load).
    resumes_into = ("zero_stage", "zero_shard_group")
    optimizer_implementations = True

    def unsupported(self, case):
        why = unsupported_layout(case, ("dp",), "torch-fsdp1 shards over data-parallel ranks only", offload=True,
                                 master_weights=True, moe="torch", loss_scaling=True)
        if why:
            return why
        if zero_offloaded(case):
            # Measured (torch 2.15): FlatParamHandle.init_flat_param_attributes pins the offloaded shard and its
            # gradient buffer (`pin_memory()`), which raises "Found no NVIDIA driver" without CUDA.
            return "FSDP1's CPUOffload pins host memory, which needs CUDA"
        p = parallel(case)
        if p["zero_stage"] == 1:
            return "FSDP1 has no stage sharding the optimizer state alone (SHARD_GRAD_OP is ZeRO-2)"
        g = p["zero_shard_group"]
        if g is not None and g != p["dp"]:
            if p["zero_stage"] == 0:
                return "FSDP1's NO_SHARD has no shard group"
            if g == 1 or p["dp"] % g:
                return f"FSDP1's hybrid sharding needs a shard group of 2 or more ranks dividing dp ({p['dp']}), not {g}"
        for field in ("reshard_group", "param_shard_dim", "reduce_bucket", "static_graph", "find_unused"):
            if p[field] is not None:
                return f"`{field}` is not an FSDP1 option here"
        if case["model"].get("sparse_embedding"):
            return "FSDP1 flattens parameters: no sparse gradients"
        if case["train"].get("compiled") and p["flat_params"] and case["model"].get("activation_checkpointing") == "reentrant":
            # Measured (torch 2.15, campaign 314's case on its release): Dynamo breaks the graph at every frame, the run
            # is eager (check_compiled's harness error); without re-entrant checkpoints or with original parameters
            # it captures graphs.
            return ("torch.compile captures no graph of an FSDP1 model with flat parameters under re-entrant "
                    "checkpoints (the run would be eager)")
        if p["flat_params"] and case["train"]["optimizer"].get("no_decay_vectors"):
            return "with flat parameters (use_orig_params=False) the optimizer sees no per-parameter shapes to group by"
        return None

    def run_rank(self, rank, world, case, inputs):
        compiling(case)
        run = Fsdp1Run(bool(parallel(case)["flat_params"]), lambda model: compiled(case, model))

        def built(layout):
            return run.adopt(*sharded_model(layout, inputs, world))

        named = built(case)
        # (A resumed run's fresh model is wrapped as the case's train.resume_parallel asks, where it gives one.)
        resumed = resumed_case(case)
        try:
            out = train(case, inputs, run.model, run.optimized, rank, world, named=named,
                        **run.hooks(case, lambda: built(resumed), sync_every_microbatch(case, True)))
        except LostParameters as lost:
            return {"lost": lost.args[0]}
        check_compiled(case)
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        lost = next((o["lost"] for o in outs if o.get("lost")), None)
        if lost:
            return {"status": "divergent",
                    "reason": f"FSDP1 no longer registers {len(lost)} of the model's parameters on their modules after "
                              f"training ({', '.join(lost[:3])}{' ...' if len(lost) > 3 else ''}): model.parameters(), "
                              "a state dict or summon_full_params no longer contain them"}
        p = parallel(case)
        dp = len(outs)
        stage = f"fsdp1:dp{dp}:{strategy(p, dp).strip('_').lower().replace('_', '-')}"
        layout = []
        if master_dtype_name(case) != dtype_name(case):
            layout.append(f"{stage}:{dtype_name(case)}-computed-from-{master_dtype_name(case)}")
        if reduce_dtype_name(case) != dtype_name(case):
            layout.append(f"{stage}:{dtype_name(case)}-reduced-in-{reduce_dtype_name(case)}")
        if hybrid_group(p, dp):
            layout.append(f"{stage}:shard-group{p['zero_shard_group']}")
        layout += sync_feature(stage, case, True) + resume_feature(stage, case)
        if p["flat_params"] is not None:
            layout.append(f"{stage}:{'flat' if p['flat_params'] else 'original'}-params")
        if case["train"].get("compiled"):
            layout.append(f"{stage}:compiled")
        return combine_dp(case, outs, [stage, *layout])


def clean(name):
    """A parameter's name without FSDP1's wrapper prefixes."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def hybrid_group(p, dp):
    """The case's shard group where it is smaller than the data-parallel ranks (hybrid sharding), else None."""
    g = p["zero_shard_group"]
    return g if g is not None and g != dp else None


def strategy(p, dp):
    """FSDP1's sharding strategy (a ShardingStrategy name) for the case's ZeRO stage and shard group."""
    return STRATEGIES[(p["zero_stage"], hybrid_group(p, dp) is not None)]


def sharded_model(case, inputs, dp):
    """The case's model held in its master dtype, each block and the root wrapped in FSDP1 as the case asks; returns
    wrap_units's (model, the parameter names before wrapping)."""
    import torch
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

    p = parallel(case)
    model, _ = build(case, inputs, dtype=master_dtype_name(case))
    mixed = master_dtype_name(case) != dtype_name(case) or reduce_dtype_name(case) != dtype_name(case)
    kw = {"sharding_strategy": getattr(ShardingStrategy, strategy(p, dp)),
          "device_id": torch.device("cpu"), "use_orig_params": not p["flat_params"],
          "mixed_precision": MixedPrecision(param_dtype=torch_dtype(dtype_name(case)),
                                            reduce_dtype=torch_dtype(reduce_dtype_name(case))) if mixed else None}
    g = hybrid_group(p, dp)
    if g:
        kw["device_mesh"] = mesh((dp // g, g), ("replicate", "shard"))
    return wrap_units(model, **kw)


def wrap_units(model, **kw):
    """FSDP1 with the options `kw` on every block of `model` and on its root; returns (the wrapped root, the parameter
    names before wrapping). Each parameter keeps its dimensions before flattening as `case_ndim`: FSDP1 exposes it as a
    1-D view, and make_optimizer groups by these."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    names = [n for n, _ in model.named_parameters()]
    for q in model.parameters():
        q.case_ndim = q.dim()
    for i, layer in enumerate(model.layers):
        model.layers[i] = FSDP(layer, **kw)
    return FSDP(model, **kw), names


def sharded_grad_scaler(train_cfg):
    """FSDP1's own dynamic loss scaler (`ShardedGradScaler`: it unscales float16 gradients and agrees on an overflow
    over every rank) with the case's initial scale, halved on an overflow and never grown, as the reference's is."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    scale = train_cfg.get("loss_scale")
    if scale is None:
        return None
    return ShardedGradScaler("cpu", init_scale=float(scale), growth_factor=2.0, backoff_factor=0.5,
                             growth_interval=2**31 - 1)


class LostParameters(Exception):
    """The wrapped model no longer lists parameters it was built with (their names): FSDP1 left them unregistered."""


class Fsdp1Run:
    """One rank's run of an FSDP1-wrapped model as `train` drives it: the model (replaced when the run resumes), what
    its optimizer steps (`optimized`) and the hooks `train` takes (`hooks`). The step-0 gradients and final parameters
    are each gathered once (every rank at once, in the same order, as `train` asks for them) with FSDP1's
    `summon_full_params`: a parameter here is a view of this rank's part of a flat parameter. With flat parameters
    (`flat`: use_orig_params=False, where summon_full_params gathers no gradients) the gradients are the flat
    parameters' own, gathered and split by their metadata (`flat_gradients`), and `train` gets a placeholder per
    name."""

    def __init__(self, flat, compile_model=None):
        import torch

        self.model, self.names, self.grads, self.params = None, [], None, None
        self.flat, self.optimized, self.placeholder = flat, [], torch.nn.Parameter(torch.empty(0))
        # (`compile_model`: the wrapped model as the forward runs it, torch.compile over FSDP1 as users compile it;
        # the parameters are read from the wrapped model itself.)
        self.compile_model, self.forward_model = compile_model or (lambda model: model), None

    def adopt(self, model, names):
        """Takes the wrapped `model`, built with the parameters `names` (wrap_units); returns `train`'s (name,
        parameter) pairs and sets `optimized`: the flat parameters, or the original ones (views into them)."""
        self.model, self.names = model, names
        self.forward_model = self.compile_model(model)
        if self.flat:
            self.optimized = list(model.parameters())
            return [(n, self.placeholder) for n in names]
        params = {clean(n): q for n, q in model.named_parameters()}
        named = [(n, params[n]) for n in names]
        self.optimized = [q for _, q in named]
        return named

    def hooks(self, case, rebuild, sync_every_microbatch):
        """`train`'s keyword arguments for the run: the forward, FSDP1's clipping and loss scaler, its `no_sync()` on
        all but a step's last micro-batch unless `sync_every_microbatch`, the readers below, and resuming: the model
        and optimizer saved with torch.distributed.checkpoint, `rebuild()` (a fresh model through `adopt`) and a
        fresh optimizer loaded from it."""
        clip = case["train"].get("clip_grad_norm")

        def resume(opt):
            # (gathered: full state dicts saved by rank 0 and read by every rank; torch's broadcast from rank 0 is
            # documented for DTensor only)
            gathered = case["train"].get("checkpoint_layout") == "gathered"
            with shared_tempdir() as path:
                save_checkpoint(self.model, opt, path, gathered)
                named = rebuild()
                opt = make_optimizer(case, self.optimized)
                load_checkpoint(self.model, opt, path, gathered, broadcast=False)
            return named, opt

        return {"forward": lambda ids: self.forward_model(ids), "resume": resume, "grad": self.grad, "view": self.view,
                "clip": None if clip is None else lambda: self.model.clip_grad_norm_(clip, clip_norm_type(case)),
                "no_sync": None if sync_every_microbatch else lambda: self.model.no_sync(),
                "scaler": sharded_grad_scaler}

    def gathered(self, with_grads):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if with_grads and self.flat:
            return flat_gradients(self.model)
        with FSDP.summon_full_params(self.model, writeback=False, with_grads=with_grads):
            named = [(clean(n), q) for n, q in self.model.named_parameters()]
            if with_grads:
                return {n: None if q.grad is None else q.grad.detach().clone() for n, q in named}
            return {n: q.detach().clone() for n, q in named}

    def grad(self, name, _param):
        if self.grads is None:
            self.grads = self.gathered(True)
        return self.found(self.grads, name)

    def found(self, tensors, name):
        """tensors[name]; where the model no longer lists `name` (FSDP1 unregistered it), LostParameters naming every
        parameter it lost, raised on every rank alike (the ranks' models are wrapped alike)."""
        if name not in tensors:
            raise LostParameters([n for n in self.names if n not in tensors])
        return tensors[name]

    def view(self, name, t):
        import torch

        if isinstance(t, torch.nn.Parameter):  # a final parameter (gradients come from `grad`, full already)
            if self.params is None:
                self.params = self.gathered(False)
            t = self.found(self.params, name)
        return to_case_layout(name, t.detach().to(torch.float64, copy=True)).numpy()


TARGET = TorchFsdp1()


def flat_gradients(model):
    """Every trainable flat parameter's gradient (this rank's shard, or the whole one under NO_SHARD) all-gathered
    over its unit's ranks and split into the original parameters' gradients by the flat parameter's own metadata
    (`_fqns`, `_shapes`, `_numels`), named as before wrapping. Every rank calls it for the same units in the same
    order."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    grads = {}
    for prefix, unit in model.named_modules():
        handle = unit._handle if isinstance(unit, FSDP) else None
        if handle is None or not handle.flat_param.requires_grad:
            continue
        flat = handle.flat_param
        g = flat.grad if flat.grad is not None else torch.zeros(flat._sharded_size, dtype=flat.dtype)
        if handle.uses_sharded_strategy:
            whole = torch.empty(flat._padded_unsharded_size, dtype=g.dtype)
            dist.all_gather_into_tensor(whole, g.contiguous(), group=handle.process_group)
            g = whole
        g = g[:flat._unpadded_unsharded_size.numel()]
        base = clean(prefix + ".") if prefix else ""
        for fqn, piece, shape in zip(flat._fqns, torch.split(g, list(flat._numels)), flat._shapes):
            grads[base + clean(fqn)] = piece.view(shape).detach().clone()
    return grads
