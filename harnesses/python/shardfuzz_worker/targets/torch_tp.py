"""torch-tp: the case's model with `parallelize_module` — ColwiseParallel / RowwiseParallel projections,
a vocab-parallel embedding and LM head with `loss_parallel` (or, where the case's `vocab_loss` is `gathered`,
the LM head's output replicated and a plain loss), and under sequence parallelism
`SequenceParallel` norms with the residual stream sharded along the sequence (the torchtitan plan). `resume_after`
checkpoints the DTensor parameters and optimizer state through torch.distributed.checkpoint (`torch_dcp`).

Replicated parameters (norms) are reported per rank, from each rank's local gradient and value, so
that a gradient that was never reduced across the tensor-parallel ranks shows up as disagreeing
replicas rather than being summed away by a gather.
"""

from .base import label_smoothing, parallel, resume_feature, vocab_sharded_loss
from .torch_common import TorchTarget, check_compiled, compile_blocks, compiling, mesh, unsupported_compiled_blocks
from .torch_dcp import resumed
from .torch_model import build, model_defaults, to_case_layout, unsupported_layout
from .torch_training import combine_dp, single_device, train


class TorchTp(TorchTarget):
    name = "torch-tp"
    smooths_labels = True
    clip_norms = ("l1", "l2", "inf")
    checkpoint_layouts = ("sharded", "gathered")  # (torch_dcp: DCP shards, or full state dicts through rank 0)
    optimizer_implementations = True
    freezes = True
    rotates = True

    def unsupported(self, case):
        why = unsupported_layout(case, ("tp",), "torch-tp runs tensor (and sequence) parallelism on a 1-D mesh",
                                 loss_scaling=True)
        if why:
            return why
        return unsupported_compiled_blocks(case, self.name) or unsupported_tensor_parallel(case)

    def run_rank(self, rank, world, case, inputs):
        compiling(case)
        tm = mesh((world,), ("tp",))
        now = {"model": None}  # what the forward reaches, replaced when the run resumes

        def tensor_parallel():
            model, _ = build(case, inputs)  # frozen parameters set requires_grad=False first, as a user does
            names = [n for n, _ in model.named_parameters()]
            parallelize(model, tm, case)
            params = dict(model.named_parameters())
            compile_blocks(case, model)
            now["model"] = model
            return [(n, params[n]) for n in names]

        named = tensor_parallel()
        out = train(case, inputs, now["model"], [p for _, p in named], 0, 1, named=named, loss_ctx=loss_context(case),
                    view=replicas_per_rank, forward=lambda ids: now["model"](ids),
                    resume=lambda opt: resumed(case, now, tensor_parallel, opt))
        check_compiled(case)
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        p = parallel(case)
        loss = "sharded" if vocab_sharded_loss(case, True) else "gathered"
        compile_feature = ["tp:compiled-blocks"] if case["train"].get("compiled") else []
        return combine_dp(case, outs, [f"tp:tp{p['tp']}:sp{int(p['sequence_parallel'])}", f"tp:loss:{loss}",
                                       *compile_feature, *resume_feature(f"tp:tp{p['tp']}", case)])


def unsupported_tensor_parallel(case):
    """Why torch's tensor parallel plan (`parallelize`) cannot express the case's model, or None."""
    p = parallel(case)
    m = model_defaults(case)
    if m["heads"] % p["tp"] or m["kv_heads"] % p["tp"]:
        return "torch TP shards whole attention heads: heads and kv_heads must be multiples of tp"
    if m.get("tied_embeddings"):
        return "tied embeddings are not expressed under torch TP"
    if label_smoothing(case) and vocab_sharded_loss(case, True):  # (loss_parallel runs on a one-rank mesh too)
        # (torch 2.15 fails inside the dispatcher: "aten.masked_fill_.Scalar got mixed torch.Tensor and DTensor")
        return "torch's loss_parallel does not support label_smoothing (its documentation says so)"
    return None


def parallelize(model, tp, case):
    """`parallelize_module` over the 1-D mesh `tp` with the torchtitan plan: column-parallel q/k/v and up/gate, row-parallel
    o and down, a row-parallel (vocab-parallel) embedding, a column-parallel LM head (its output kept sharded for
    `loss_parallel` unless the case's `vocab_loss` is `gathered`); under sequence parallelism SequenceParallel norms
    with the residual stream sharded along the sequence, else norms with Replicate parameters fed local tensors."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    m = model_defaults(case)
    sp = parallel(case)["sequence_parallel"]
    seq = Shard(1) if sp else Replicate()
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
        if vocab_sharded_loss(case, True) else ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    }
    if sp:
        plan["final_norm"] = SequenceParallel()
    for i, kind in enumerate(m["layers"]):
        pre = f"layers.{i}"
        if sp:
            plan[f"{pre}.norm"] = SequenceParallel()
        inner, cols, row = ("attn", ("q", "k", "v"), "o") if kind == "attention" else (
            "mlp", ("up", "gate") if m["activation"] == "swiglu" else ("up",), "down")
        if sp:
            plan[f"{pre}.{inner}"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        for c in cols:
            plan[f"{pre}.{inner}.{c}"] = ColwiseParallel()
        plan[f"{pre}.{inner}.{row}"] = RowwiseParallel(output_layouts=seq)
    parallelize_module(model, tp, plan)
    if not sp:
        replicated_norms(model, tp)


def replicated_norms(model, mesh):
    """Without sequence parallelism the model's norms stay replicated: plain modules with Replicate DTensor parameters
    over `mesh`, fed local tensors and returning local ones."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    def to_dt(mod, args, dm):
        return tuple(DTensor.from_local(a, dm, [Replicate()], run_check=False) for a in args)

    def to_local(mod, out, dm):
        return out.to_local()

    for name, mod in model.named_modules():
        if name.endswith("norm"):
            distribute_module(mod, mesh, input_fn=to_dt, output_fn=to_local)


def loss_context(case):
    """torch's `loss_parallel` where the case's loss runs on the vocab-sharded logits, else None."""
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel if vocab_sharded_loss(case, True) else None


def replicas_per_rank(name, t):
    """What a rank reports of a parameter or gradient: its own local copy where the tensor is replicated on every mesh
    dimension but the ones named `dp` (gathered over those), else the full tensor. So a gradient never reduced across
    the tensor-parallel ranks shows as disagreeing replicas rather than being summed away by a gather."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    local = t
    if isinstance(t, DTensor):
        names = t.device_mesh.mesh_dim_names or ()
        data = [i for i, n in enumerate(names) if n in ("dp", "replicate", "shard")]
        if all(isinstance(pl, Replicate) for i, pl in enumerate(t.placements) if i not in data):
            if data:
                t = t.redistribute(t.device_mesh, [Replicate() if i in data else pl for i, pl in enumerate(t.placements)])
            local = t.to_local()
        else:
            local = t.full_tensor()
    return to_case_layout(name, local.detach().to(torch.float64, copy=True)).numpy()


TARGET = TorchTp()
