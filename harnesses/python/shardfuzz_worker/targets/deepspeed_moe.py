"""The case's `moe` blocks as DeepSpeed's MoE layer (deepspeed-zero): `deepspeed.moe.layer.MoE`, its TopKGate and its
experts over DeepSpeed's expert-parallel groups (the case's ep; DeepSpeed builds them from the data-parallel ranks).

  gate       softmax in fp32; top-1 gating (`top1gating`) takes the chosen expert's probability as the gate (the
             case's without `renormalize`); top-2 (`top2gating`, without its sampled second expert) and top-k
             (`topkgating`) divide the chosen gates by their sum (the case's with `renormalize`), over the choices
             kept after dropping, where the case divides before: so these express no capacity that drops tokens
  capacity   DeepSpeed counts the tokens of one forward (a rank's micro-batch), the case a sequence's: a top-1
             capacity that can drop tokens is expressed where every micro-batch holds one sequence and DeepSpeed's
             rounding ceil(tokens / experts x capacity_factor) (in float32) gives the case's slots, with
             `drop_tokens` and without random token selection (`use_rts`: the case keeps each expert's earliest
             tokens); one that drops none as DeepSpeed's dropless MoE (`drop_tokens=False`), or with
             `pad_to_capacity` its capacity buffers (capacity_factor x top_k in DeepSpeed's rounding)
  aux loss   the `l_aux` the layer returns (experts x sum_e f_e P_e over the forward's tokens, f_e over every choice:
             the case's per-sequence loss where a micro-batch is one sequence), added to the loss times the case's
             coefficient, as users add it; top-2's counts first choices only (not expressed)
  experts    the dense MLP module per expert (DeepSpeed deep-copies the module it is given), expert e on expert-parallel rank
             e // (experts / ep); their gradients reduced over DeepSpeed's expert-data-parallel groups, their
             parameters in the optimizer's MoE groups (`split_params_into_different_moe_groups_for_optimizer`)

ZeRO-3 with these layers, and ZeRO 1-2 without reduce scatter (or, at stage 2, contiguous gradients), DeepSpeed itself
refuses (`rejected`). Frozen parameters of a MoE block are not expressed (DeepSpeed holds one module per expert).

Expert parameters and gradients are reported in the case's layout ([experts, in, out]): each rank's local experts
stacked and all-gathered over its expert-parallel group."""

import torch
import torch.nn as nn

from .base import HarnessError, case_slots, chunk_range, drops_tokens, moe_of, parallel
from .torch_model import Mlp

#: The name DeepSpeed's MoE layer sits under in a block: `layers.{i}.moe.layer.deepspeed_moe.…`.
PREFIX = ".moe.layer."


def deepspeed_capacity(tokens, experts, capacity_factor, k=1):
    """DeepSpeed's top-k capacity for a forward of `tokens` tokens (`sharded_moe._capacity` of capacity_factor x k,
    min_capacity 0)."""
    factor = capacity_factor if k == 1 else capacity_factor * k
    return int(torch.ceil((tokens / experts) * torch.tensor(factor)).to(torch.int64))


def micro_batch_rows(case):
    """The sizes (in sequences) of the micro-batches the data-parallel ranks run (torch_training.train's split)."""
    import numpy as np

    m, p, ga = case["model"], parallel(case), case["train"].get("grad_accumulation", 1)
    rows = set()
    for i in range(p["dp"]):
        lo, hi = chunk_range(m["batch"], p["dp"], i)
        bounds = np.linspace(lo, hi, ga + 1).round().astype(int)
        rows.update(int(b - a) for a, b in zip(bounds[:-1], bounds[1:]))
    return rows


def unsupported_moe(case):
    """Why DeepSpeed's MoE layer cannot express the case's MoE blocks (None: it can, or there are none)."""
    moe = moe_of(case)
    if moe is None:
        return None
    m, p, k = case["model"], parallel(case), moe["top_k"]
    if (k > 1) != bool(moe.get("renormalize")):
        return ("DeepSpeed's top-2 and top-k gating renormalise the chosen experts' gates, its top-1 does not (the case: "
                f"top-{k}, {'renormalised' if moe.get('renormalize') else 'not renormalised'})")
    if k == 2 and moe.get("aux_loss"):
        return "DeepSpeed's top-2 l_aux counts each token's first choice only (the case's, every choice)"
    if k > 1 and drops_tokens(case):
        return (f"the case's capacity drops tokens (capacity {case_slots(case)}): DeepSpeed's top-{k} renormalises the "
                "gates over the choices it keeps (the case's over every choice)"
                + (" and queues second choices after every first one" if k == 2 else ", and keeps the most probable"))
    if moe.get("shared_ffn"):
        return "DeepSpeed's MoE layer has no shared expert (its use_residual is PR-MoE's learned mix of two outputs)"
    if p["dp"] % p["ep"]:
        return "DeepSpeed's expert-parallel groups come from the data-parallel ranks: ep must divide dp"
    one_sequence = micro_batch_rows(case) == {1}
    if moe.get("aux_loss") and not one_sequence:
        return ("DeepSpeed's l_aux covers a forward's tokens, the case's a sequence's: micro-batches of "
                f"{sorted(micro_batch_rows(case))} sequences")
    if moe.get("aux_loss") and m.get("activation_checkpointing") == "reentrant":
        return "a re-entrant checkpoint runs the forward without grad: the l_aux it returns takes no gradient"
    if drops_tokens(case):
        lead = f"the case's capacity drops tokens ({case_slots(case)} slots < seq {m['seq']}): "
        if not one_sequence:
            return lead + f"DeepSpeed's capacity counts micro-batches of {sorted(micro_batch_rows(case))} sequences"
        theirs = deepspeed_capacity(m["seq"], moe["experts"], moe["capacity_factor"])
        if theirs != case_slots(case):
            return lead + f"DeepSpeed's rounding gives {theirs} slots"
    elif moe.get("pad_to_capacity"):
        # Padded, DeepSpeed applies the capacity factor to every forward, which must then keep all its tokens too.
        short = [r for r in sorted(micro_batch_rows(case))
                 if deepspeed_capacity(r * m["seq"], moe["experts"], moe["capacity_factor"], k) < r * m["seq"]]
        if short:
            return (f"DeepSpeed's capacity over a forward of {short[0]} sequence(s) can drop tokens, the case's over a "
                    f"sequence ({case_slots(case)} slots >= seq {m['seq']}) none")
    return None


def moe_features(stage, case):
    """Coverage features of the case's MoE blocks under DeepSpeed: expert parallelism and the capacity mode (the top-k
    and the aux loss are setup features, base.moe_setup_features)."""
    moe = moe_of(case)
    if moe is None:
        return []
    base = f"{stage}:moe:ep{parallel(case)['ep']}"
    mode = "capacity-drop" if drops_tokens(case) else "padded" if moe.get("pad_to_capacity") else "dropless"
    return [base, f"{base}:{mode}"]


class DeepSpeedMoe(nn.Module):
    """DeepSpeed's MoE layer on [b, s, h]; the l_aux of each forward appended to `sink`."""

    def __init__(self, case, m, sink):
        super().__init__()
        from deepspeed.moe.layer import MoE

        moe, ep = m["moe"], parallel(case)["ep"]
        dropless = not drops_tokens(case) and not moe.get("pad_to_capacity")
        # One expert: the case's dense MLP (the same parameter names, up / gate / down).
        self.layer = MoE(hidden_size=m["hidden"], expert=Mlp(m), num_experts=moe["experts"], ep_size=ep,
                         k=moe["top_k"], capacity_factor=moe["capacity_factor"],
                         eval_capacity_factor=moe["capacity_factor"], min_capacity=0, drop_tokens=not dropless,
                         use_rts=False, top2_2nd_expert_sampling=False)
        self.sink = sink

    def forward(self, x):
        out, l_aux, _ = self.layer(x)
        self.sink.append(l_aux)
        return out


def expert_groups(ep):
    """DeepSpeed's expert-parallel group of this rank for `ep` (created where missing, as its engine would) and this
    rank's index in it."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    name = f"ep_size_{ep}"
    if name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep)
    group = groups._get_expert_parallel_group(name)
    return group, dist.get_rank(group=group)


def install(model, case, inputs, dt, sink):
    """Replaces the torch model's MoE blocks in `model` by DeepSpeed's, loaded with the case's router and this rank's
    experts (before the engine copies the parameters)."""
    m, ep = case["model"], parallel(case)["ep"]
    _, ep_rank = expert_groups(ep)
    local = m["moe"]["experts"] // ep
    for i, block in enumerate(model.layers):
        if not hasattr(block, "moe"):
            continue
        block.moe = DeepSpeedMoe(case, {**m, "bias": m.get("bias", True)}, sink).to(dt)
        pre = f"layers.{i}.moe."
        ds = block.moe.layer.deepspeed_moe
        with torch.no_grad():
            _copy(ds.gate.wg.weight, torch.tensor(inputs[pre + "router.weight"]).t())
            for j, expert in enumerate(ds.experts.deepspeed_experts):
                e = ep_rank * local + j
                for kind, lin in expert.named_children():
                    _copy(lin.weight, torch.tensor(inputs[pre + f"{kind}.weight"][e]).t())
                    if lin.bias is not None:
                        _copy(lin.bias, torch.tensor(inputs[pre + f"{kind}.bias"][e]))
    return model


def _copy(param, src):
    if tuple(src.shape) != tuple(param.shape):
        raise HarnessError(f"MoE tensor {tuple(src.shape)} vs DeepSpeed's {tuple(param.shape)}")
    param.copy_(src.to(param.dtype))


def is_moe_param(name):
    return PREFIX in name


def to_case_layout(tensors, ep):
    """`tensors` (names -> this rank's float64 arrays) with DeepSpeed's MoE entries replaced by the case's: the gate's
    weight transposed into the router's; each expert linear's weight transposed, the local experts stacked and
    all-gathered over the expert-parallel group. Every rank calls it for the same names (collectives)."""
    import numpy as np
    import torch.distributed as dist

    out = {n: t for n, t in tensors.items() if not is_moe_param(n)}
    pieces = {}
    for name in sorted((n for n in tensors if is_moe_param(n)), key=_expert_order):
        block, rest = name.split(PREFIX, 1)
        t = torch.from_numpy(np.ascontiguousarray(tensors[name]))
        if rest == "deepspeed_moe.gate.wg.weight":
            out[f"{block}.moe.router.weight"] = t.t().contiguous().numpy()
            continue
        kind, leaf = rest.rsplit(".", 2)[-2:]
        pieces.setdefault(f"{block}.moe.{kind}.{leaf}", []).append(t.t() if t.dim() == 2 else t)
    group, _ = expert_groups(ep)
    for case_name, local in pieces.items():
        stacked = torch.stack(local).contiguous()
        if ep > 1:
            parts = [torch.empty_like(stacked) for _ in range(ep)]
            dist.all_gather(parts, stacked, group=group)
            stacked = torch.cat(parts)
        out[case_name] = stacked.numpy()
    return out


def _expert_order(name):
    """Sort key: local experts by index (expert 10 after expert 9), then the name."""
    parts = name.split(".deepspeed_experts.", 1)
    return (parts[0], int(parts[1].split(".", 1)[0]) if len(parts) == 2 else -1, name)
