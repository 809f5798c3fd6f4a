"""torch-fsdp2: the case's model with `fully_shard` on every block and on the root, over the
data-parallel ranks (ZeRO-3 resharding after forward when the case asks for stage 3); with `zero_shard_group` g,
HSDP on a (dp / g, g) mesh (sharded within each group of g consecutive ranks, replicated across the groups); with
`zero_offload`, `CPUOffloadPolicy` (sharded parameters, gradients and the optimizer step on the host); with a
`master_dtype` wider than the compute dtype, mixed precision: the model held in it, `MixedPrecisionPolicy(param_dtype=`
the compute dtype`)` (parameters all-gathered in the compute dtype, gradients reduced in `reduce_dtype`); with
`reshard_group` g under ZeRO-3, `reshard_after_forward=g` (`False` for 1, `True` for the whole shard group); every
accumulated micro-batch reduced unless the case's `sync_every_microbatch` is false
(`set_requires_gradient_sync(False)` on all but the last); with `param_shard_dim` d, `shard_placement_fn` sharding each
parameter along d where it divides evenly over its shard group (the others along 0); with `sum_collectives`,
`set_force_sum_reduction_for_comms` (plain SUM collectives, the average divided apart); with `explicit_grad_divide`,
`set_gradient_divide_factor` given the number of ranks a gradient is reduced over (FSDP2's own divisor, handed over as
torchtitan does for its expert-parallel modules); with `resume_after`, the model's
and optimizer's sharded state dicts saved with torch.distributed.checkpoint and loaded into a fresh sharded model and
optimizer (with `train.resume_parallel`, one in another FSDP layout of the same ranks: ZeRO stage, shard group, reshard
group, shard dimension, offload, or other data- and tensor-parallel degrees over the same ranks; DCP reshards the
checkpoint on load); with context parallelism (`parallel.cp`), torch's own (`torch_context_parallel`: ring attention
under `context_parallel`), FSDP2 sharding over the dp x cp ranks together as torchtitan does."""

import contextlib

from .base import (dtype_name, master_dtype_name, parallel, reduce_dtype_name, reshard_feature, resumed_case,
                   resume_feature, sync_every_microbatch, sync_feature, vocab_sharded_loss, zero_offloaded)
from . import torch_context_parallel as torch_cp
from .torch_common import (TorchTarget, check_compiled, compile_blocks, compiling, mesh, torch_dtype, uncompiled_name,
                           unsupported_compiled_blocks)
from .torch_dcp import resumed
from .torch_model import build, model_defaults, unsupported_layout
from .torch_tp import loss_context, parallelize, replicas_per_rank, unsupported_tensor_parallel
from .torch_training import DataPart, combine_dp, single_device, train


class TorchFsdp2(TorchTarget):
    name = "torch-fsdp2"
    freezes = True
    rotates = True
    smooths_labels = True
    clip_norms = ("l1", "l2", "inf")
    checkpoint_layouts = ("sharded", "gathered")  # (torch_dcp: DCP shards, or full state dicts through rank 0)
    # (torch.distributed.checkpoint reshards on load: a run resumes into another FSDP layout of the same ranks, and
    # into other data- and tensor-parallel degrees over them)
    resumes_into = ("zero_stage", "zero_shard_group", "reshard_group", "param_shard_dim", "zero_offload", "dp", "tp", "cp",
                    "sequence_parallel", "cp_all_to_all")
    optimizer_implementations = True

    def __init__(self):
        super().__init__()
        import torch

        if not hasattr(torch.distributed.fsdp, "fully_shard"):
            # Measured with torch 2.5.1: fully_shard's first forward raises "FSDP requires CUDA for streams"; torch
            # 2.15's torch.distributed.fsdp.fully_shard runs on the CPU.
            raise RuntimeError(f"torch {torch.__version__}'s FSDP2 (torch.distributed._composable.fsdp) needs CUDA "
                               "for its streams; the CPU runs only torch.distributed.fsdp.fully_shard's")
        import inspect

        self.shard_placement_fn = "shard_placement_fn" in inspect.signature(torch.distributed.fsdp.fully_shard).parameters

    def unsupported(self, case):
        why = unsupported_layout(case, ("dp", "tp", "cp"),
                                 "torch-fsdp2 shards over data-parallel ranks, beside tensor or context parallelism",
                                 offload=True, loss_scaling=True, master_weights=True, moe="torch")
        why = why or torch_cp.unsupported_context_parallel(case) or unsupported_compiled_blocks(case, self.name)
        p = parallel(case)
        if why is None and p["tp"] > 1:
            why = unsupported_tensor_parallel(case) or (
                "torch TP has no MoE plan here" if "moe" in model_defaults(case)["layers"] else None)
        if why is None and p["zero_stage"] == 3 and p["reshard_group"] is not None:
            shard = p["zero_shard_group"] or p["dp"] * p["cp"]
            if shard % p["reshard_group"]:
                return (f"FSDP2 reshards after forward within the {shard} ranks a parameter is sharded over: "
                        f"{p['reshard_group']} does not divide them")
        if why is None and p["param_shard_dim"] and not self.shard_placement_fn:
            return "this torch's fully_shard has no shard_placement_fn: parameters shard on dimension 0 only"
        return why or unsupported_reduction(case)

    def run_rank(self, rank, world, case, inputs):
        import torch

        compiling(case)
        later = resumed_case(case)

        def degrees(layout):
            """(dp, tp, cp) of the case's layout or of the one it resumes into."""
            q = parallel(layout)
            return world // (q["tp"] * q["cp"]), q["tp"], q["cp"]

        dp, tp, cp = degrees(case)
        now = {"model": None, "layout": case}  # what the hooks below reach, replaced when the run resumes

        def trained(layout):
            # (`layout`: the case, or the case as resumed into its train.resume_parallel: its degrees, shard group and
            # meshes)
            ldp, ltp, lcp = degrees(layout)
            g = parallel(layout)["zero_shard_group"] or ldp * lcp
            dm, tm = data_and_tensor_meshes(ldp * lcp, g, ltp)  # (cp > 1 has tp 1: FSDP2 over all dp x cp ranks)
            now["model"], names = sharded_model(layout, inputs, dm, g, tm, ring_attention=lcp > 1)
            now["layout"] = layout
            params = {uncompiled_name(n): q for n, q in now["model"].named_parameters()}
            return [(n, params[n]) for n in names]

        def part(layout):
            # (The loss is summed over a rank's data-parallel peers: those holding the same tensor-parallel part.)
            ldp, ltp, lcp = degrees(layout)
            group = None if ltp == 1 else mesh((ldp, ltp), ("dp", "tp")).get_group("dp")
            seq = None if lcp == 1 else torch_cp.TorchSequenceSplit(mesh((ldp, lcp), ("dp", "cp"))["cp"],
                                                                   torch_cp.rotate_method(layout))
            return DataPart(rank // (ltp * lcp), ldp, group, seq)

        def resume(opt):
            # The model's and optimizer's sharded state dicts saved, a fresh sharded model (in the resumed layout, DCP
            # resharding into its degrees too) and optimizer loaded.
            named, opt = resumed(case, now, lambda: trained(later), opt)
            return (named, opt) if degrees(later) == (dp, tp, cp) else (named, opt, part(later))

        def loss_ctx():
            ctx = loss_context(now["layout"]) if parallel(now["layout"])["tp"] > 1 else None
            return ctx() if ctx is not None else contextlib.nullcontext()

        named = trained(case)
        torch.manual_seed(0)
        first = part(case)
        two_d = {} if max(tp, degrees(later)[1]) == 1 else {"loss_ctx": loss_ctx, "view": replicas_per_rank}
        out = train(case, inputs, now["model"], [p for _, p in named], first.dp_index, dp, named=named,
                    forward=lambda ids: now["model"](ids), resume=resume, seq=first.seq, group=first.group,
                    no_sync=None if sync_every_microbatch(case, True) else lambda: without_gradient_sync(now["model"]),
                    **two_d)
        check_compiled(case)
        out["baseline"] = single_device(case, inputs, torch_cp.baseline_attention(case)) if rank == 0 else None
        return out

    def combine(self, case, outs):
        p = parallel(case)
        dp = len(outs) // (p["tp"] * p["cp"])
        stage = f"fsdp2:dp{dp}:zero{p['zero_stage']}"
        g = p["zero_shard_group"]
        layout = [] if g is None else [f"{stage}:hsdp-" + ("replicated" if g == 1 else "plain" if g == dp
                                                            else "hybrid")]
        if p["tp"] > 1:
            layout.append(f"{stage}:tp{p['tp']}:sp{int(p['sequence_parallel'])}:loss-"
                          + ("sharded" if vocab_sharded_loss(case, True) else "gathered"))
        if master_dtype_name(case) != dtype_name(case):
            layout.append(f"{stage}:{dtype_name(case)}-computed-from-{master_dtype_name(case)}")
        if reduce_dtype_name(case) != dtype_name(case):
            layout.append(f"{stage}:{dtype_name(case)}-reduced-in-{reduce_dtype_name(case)}")
        if p["zero_stage"] == 3 and p["reshard_group"] is not None:
            layout.append(f"{stage}:{reshard_feature(p['reshard_group'], g or dp * p['cp'])}")
        layout += sync_feature(stage, case, True) + resume_feature(stage, case) + torch_cp.features(stage, case)
        if case["train"].get("compiled"):
            layout.append(f"{stage}:compiled-blocks")
        if p["param_shard_dim"] is not None:
            layout.append(f"{stage}:{shard_dim_feature(case, p['param_shard_dim'], g or dp * p['cp'])}")
        if p["sum_collectives"] is not None or p["explicit_grad_divide"] is not None:
            layout.append(f"{stage}:" + ("sum-collectives" if p["sum_collectives"] else "averaging-collectives")
                          + (":explicit-divide" if p["explicit_grad_divide"] else "")
                          + (f":reduced-in-{reduce_dtype_name(case)}" if g is not None else ""))
        return combine_dp(case, outs, [stage, *layout, *([f"{stage}:offload"] if zero_offloaded(case) else [])])


def data_and_tensor_meshes(dp, g, tp):
    """(the mesh FSDP2 shards over, the tensor-parallel mesh or None): over all ranks a (dp) mesh, or with a shard group
    g < dp HSDP's (dp / g, g); with tp > 1 both as sub-meshes of one mesh whose last dimension is `tp` (torchtitan's
    2-D layout: a rank's tensor-parallel peers are consecutive ranks)."""
    data = ("dp",) if g == dp else ("replicate", "shard")
    shape = (dp,) if g == dp else (dp // g, g)
    if tp == 1:
        return mesh(shape, data), None
    whole = mesh((*shape, tp), (*data, "tp"))
    return whole[data], whole["tp"]


def sharded_model(case, inputs, dm, g, tm=None, ring_attention=False):
    """The case's model held in its master dtype with `fully_shard` on every block and on the root over the mesh `dm`
    (sharded over `g` ranks), as the case asks, after torch's tensor parallel plan over `tm` where there is one, its
    attention through torch's context-parallel ring attention with `ring_attention`; returns (model, the parameter
    names before sharding)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    p = parallel(case)
    mixed = master_dtype_name(case) != dtype_name(case)
    model, _ = build(case, inputs, dtype=master_dtype_name(case))
    names = [n for n, _ in model.named_parameters()]
    if tm is not None:
        parallelize(model, tm, case)
    if ring_attention:
        torch_cp.install(model)
    compile_blocks(case, model)  # (torchtitan's order: tensor parallel, compile each block, then fully_shard)
    param_dtype = torch_dtype(dtype_name(case)) if mixed else None
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch_dtype(reduce_dtype_name(case))),
          "reshard_after_forward": reshard_after_forward(p, g)}
    if p["param_shard_dim"]:
        kw["shard_placement_fn"] = shard_placement(p["param_shard_dim"], g)
    if zero_offloaded(case):
        from torch.distributed.fsdp import CPUOffloadPolicy

        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    for layer in model.layers:
        fully_shard(layer, mesh=dm, **kw)
    fully_shard(model, mesh=dm, **kw)
    set_gradient_reduction([*model.layers, model], p["sum_collectives"],
                           dm.size() if p["explicit_grad_divide"] else None)
    return model, names


def unsupported_reduction(case):
    """Why FSDP2 cannot reduce the case's gradients as it asks on this torch and gloo, or None. With an explicit divide
    factor other than the shard group's size, and bf16 or f32 reduced without forced sums, FSDP2 reduce-scatters with
    PREMUL_SUM, which gloo does not implement ("Cannot use ReduceOp.PREMUL_SUM with Gloo", measured on torch 2.15)."""
    import torch

    p, layouts = parallel(case), [case, resumed_case(case)]
    if any(parallel(c)["sum_collectives"] or parallel(c)["explicit_grad_divide"] for c in layouts) and not hasattr(
            torch.distributed.fsdp.FSDPModule, "set_force_sum_reduction_for_comms"):
        return "this torch's FSDP2 has no set_force_sum_reduction_for_comms / set_gradient_divide_factor"
    for c in layouts:
        q = parallel(c)
        ranks = p["dp"] * p["tp"] * p["cp"] // q["tp"]  # (the ranks FSDP2 reduces over: dp x cp of the layout)
        shard = q["zero_shard_group"] or ranks
        if (q["explicit_grad_divide"] and not q["sum_collectives"] and 1 < shard < ranks
                and reduce_dtype_name(c) in ("f32", "bf16")):
            return (f"FSDP2 with an explicit gradient divide factor ({ranks}) other than its shard group's size "
                    f"({shard}) reduce-scatters {reduce_dtype_name(c)} with PREMUL_SUM, which gloo does not implement "
                    "(sum_collectives would divide apart)")
    return None


def set_gradient_reduction(modules, sum_collectives, divide_factor):
    """FSDP2's gradient reduction as the case asks, on every fully_shard module: plain SUM collectives with the
    average divided apart (`set_force_sum_reduction_for_comms`) where `sum_collectives` is set, the average's divisor
    handed over explicitly (`set_gradient_divide_factor`) where `divide_factor` is not None."""
    for module in modules:
        if sum_collectives is not None:
            module.set_force_sum_reduction_for_comms(sum_collectives)
        if divide_factor is not None:
            module.set_gradient_divide_factor(float(divide_factor))


def shard_placement(dim, shard_ranks):
    """FSDP2's `shard_placement_fn` for the case's `param_shard_dim`: Shard(dim) for a parameter with that dimension
    dividing evenly over the `shard_ranks` it is sharded over (FSDP2 refuses uneven nonzero-dim shards), else None
    (FSDP2's own Shard(0)). A tensor-parallel parameter is sharded by FSDP2 as its local part: that part's size counts."""
    from torch.distributed.tensor import DTensor, Shard

    def placement(param):
        local = param.to_local() if isinstance(param, DTensor) else param
        return Shard(dim) if local.dim() > dim and local.size(dim) % shard_ranks == 0 else None

    return placement


def shard_dim_feature(case, dim, shard_ranks):
    """`shard-dim-0`, or for a nonzero dim whether none, some or all of the case's matrices take it (their second
    dimensions are the hidden size, or the ffn size for the MLP's down projection)."""
    if dim == 0:
        return "shard-dim-0"
    m = case["model"]
    sizes = [m["hidden"], m["ffn"]]
    even = [s % shard_ranks == 0 for s in sizes] if dim == 1 else [False]
    return f"shard-dim-{dim}-" + ("all" if all(even) else "some" if any(even) else "none")


@contextlib.contextmanager
def without_gradient_sync(model):
    """FSDP2's accumulation without communication: `set_requires_gradient_sync(False)` on the root (and with it every
    fully_shard module) for a micro-batch, so its gradients stay unsharded and local until a synced one."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def reshard_after_forward(p, shard):
    """FSDP2's `reshard_after_forward` for the case: ZeRO-3 reshards (over its `reshard_group`, where the case sets
    one: whole copies kept for 1, every rank for the `shard` ranks a parameter is sharded over, else that int)."""
    g = p["reshard_group"]
    if p["zero_stage"] != 3:
        return False
    if g is None or g == shard:
        return True
    return False if g == 1 else g


TARGET = TorchFsdp2()
