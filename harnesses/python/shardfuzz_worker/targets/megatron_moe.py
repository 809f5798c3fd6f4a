"""The case's `moe` blocks as megatron-core's MoELayer (megatron-tp): its TopKRouter, its token dispatcher and its
SequentialMLP experts (megatron's local spec, no grouped GEMM), over megatron's expert-parallel ranks.

  router       TopKRouter, softmax before the top-k (`moe_router_pre_softmax`: the gates are the chosen experts'
               router probabilities, as the case's); with the case's `renormalize`, megatron's default softmax
               over the chosen experts' logits after the top-k (which megatron refuses for top-1); the case's
               `aux_loss` as megatron's
               sequence-level load-balancing loss (`seq_aux_loss`: experts x sum_e f_e P_e per sequence, averaged
               over the micro-batch's sequences), scaled into the backward by megatron's schedules
  dispatcher   all-to-all over expert-parallel ranks (and over pipeline stages, whose variable message shapes
               megatron accepts with it only); the all-gather dispatcher otherwise (megatron's default)
  experts      SequentialMLP: expert e on expert-parallel rank e // (experts / ep), each an MLP of
               ColumnParallelLinear fc1 (swiglu: [gate; up] in one matrix, as megatron's gated linear unit splits
               it) and RowParallelLinear fc2, split over megatron's expert-tensor-parallel ranks (its default: the
               tensor-parallel degree; with biases 1, the only degree megatron takes them at)
  capacity     megatron's token dropping with the `position` policy (the case's: each expert keeps its earliest
               tokens), where megatron's capacity counts what the case's does: megatron's counts the tokens of
               one router call (a micro-batch's, a sequence-parallel shard's), the case's a sequence's, so a
               capacity that can drop tokens is expressed when tp is 1 and every micro-batch holds one sequence
               (and megatron's capacity rounds to the case's slots); one that drops none is megatron's dropless MoE;
               `pad_to_capacity` megatron's drop-and-pad dispatch (`moe_pad_expert_input_to_capacity`)
  shared       the case's `shared_ffn` as megatron's SharedExpertMLP (`moe_shared_expert_intermediate_size`, split
               over the tensor-parallel ranks like the dense MLP; megatron takes it without biases only: a model
               with biases is refused, as megatron asserts on the stages holding a MoE block only), its
               `shared_gate` as `moe_shared_expert_gate` (a replicated [1, hidden] weight applied to each rank's
               sequence-parallel shard, its gradient summed over the tensor-parallel ranks as megatron marks it)

Expert parameters and gradients are reported in the case's layout ([experts, in, out]) on every rank of the stage:
the local experts' slices all-gathered over the expert-tensor- and expert-parallel groups."""

import functools

import torch
import torch.nn.functional as F

from . import megatron_release
from .base import case_slots, chunk_range, drops_tokens, is_frozen, micro_batches, moe_of, parallel


def dispatcher(case):
    """megatron's token dispatcher for the case: all-to-all with expert-parallel ranks or pipeline stages."""
    p = parallel(case)
    return "alltoall" if p["ep"] > 1 or p["pp"] > 1 else "allgather"


def unsupported_moe(case):
    """Why megatron-tp's MoELayer cannot express the case's MoE blocks (None: it can, or there are none)."""
    moe = moe_of(case)
    if moe is None:
        return None
    m, p = case["model"], parallel(case)
    why = unexpressed_capacity(case)
    if why:
        return why
    if moe.get("aux_loss"):
        why = unequal_micro_batches(case)
        if why:
            return why
    if m.get("activation") == "swiglu":
        for i, kind in enumerate(m["layers"]):
            for pre in (f"layers.{i}.moe.", f"layers.{i}.moe.shared."):
                if kind == "moe" and is_frozen(case, pre + "up.weight") != is_frozen(case, pre + "gate.weight"):
                    return "megatron's gated expert MLP holds gate and up in one matrix: they freeze together"
    if p["ep"] > 1 and p["dp"] % p["ep"]:
        return "megatron's expert-parallel ranks come from the data-parallel ones: ep must divide dp"
    why = megatron_release.unsupported_options("TransformerConfig", moe_options(
        case, torch.float32, p["tp"], p["sequence_parallel"] and p["tp"] > 1, p["pp"]))
    if why:
        return why
    if moe.get("shared_ffn") and m.get("bias", True):
        # (megatron asserts it in SharedExpertMLP.__init__, on the pipeline stages that hold a MoE block only)
        return "megatron's shared experts take no biases, its other linear layers take them with the model's"
    return None


def padded(case):
    """Whether the case pads every expert's input to its capacity (`pad_to_capacity`: megatron's drop-and-pad
    dispatch, `moe_pad_expert_input_to_capacity`, which needs a capacity factor: megatron then applies it to its
    router calls even where the case's drops nothing)."""
    return bool(moe_of(case).get("pad_to_capacity"))


def unexpressed_capacity(case):
    """Why megatron's capacity would not count what the case's does (None: it would, or neither drops a token)."""
    if not drops_tokens(case) and not padded(case):
        return None  # (megatron's dropless MoE)
    from megatron.core.transformer.moe.moe_utils import get_capacity

    m, moe, p = case["model"], moe_of(case), parallel(case)
    rows = micro_batch_rows(case)
    if not drops_tokens(case):
        # Padding sets megatron's capacity factor: its router calls of n tokens must keep them all too.
        calls = sorted({r * m["seq"] // p["tp"] for r in rows})
        short = [n for n in calls if get_capacity(n * moe["top_k"], moe["experts"], moe["capacity_factor"]) < n]
        return (f"megatron's capacity over a router call of {short[0]} tokens drops tokens, the case's over a "
                f"sequence ({case_slots(case)} slots >= seq {m['seq']}) none") if short else None
    lead = (f"megatron's expert capacity counts the tokens of one router call, the case's a sequence's "
            f"({case_slots(case)} slots < seq {m['seq']}: tokens can drop): ")
    if p["tp"] > 1:
        return lead + "with tp > 1 megatron routes a sequence-parallel shard (seq / tp tokens)"
    if rows != {1}:
        return lead + f"micro-batches of {sorted(rows)} sequences are routed together"
    theirs = get_capacity(m["seq"] * moe["top_k"], moe["experts"], moe["capacity_factor"])
    if theirs != case_slots(case):
        return lead + f"megatron's rounding gives {theirs} slots, the case's {case_slots(case)}"
    return None


def micro_batch_rows(case):
    """The sizes (in sequences) of the micro-batches the data-parallel ranks route."""
    from .megatron_model import micro_batch_count

    m, p, rows = case["model"], parallel(case), set()
    for i in range(p["dp"]):
        lo, hi = chunk_range(m["batch"], p["dp"], i)
        rows.update(b - a for a, b in micro_batches(hi - lo, micro_batch_count(case)))
    return rows


def moe_features(case):
    """Coverage features of the case's MoE blocks: the dispatcher over the expert-parallel and tensor-parallel
    degrees, the top-k, the auxiliary loss, gated experts, pipeline stages, a capacity that drops tokens, padding to
    capacity."""
    moe = moe_of(case)
    if moe is None:
        return []
    p, m = parallel(case), case["model"]
    base = f"megatron:moe:tp{p['tp']}:ep{p['ep']}:{dispatcher(case)}"
    return [base, f"megatron:moe:top{moe['top_k']}-of-{moe['experts']}"] + (
        [f"{base}:aux-loss"] if moe.get("aux_loss") else []) + (
        [f"{base}:glu"] if m.get("activation") == "swiglu" else []) + (
        [f"{base}:pp{p['pp']}"] if p["pp"] > 1 else []) + (
        [f"{base}:capacity-drop"] if drops_tokens(case) else []) + (
        [f"{base}:pad-to-capacity"] if padded(case) else []) + (
        [f"{base}:shared-expert" + (":gate" if moe.get("shared_gate") else "")] if moe.get("shared_ffn") else [])


def patch_moe_host_copies():
    """megatron's all-to-all dispatcher copies its split sizes to the host as numpy arrays (`as_numpy`) before the
    all-to-all takes them as lists of ints; its helper copies CUDA tensors only, so on the CPU they stayed tensors
    (which the collective refuses): CPU tensors asked for as numpy become numpy, as CUDA ones do."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    original = moe_utils.maybe_move_tensor_to_cpu

    def to_host(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return original(tensor, as_numpy, record_stream)

    token_dispatcher.maybe_move_tensor_to_cpu = to_host


def unequal_micro_batches(case):
    """Why megatron's per-micro-batch auxiliary loss differs from the case's per-sequence mean (None: it does not):
    megatron averages it over each micro-batch's sequences, then over micro-batches and data-parallel replicas, which
    weighs every sequence alike only when every micro-batch holds as many rows."""
    sizes = micro_batch_rows(case)
    if len(sizes) > 1:
        return ("megatron averages the MoE auxiliary loss per micro-batch: micro-batches of unequal rows "
                f"({sorted(sizes)}) weigh their sequences unequally")
    return None


def moe_config(case, dt, tp, sp, pp=1, vs=1, per_token=False):
    """The TransformerConfig of the case's MoE blocks (also the one megatron's schedules read: `num_moe_experts`
    makes them scale the auxiliary loss's gradient by the loss scale over the micro-batches)."""
    return megatron_release.new_config("TransformerConfig", **moe_options(case, dt, tp, sp, pp, vs, per_token))


def moe_options(case, dt, tp, sp, pp=1, vs=1, per_token=False):
    """moe_config's TransformerConfig arguments."""
    m, moe = case["model"], moe_of(case)
    swiglu, aux = m.get("activation", "gelu") == "swiglu", moe.get("aux_loss") or 0.0
    return dict(
        num_layers=pp * vs, hidden_size=m["hidden"], ffn_hidden_size=m["ffn"], moe_ffn_hidden_size=m["ffn"],
        num_attention_heads=tp, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vs if vs > 1 else None, pipeline_dtype=dt,
        variable_seq_lengths=pp > 1, expert_model_parallel_size=parallel(case)["ep"],
        expert_tensor_parallel_size=expert_tensor_parallel(case, tp), sequence_parallel=sp,
        num_moe_experts=moe["experts"], moe_router_topk=moe["top_k"],
        moe_router_pre_softmax=not moe.get("renormalize"),
        moe_router_load_balancing_type="seq_aux_loss" if aux else "none", moe_aux_loss_coeff=aux,
        moe_token_dispatcher_type=dispatcher(case), moe_grouped_gemm=False,
        moe_expert_capacity_factor=moe["capacity_factor"] if drops_tokens(case) or padded(case) else None,
        moe_token_drop_policy="position", moe_pad_expert_input_to_capacity=padded(case), add_bias_linear=m.get("bias", True),
        moe_shared_expert_intermediate_size=moe.get("shared_ffn"), moe_shared_expert_gate=bool(moe.get("shared_gate")),
        gated_linear_unit=swiglu, activation_func=F.silu if swiglu else functools.partial(F.gelu, approximate="tanh"),
        bias_activation_fusion=False, use_cpu_initialization=True, perform_initialization=False, params_dtype=dt,
        bf16=dt == torch.bfloat16, fp16=dt == torch.float16, calculate_per_token_loss=per_token)


def expert_layout(case):
    """(ep, etp) of megatron's parallel state for the case: its expert-parallel and expert-tensor-parallel degrees
    with MoE blocks; (1, None) without, whatever `parallel.ep` says, so that a case without experts builds no
    layout of its own (each layout a rank pool keeps holds its groups' gloo threads)."""
    if moe_of(case) is None:
        return 1, None
    p = parallel(case)
    return p["ep"], expert_tensor_parallel(case, p["tp"])


def expert_tensor_parallel(case, tp):
    """megatron's expert-tensor-parallel degree: its default, the tensor-parallel one; 1 with biases (megatron
    asserts "Bias in Moe is only supported when ETP==1")."""
    return 1 if case["model"].get("bias", True) else tp


class Moe(torch.nn.Module):
    """megatron's MoELayer on [s(/tp), b, h] activations (its output's bias, None, dropped)."""

    def __init__(self, config, layer_number):
        super().__init__()
        self.layer = megatron_release.new_moe_layer(config, layer_number)

    def forward(self, x):
        return self.layer(x)[0]


def is_moe_param(name):
    """Whether `name` is a parameter of megatron's MoELayer in a Block (`layers.{i}.moe.layer.…`)."""
    return ".moe.layer." in name


def _expert_index(name):
    """The local expert index of an expert parameter's name (-1: the router)."""
    parts = name.split(".local_experts.", 1)
    return int(parts[1].split(".", 1)[0]) if len(parts) == 2 else -1


def frozen_moe_param(case, name):
    """Whether megatron's parameter `name` of a MoE block is frozen: by the case (fc1: up, and gate under swiglu),
    or the router's bias, which megatron adds with the linear layers' biases and the case's router has not (held at
    zero)."""
    return name.endswith("router.bias") or any(is_frozen(case, n) for n, _ in case_pieces(name, swiglu=False))


def case_pieces(name, swiglu):
    """The case parameters megatron's MoE parameter `name` holds pieces of: [(case name, role)]."""
    pre, rest = name.split(".moe.layer.", 1)
    pre += ".moe."
    if rest == "router.weight":
        return [(pre + "router.weight", "router")]
    if rest == "router.bias":
        return []
    if rest == "shared_experts.gate_weight":
        return [(pre + "shared_gate.weight", "shared_gate")]
    if rest.startswith("shared_experts."):
        pre += "shared."
    leaf = rest.rsplit(".", 1)[-1]
    if ".linear_fc1." in rest:
        return [(pre + f"gate.{leaf}", "gate"), (pre + f"up.{leaf}", "up")] if swiglu else [(pre + f"up.{leaf}", "up")]
    return [(pre + f"down.{leaf}", "down")]


def _expert_groups():
    """(expert-parallel rank, size, group), (expert-tensor-parallel rank, size, group)."""
    from megatron.core import parallel_state as ps

    return ((ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size(),
             ps.get_expert_model_parallel_group()),
            (ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size(),
             ps.get_expert_tensor_parallel_group()))


def load_moe(block_name, moe, inputs, dt, swiglu):
    """Copy the case's router and this rank's experts' slices into megatron's MoELayer `moe` (block `block_name`)."""
    (ep_rank, _, _), (etp_rank, etp, _) = _expert_groups()
    pre = block_name + ".moe."
    experts = moe.layer.experts.local_experts
    with torch.no_grad():
        _copy(moe.layer.router.weight, torch.tensor(inputs[pre + "router.weight"]).t(), dt)
        if getattr(moe.layer.router, "bias", None) is not None:  # (0.13.1's router has no bias)
            moe.layer.router.bias.zero_()
        for j, expert in enumerate(experts):
            e = ep_rank * len(experts) + j

            def case(kind, leaf, e=e):
                return torch.tensor(inputs[pre + f"{kind}.{leaf}"][e])

            lo, hi = chunk_range(case("up", "weight").shape[-1], etp, etp_rank)
            fc1 = ("gate", "up") if swiglu else ("up",)
            _copy(expert.linear_fc1.weight, torch.cat([case(k, "weight")[:, lo:hi].t() for k in fc1]), dt)
            _copy(expert.linear_fc2.weight, case("down", "weight")[lo:hi].t(), dt)
            if expert.linear_fc1.bias is not None:
                _copy(expert.linear_fc1.bias, torch.cat([case(k, "bias")[lo:hi] for k in fc1]), dt)
                _copy(expert.linear_fc2.bias, case("down", "bias"), dt)
        if moe.layer.shared_experts is not None:
            _load_shared(moe.layer.shared_experts, pre, inputs, dt, swiglu)


def _load_shared(shared, pre, inputs, dt, swiglu):
    """The case's shared expert (`{pre}shared.…`, `{pre}shared_gate.weight`) into megatron's SharedExpertMLP: this
    tensor-parallel rank's ffn slice."""
    from megatron.core import parallel_state as ps

    def case(kind):
        return torch.tensor(inputs[pre + f"shared.{kind}.weight"])

    lo, hi = chunk_range(case("up").shape[-1], ps.get_tensor_model_parallel_world_size(),
                         ps.get_tensor_model_parallel_rank())
    fc1 = ("gate", "up") if swiglu else ("up",)
    _copy(shared.linear_fc1.weight, torch.cat([case(k)[:, lo:hi].t() for k in fc1]), dt)
    _copy(shared.linear_fc2.weight, case("down")[lo:hi].t(), dt)
    if shared.gate_weight is not None:
        _copy(shared.gate_weight, torch.tensor(inputs[pre + "shared_gate.weight"]).t(), dt)


def _copy(param, src, dt):
    if tuple(src.shape) != tuple(param.shape):
        raise RuntimeError(f"harness: MoE slice {tuple(src.shape)} vs megatron {tuple(param.shape)}")
    param.copy_(src.to(dt))


def to_case_layout(tensors, swiglu):
    """`tensors` (megatron MoE names -> this rank's float64 arrays, other names untouched) with its MoE entries
    replaced by the case's full tensors: the router transposed; the local experts' pieces (fc1 split into gate and
    up, transposed) gathered over the expert-tensor-parallel ranks (the ffn dimension) and the expert-parallel ranks
    (the experts). Every rank of a pipeline stage calls it for the same names (collectives)."""
    import numpy as np

    out = {n: t for n, t in tensors.items() if not is_moe_param(n)}
    pieces = {}
    names = sorted((n for n in tensors if is_moe_param(n)), key=lambda n: (n.split(".local_experts.")[0], _expert_index(n), n))
    for name in names:  # (local experts in index order: expert 10 after expert 9)
        t = torch.from_numpy(np.ascontiguousarray(tensors[name]))
        for (case_name, role), piece in zip(case_pieces(name, swiglu), _split_fc1(name, t, swiglu)):
            if ".shared_experts." in name:
                out[case_name] = _gather_shared(role, piece)
            elif role == "router":
                out[case_name] = piece.t().contiguous().numpy()
            else:
                pieces.setdefault(case_name, []).append(piece)
    for case_name, local in pieces.items():
        out[case_name] = _gather_experts(case_name, torch.stack(local))
    return out


def _split_fc1(name, t, swiglu):
    """megatron's local tensor `t` of parameter `name` as the case-layout pieces case_pieces names."""
    if name.endswith("router.weight"):
        return [t]
    if name.endswith("shared_experts.gate_weight"):
        return [t.t()]
    if ".linear_fc1." in name:
        parts = t.chunk(2) if swiglu else [t]
        return [p.t() if p.dim() == 2 else p for p in parts]
    return [t.t() if t.dim() == 2 else t]


def _gather_shared(role, local):
    """A shared-expert piece in the case's layout, its ffn slices gathered over the tensor-parallel ranks (the gate's
    weight is whole on each)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    if role == "shared_gate" or tp == 1:
        return local.contiguous().numpy()
    parts = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=0 if role == "down" else 1).numpy()


def _gather_experts(case_name, local):
    """[local experts, ...] pieces -> [experts, ...]: concatenated over the expert-tensor-parallel ranks along the
    ffn dimension (a down bias is whole on each), then over the expert-parallel ranks along the experts."""
    import torch.distributed as dist

    (_, ep, ep_group), (_, etp, etp_group) = _expert_groups()
    leaf, kind = case_name.rsplit(".", 1)[-1], case_name.rsplit(".", 2)[-2]
    ffn_dim = None if (kind, leaf) == ("down", "bias") else (1 if kind == "down" or leaf == "bias" else 2)
    if etp > 1 and ffn_dim is not None:
        parts = [torch.empty_like(local) for _ in range(etp)]
        dist.all_gather(parts, local.contiguous(), group=etp_group)
        local = torch.cat(parts, dim=ffn_dim)
    if ep > 1:
        parts = [torch.empty_like(local) for _ in range(ep)]
        dist.all_gather(parts, local.contiguous(), group=ep_group)
        local = torch.cat(parts, dim=0)
    return local.numpy()
