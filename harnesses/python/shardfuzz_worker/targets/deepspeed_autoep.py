"""The case's MoE blocks made expert parallel by DeepSpeed's AutoEP (deepspeed-zero, with `parallel.auto_ep`): the
model's own MoE modules, laid out as a transformers model's (a router `nn.Linear`, experts as stacked `gate_proj` /
`up_proj` [experts, ffn, hidden] and `down_proj` [experts, hidden, ffn], a shared expert and its gate), are found by
the `expert_parallel` section's custom patterns and replaced at `deepspeed.initialize` by `AutoEPMoELayer`s over
DeepSpeed's expert-parallel groups (the case's ep): softmax scores, each token's top-k experts, the gates renormalised
over them with the case's `renormalize` (`route_norm`), applied after the experts (`score_apply: post`), tokens sent
to their experts' ranks by a dropless all-to-all of variable splits, experts computed locally and the outputs sent
back. The case's optimizer is handed to DeepSpeed as a callable, so that it is built over the replaced parameters with
the expert ones in groups of their own (what DeepSpeed's config-built optimizer does, and what ZeRO requires).

With tp > 1 AutoEP is folded onto AutoTP's tensor-parallel ranks (deepspeed_autotp): the expert-parallel groups may
span them.

Not expressed (`unsupported`): experts other than SwiGLU ones, expert biases, a capacity (dropping or padded), the
auxiliary loss (AutoEP computes none), sequence parallelism beside it, frozen MoE parameters, a DeepSpeed without
AutoEP.

Reported parameters and gradients are in the case's layout: the router's weight transposed, each expert projection's
local experts all-gathered over the expert-parallel group and transposed to [experts, in, out], the shared expert's
linears transposed."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import HarnessError, drops_tokens, dtype_name, moe_of, parallel
from .torch_common import torch_dtype

#: Where the replaced layers' parameters sit in a block (`layers.{i}.moe.…`), and the case's names they hold.
PREFIX = ".moe."
EXPERT_PROJECTIONS = {"w1": "gate", "w3": "up", "w2": "down"}


def enabled(case):
    return moe_of(case) is not None and bool(parallel(case).get("auto_ep"))


def available():
    try:
        import deepspeed.module_inject.auto_ep  # noqa: F401
    except ImportError:
        return False
    return True


def unsupported_autoep(case):
    """Why AutoEP cannot express the case's MoE blocks (None: it can, or the case does not ask for it)."""
    if not enabled(case):
        return None
    m, moe, p = case["model"], moe_of(case), parallel(case)
    if not available():
        return "this DeepSpeed has no AutoEP (deepspeed.module_inject.auto_ep)"
    if m.get("activation", "gelu") != "swiglu":
        return "AutoEP's experts are gated MLPs (SwiGLU here); the case's gelu experts are not"
    if m.get("bias", True):
        return "AutoEP's experts (GroupedExperts) hold no biases"
    if drops_tokens(case) or moe.get("pad_to_capacity"):
        return "AutoEP dispatches every token (dropless): the case's capacity is not expressed"
    if moe.get("aux_loss"):
        return "AutoEP computes no auxiliary load-balancing loss"
    if p["cp"] > 1 or p["sequence_parallel"]:
        return "AutoEP beside sequence parallelism is not expressed"
    if p["tp"] == 1 and p["dp"] % p["ep"]:
        return "DeepSpeed's expert-parallel groups come from the data-parallel ranks: ep must divide dp"
    return None


def config(cfg, case):
    """`cfg` with the `expert_parallel` section that makes AutoEP find the blocks `prepare` installs."""
    if not enabled(case):
        return cfg
    moe = moe_of(case)
    section = {
        "enabled": True,
        "autoep_size": parallel(case)["ep"],
        "moe_layer_pattern": r"layers\.\d+\.moe",
        "router_pattern": "router",
        "expert_pattern": "experts",
        "expert_w1": "gate_proj",
        "expert_w3": "up_proj",
        "expert_w2": "down_proj",
        "expert_activation": "swiglu",
        "top_k": moe["top_k"],
        "score_func": "softmax",
        "score_apply": "post",
        "route_norm": bool(moe.get("renormalize")),
        "use_grouped_mm": grouped_mm(case),
    }
    if moe.get("shared_ffn"):
        section.update(has_shared_experts=True, shared_experts_pattern="shared")
        if moe.get("shared_gate"):
            section["shared_experts_gate_pattern"] = "shared_gate"
    return {**cfg, "expert_parallel": section}


def grouped_mm(case):
    """Whether the experts run as torch._grouped_mm (DeepSpeed's default) or as its loop over the experts: grouped where
    the case's widths meet torch._grouped_mm's rule that every row stride is a multiple of 16 bytes (measured on CPU:
    "strides should be multiple of 16 bytes" otherwise; transformers' MoE widths meet it)."""
    size = torch.empty((), dtype=torch_dtype(dtype_name(case))).element_size()
    m = case["model"]
    return all(width * size % 16 == 0 for width in (m["hidden"], m["ffn"]))


class StackedExperts(nn.Module):
    """Every expert's projections stacked as transformers 5 stores them ([experts, out, in])."""

    def __init__(self, moe):
        super().__init__()
        self.gate_proj = nn.Parameter(moe.gate.weight.detach().transpose(1, 2).contiguous())
        self.up_proj = nn.Parameter(moe.up.weight.detach().transpose(1, 2).contiguous())
        self.down_proj = nn.Parameter(moe.down.weight.detach().transpose(1, 2).contiguous())
        self.act_fn = F.silu


class SourceMoe(nn.Module):
    """The model's MoE module as AutoEP finds it; AutoEP replaces it before any forward."""

    def __init__(self, moe):
        super().__init__()
        self.router = moe.router
        self.experts = StackedExperts(moe)
        if hasattr(moe, "shared"):
            self.shared = moe.shared
            if moe.shared_gate is not None:
                self.shared_gate = moe.shared_gate

    def forward(self, x):
        raise HarnessError("AutoEP did not replace a MoE block (its patterns did not match the model)")


def prepare(model, case):
    """Replaces each MoE block's torch module by the layout AutoEP looks for, with the same parameters."""
    if not enabled(case):
        return model
    for block in model.layers:
        if hasattr(block, "moe"):
            block.moe = SourceMoe(block.moe)
    return model


def optimizer(case, make):
    """What deepspeed.initialize gets as the optimizer: `make(params)` as a callable DeepSpeed calls with the replaced
    model's parameters (None: the case does not ask for AutoEP)."""
    if not enabled(case):
        return None
    return lambda params: make(list(params))


def features(stage, case):
    """AutoEP's degree, top-k and routing, and its shared expert."""
    if not enabled(case):
        return []
    moe = moe_of(case)
    base = f"{stage}:autoep{parallel(case)['ep']}"
    out = [base, f"{base}:top{min(moe['top_k'], 3)}{'-renormalised' if moe.get('renormalize') else ''}",
           f"{base}:{'grouped-mm' if grouped_mm(case) else 'expert-loop'}"]
    if moe.get("shared_ffn"):
        out.append(f"{base}:shared-expert{'-gated' if moe.get('shared_gate') else ''}")
    tp = parallel(case)["tp"]
    if tp > 1:
        # Folded onto AutoTP's lanes (DeepSpeed lays the expert-parallel groups out lane-major); more expert-parallel
        # ranks than data-parallel ones is folding that a data-parallel-only expert layout could not express.
        out.append(f"{base}:folded-tp{tp}")
        if parallel(case)["ep"] > parallel(case)["dp"]:
            out.append(f"{base}:folded:ep-beyond-dp")
    return out


def is_autoep_param(name):
    return PREFIX in name


def to_case_layout(tensors, case):
    """`tensors` (names -> this rank's float64 arrays) with the AutoEP layers' entries in the case's names and layouts.
    Every rank calls it for the same names (collectives over the expert-parallel group)."""
    import numpy as np
    import torch.distributed as dist
    from deepspeed.utils import groups

    ep = parallel(case)["ep"]
    out = {}
    for name, t in tensors.items():
        if not is_autoep_param(name):
            out[name] = t
            continue
        block, rest = name.split(PREFIX, 1)
        t = torch.from_numpy(np.ascontiguousarray(t))
        if rest == "router.gate.weight":
            out[f"{block}.moe.router.weight"] = t.t().contiguous().numpy()
        elif rest.removeprefix("experts.") in EXPERT_PROJECTIONS:
            if ep > 1:
                parts = [torch.empty_like(t) for _ in range(ep)]
                dist.all_gather(parts, t.contiguous(), group=groups._get_expert_parallel_group(f"ep_size_{ep}"))
                t = torch.cat(parts)
            kind = EXPERT_PROJECTIONS[rest.removeprefix("experts.")]
            out[f"{block}.moe.{kind}.weight"] = t.transpose(1, 2).contiguous().numpy()
        elif rest.startswith("shared_experts."):
            out[f"{block}.moe.shared.{rest.split('.', 1)[1]}"] = t.t().contiguous().numpy()
        elif rest == "shared_experts_gate.weight":
            out[f"{block}.moe.shared_gate.weight"] = t.t().contiguous().numpy()
        else:
            raise HarnessError(f"an AutoEP parameter the harness does not know: {name}")
    return out
