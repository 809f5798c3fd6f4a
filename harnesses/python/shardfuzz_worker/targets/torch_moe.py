"""The case's `moe` blocks in plain PyTorch, numerically the Rust reference's (harnesses/src/model/moe.rs): a router
(no bias) and a softmax over every expert, each token's top-k experts (ties to the lower index), the gates the chosen
experts' probabilities (with `renormalize`, divided by their sum over the token's choices, before any is dropped), a
capacity per sequence of ceil(capacity_factor x seq x top_k / experts)
slots per expert filled in token order, then choice order (later choices dropped), each expert an MLP like the dense
one, the outputs summed weighted by their gates. The auxiliary load-balancing loss (experts x sum_e f_e P_e per
sequence, averaged over the batch's sequences; the counts f_e not differentiated) enters as its gradient on the router
probabilities, as the reference adds it, in the units `set_aux_unit` gives. A shared expert (`shared_ffn`) is an MLP
without biases every token passes through, added to the routed output, scaled per token by sigmoid(x . w) with
`shared_gate`.

Parameters hold every expert stacked as the case does: `up.weight` [experts, hidden, ffn], `up.bias` [experts, ffn],
`down.weight` [experts, ffn, hidden]; the router is an nn.Linear ([experts, hidden])."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import HarnessError

#: What the auxiliary loss's gradient on one (sequence-averaged) unit of loss is multiplied by in the run now going:
#: set by the training loop before each forward (dp / global tokens, times a loss scale), read in the backward too
#: (a checkpointed block recomputes its forward there). A rank process runs one training loop at a time.
_AUX_UNIT = {"unit": None}


def set_aux_unit(unit):
    """The loss-gradient units of the auxiliary loss for the forwards to come (see _AUX_UNIT)."""
    _AUX_UNIT["unit"] = float(unit)


def slots(seq, experts, top_k, capacity_factor):
    """Slots per expert in one sequence: ceil(capacity_factor x seq x top_k / experts), in the reference's order."""
    return math.ceil(capacity_factor * float(seq * top_k) / experts)


class ExpertLinear(nn.Module):
    """One linear layer of every expert, stacked: weight [experts, in, out], bias [experts, out]."""

    def __init__(self, experts, fan_in, fan_out, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(experts, fan_in, fan_out))
        self.bias = nn.Parameter(torch.zeros(experts, fan_out)) if bias else None

    def forward(self, x, e):
        y = x @ self.weight[e]
        return y + self.bias[e] if self.bias is not None else y


class _AuxLossGradient(torch.autograd.Function):
    """The identity on the router probabilities whose backward adds the auxiliary loss's gradient `extra`."""

    @staticmethod
    def forward(ctx, probs, extra):
        ctx.save_for_backward(extra)
        return probs.view_as(probs)

    @staticmethod
    def backward(ctx, grad):
        (extra,) = ctx.saved_tensors
        return grad + extra.to(grad.dtype), None


class Moe(nn.Module):
    """`mlp` builds the shared expert from a model dict (torch_model.Mlp; passed in, as torch_model imports this)."""

    def __init__(self, m, mlp=None):
        super().__init__()
        cfg = m["moe"]
        h, f, e, bias = m["hidden"], m["ffn"], cfg["experts"], m["bias"]
        self.experts, self.top_k, self.capacity_factor = e, cfg["top_k"], cfg["capacity_factor"]
        self.aux_loss = cfg.get("aux_loss") or 0.0
        self.renormalize = bool(cfg.get("renormalize"))
        self.swiglu = m.get("activation", "gelu") == "swiglu"
        self.router = nn.Linear(h, e, bias=False)
        self.up = ExpertLinear(e, h, f, bias)
        if self.swiglu:
            self.gate = ExpertLinear(e, h, f, bias)
        self.down = ExpertLinear(e, f, h, bias)
        if cfg.get("shared_ffn"):
            self.shared = mlp({**m, "ffn": cfg["shared_ffn"], "bias": False})
            self.shared_gate = nn.Linear(h, 1, bias=False) if cfg.get("shared_gate") else None

    def expert(self, x, e):
        if self.swiglu:
            return self.down(F.silu(self.gate(x, e)) * self.up(x, e), e)
        return self.down(F.gelu(self.up(x, e), approximate="tanh"), e)

    def forward(self, x):
        b, s, h = x.shape
        y = x.reshape(-1, h)
        probs = torch.softmax(self.router(y), dim=-1)
        chosen = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :self.top_k].contiguous()
        if self.aux_loss:
            probs = _AuxLossGradient.apply(probs, self.aux_gradient(chosen, b, s))
        gates = probs.gather(1, chosen)
        if self.renormalize:
            gates = gates / gates.sum(-1, keepdim=True)
        kept = self.kept(chosen, b, s)
        out = torch.zeros(b * s, self.top_k, h, dtype=y.dtype)
        for e in range(self.experts):
            tok, choice = ((chosen == e) & kept).nonzero(as_tuple=True)
            if len(tok):
                out = out.index_put((tok, choice), self.expert(y[tok], e))
        routed = (out * gates.unsqueeze(-1)).sum(1)
        if hasattr(self, "shared"):
            shared = self.shared(y)
            if self.shared_gate is not None:
                shared = shared * torch.sigmoid(self.shared_gate(y))
            routed = routed + shared
        return routed.view(b, s, h)

    def kept(self, chosen, b, s):
        """[tokens, top_k]: whether each choice got a slot of its expert's capacity in its sequence."""
        cap = slots(s, self.experts, self.top_k, self.capacity_factor)
        onehot = F.one_hot(chosen.view(b, s * self.top_k), self.experts)  # (token, choice) order per sequence
        position = (onehot.cumsum(1) - 1).gather(2, chosen.view(b, s * self.top_k, 1))
        return (position < cap).view(b * s, self.top_k)

    def aux_gradient(self, chosen, b, s):
        """The auxiliary loss's gradient on every router probability: per sequence, coef x experts x f_e / seq, in
        the units set_aux_unit gave (the sequences averaged over the global batch there)."""
        unit = _AUX_UNIT["unit"]
        if unit is None:
            raise HarnessError("the MoE auxiliary loss's units were never set")
        counts = F.one_hot(chosen.view(b, s * self.top_k), self.experts).sum(1, dtype=torch.float64)  # [b, experts]
        scale = self.aux_loss * self.experts * unit / (s * self.top_k)
        return (counts * scale).repeat_interleave(s, dim=0)
