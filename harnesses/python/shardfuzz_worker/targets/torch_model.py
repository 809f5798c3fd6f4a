"""The case's model in plain PyTorch, numerically the model of the Rust reference
(harnesses/src/model): embedding -> pre-norm residual blocks (causal GQA attention, MLP with tanh-GELU
or SwiGLU) -> final norm -> LM head -> token-mean cross-entropy.

Linear layers are `nn.Linear` (weight [out, in]) so that the frameworks' own parallel styles apply to
them; the case names parameters as the reference does and stores linear weights [in, out], so
`load_case_params` and `case_name` translate between the two.
"""

import contextlib
import contextvars
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import HarnessError, is_frozen
from .torch_moe import Moe

NORM_EPS = 1e-5


class Norm(nn.Module):
    def __init__(self, h, kind, bias):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(h))
        self.bias = nn.Parameter(torch.zeros(h)) if (kind == "layernorm" and bias) else None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, NORM_EPS)
        return F.rms_norm(x, (x.shape[-1],), self.weight, NORM_EPS)


class HeadNorm(nn.Module):
    """The query or key norm (`model.qk_norm`): each head's vectors normalised over the head size by the model's norm
    kind, without bias, a weight per element of every head ([heads * head_dim])."""

    def __init__(self, heads, d, kind):
        super().__init__()
        self.d, self.kind = d, kind
        self.weight = nn.Parameter(torch.ones(heads * d))

    def forward(self, x):  # [batch, tokens, heads, head_dim]
        w = self.weight.view(-1, self.d)
        if self.kind == "layernorm":
            return F.layer_norm(x, (self.d,), None, None, NORM_EPS) * w
        return F.rms_norm(x, (self.d,), None, NORM_EPS) * w


#: The positions of the tokens this rank's attention sees ([rows, tokens]), where a framework holds part of each
#: sequence: torch's context parallelism shards a positions buffer beside the ids (`positions_of`). None: 0 .. s-1.
_POSITIONS = contextvars.ContextVar("shardfuzz_positions", default=None)


@contextlib.contextmanager
def positions_of(positions):
    """Within: the rotary embedding turns the attention's tokens by `positions` ([rows, tokens])."""
    token = _POSITIONS.set(positions)
    try:
        yield
    finally:
        _POSITIONS.reset(token)


def rotary_cos_sin(positions, head_dim, base, dtype):
    """(cos, sin) [rows, tokens, head_dim] of the rotary embedding with `base` (the case's `model.rotary_base`, Llama's
    half-split layout: each angle twice) at `positions` [rows, tokens]: angles in float64, rounded once to `dtype`."""
    inv_freq = 1.0 / float(base) ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    both = torch.cat((angles, angles), dim=-1)
    return both.cos().to(dtype), both.sin().to(dtype)


def rotate(x, base):
    """`x` [batch, heads, tokens, head_dim] turned by the rotary embedding with `base` at the positions `positions_of`
    gives or 0 .. tokens-1: x * cos + rotate_half(x) * sin elementwise in x's dtype."""
    d, s = x.shape[-1], x.shape[-2]
    positions = _POSITIONS.get()
    cos, sin = rotary_cos_sin(torch.arange(s)[None] if positions is None else positions, d, base, x.dtype)
    half = torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)
    return x * cos[:, None] + half * sin[:, None]


class Attention(nn.Module):
    def __init__(self, m):
        super().__init__()
        h, d = m["hidden"], m["hidden"] // m["heads"]
        self.d, self.rotary_base = d, m.get("rotary_base")
        self.q = nn.Linear(h, m["heads"] * d, bias=m["bias"])
        self.k = nn.Linear(h, m["kv_heads"] * d, bias=m["bias"])
        self.v = nn.Linear(h, m["kv_heads"] * d, bias=m["bias"])
        self.o = nn.Linear(m["heads"] * d, h, bias=m["bias"])
        if m.get("qk_norm"):  # (built here; the targets that run this model refuse query/key norms, Target.qk_norms)
            self.q_norm = HeadNorm(m["heads"], d, m.get("norm", "layernorm"))
            self.k_norm = HeadNorm(m["kv_heads"], d, m.get("norm", "layernorm"))
        # The attention core on [batch, heads, seq, head_dim]; a target whose ranks hold parts of the sequence
        # (context parallelism) puts its framework's distributed attention here.
        self.attend = causal_attention

    def forward(self, x):
        b, s, _ = x.shape
        # Local head counts follow from the local widths (tensor parallelism shards them).
        q, k, v = (self.q(x), self.k(x), self.v(x))
        q = q.view(b, s, q.shape[-1] // self.d, self.d)
        k = k.view(b, s, k.shape[-1] // self.d, self.d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, v.shape[-1] // self.d, self.d).transpose(1, 2)
        if self.rotary_base is not None:
            q, k = rotate(q, self.rotary_base), rotate(k, self.rotary_base)
        a = self.attend(q, k, v)
        # Explicit width: with an empty local sequence (uneven SP shards), -1 would be ambiguous.
        return self.o(a.transpose(1, 2).reshape(b, s, a.shape[1] * a.shape[3]))


def causal_attention(q, k, v):
    """Causal softmax attention on [batch, heads, seq, head_dim]; kv heads shared by consecutive query
    heads (GQA: query head h reads kv head h // (heads / kv_heads)), scale 1/sqrt(head_dim)."""
    s, d = q.shape[2], q.shape[3]
    rep = q.shape[1] // k.shape[1] if k.shape[1] else 1  # (a tensor-parallel rank may hold no head)
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class Mlp(nn.Module):
    def __init__(self, m):
        super().__init__()
        h, f = m["hidden"], m["ffn"]
        self.swiglu = m.get("activation", "gelu") == "swiglu"
        self.up = nn.Linear(h, f, bias=m["bias"])
        if self.swiglu:
            self.gate = nn.Linear(h, f, bias=m["bias"])
        self.down = nn.Linear(f, h, bias=m["bias"])

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    """`x + inner(norm(x))`, or for a parallel block `x + attn(norm(x)) + mlp(norm(x))` (built here; the targets
    that run this model refuse parallel blocks, `Target.parallel_blocks`)."""

    def __init__(self, m, kind):
        super().__init__()
        self.norm = Norm(m["hidden"], m.get("norm", "layernorm"), m["bias"])
        if kind in ("attention", "parallel"):
            self.attn = Attention(m)
        if kind == "moe":
            self.moe = Moe(m, Mlp)
        elif kind in ("mlp", "parallel"):
            self.mlp = Mlp(m)

    def forward(self, x):
        y = self.norm(x)
        if hasattr(self, "attn") and hasattr(self, "mlp"):
            return x + self.attn(y) + self.mlp(y)
        inner = self.attn if hasattr(self, "attn") else self.moe if hasattr(self, "moe") else self.mlp
        return x + inner(y)


class Model(nn.Module):
    """The case's model; `sparse_embedding`: the embedding's gradient as a sparse tensor (where the target that
    builds it reduces sparse gradients). `m["activation_checkpointing"]`: every block under torch.utils.checkpoint
    (reentrant or not), or under `block_checkpoint(layer, x, recompute)` where a target sets one (a framework's own
    checkpoint). `m["layer_passes"]`: the block stack run that many times, the same modules each pass."""

    def __init__(self, m, sparse_embedding=False):
        super().__init__()
        self.recompute = m.get("activation_checkpointing")
        self.passes = m.get("layer_passes", 1)
        self.block_checkpoint = checkpointed_block
        self.tied = m.get("tied_embeddings", False)
        self.embed = nn.Embedding(m["vocab"], m["hidden"], sparse=sparse_embedding)
        self.layers = nn.ModuleList(Block(m, k) for k in m["layers"])
        self.final_norm = Norm(m["hidden"], m.get("norm", "layernorm"), m["bias"])
        if not self.tied:
            self.lm_head = nn.Linear(m["hidden"], m["vocab"], bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in block_sequence(self.layers, self.passes):
            x = self.block_checkpoint(layer, x, self.recompute)
        z = self.final_norm(x)
        if self.tied:
            return z @ self.embed.weight.t()
        return self.lm_head(z)


def block_sequence(layers, passes):
    """The blocks in the order the forward runs them: `layers` once per pass (a case's `model.layer_passes`, each
    block a module used `passes` times per step, as ALBERT shares its layers)."""
    return [layer for _ in range(passes) for layer in layers]


def checkpointed_block(layer, x, recompute):
    """`layer(x)`, under torch.utils.checkpoint where `recompute` (a case's `model.activation_checkpointing`) asks
    for it: its activations recomputed in the backward (use_reentrant as `recompute` says)."""
    if recompute is None or not torch.is_grad_enabled():
        return layer(x)
    reentrant = recompute == "reentrant"
    if reentrant and not x.requires_grad:
        # A re-entrant checkpoint whose inputs need no gradient gives its parameters none (torch warns "None of the
        # inputs have requires_grad=True"); with a frozen embedding users make the input require one, as
        # transformers' enable_input_require_grads() does.
        x = x.detach().requires_grad_(True)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(layer, x, use_reentrant=reentrant)


def model_defaults(case):
    m = dict(case["model"])
    m.setdefault("bias", True)
    m.setdefault("norm", "layernorm")
    m.setdefault("activation", "gelu")
    return m


def unsupported_model(case, loss_scaling=False, master_weights=False, fp32_optimizer_state=False, moe=False):
    """Why the plain torch model cannot express this case, or None. `loss_scaling`: the target runs
    the case's dynamic loss scaler (torch_training.loss_scaler); `master_weights`: it keeps parameters and
    optimizer states in the case's `master_dtype`; `fp32_optimizer_state`: its optimizer keeps its state in fp32
    whatever the parameters' dtype (megatron's mixed-precision optimizers); `moe`: the target runs the MoE blocks,
    its framework's (True) or the torch model's own ("torch": torch_moe)."""
    if "model" not in case:
        return "model cases only"
    m = model_defaults(case)
    if "moe" in m["layers"] and not moe:
        return "MoE layers are not expressed by this target"
    if "moe" in m["layers"] and moe == "torch":
        why = unsupported_torch_moe(case, m)
        if why:
            return why
    if m["heads"] < 1 or m["hidden"] % m["heads"] or m["heads"] % m["kv_heads"]:
        return "heads must divide hidden and kv_heads must divide heads"
    from .base import chunk_range

    dp = case["parallel"].get("dp", 1)
    ga = case["train"].get("grad_accumulation", 1)
    rows = [chunk_range(m["batch"], dp, i)[1] - chunk_range(m["batch"], dp, i)[0] for i in range(dp)]
    if min(rows) < ga:
        return "a data-parallel rank would run an empty micro-batch (fewer rows than grad_accumulation)"
    from .base import master_dtype_name

    held = master_dtype_name(case) if master_weights else case["train"]["dtype"]
    o = case["train"]["optimizer"]
    if held in ("bf16", "f16") and rounds_in_parameter_dtype(o) and not fp32_optimizer_state:
        return f"a {o['implementation']} Adam over {held} parameters (its arithmetic in {held}; the case's in float32)"
    if o.get("implementation") == "fused" and m.get("sparse_embedding"):
        # Measured (campaign 281): "`_fused_sgd` does not support sparse gradients", on one device too.
        return "torch's fused optimizers take no sparse gradient (a sparse embedding's)"
    if held == "f16" and o["kind"] != "sgd" and not fp32_optimizer_state:
        # torch keeps Adam's moments in the parameter dtype; in f16 the second moment underflows
        # (0.001 g^2 < 6e-8) and the step blows up, where the case's optimizer keeps them in f32.
        return "Adam moments in f16 (torch keeps optimizer state in the parameter dtype)"
    if case["train"].get("loss_scale") is not None and not loss_scaling:
        return "dynamic loss scaling is not expressed by this target"
    return None


def unsupported_torch_moe(case, m):
    """Why the torch model's own MoE blocks (torch_moe) cannot run the case, or None."""
    o = case["train"]["optimizer"]
    if m["moe"].get("aux_loss") and case["train"].get("loss_scale") is not None:
        return "the torch model's MoE auxiliary loss takes no loss scale"
    if m["bias"] and o.get("no_decay_vectors") and o.get("weight_decay", 0.0):
        # make_optimizer tells vectors by their dimensions; the experts' biases are stacked [experts, n] matrices.
        return "the torch model's stacked expert biases would decay under no_decay_vectors (they are vectors)"
    return None


def unsupported_layout(case, axes, what, sp_modes=("split_gather",), offload=False, loss_scaling=False,
                       master_weights=False, fp32_optimizer_state=False, moe=False):
    """unsupported_model(), then: only the mesh axes in `axes` may exceed 1 (`what` says why), the
    sequence-parallel mode is one of `sp_modes`, and ZeRO offloading only where the target has it."""
    why = unsupported_model(case, loss_scaling, master_weights, fp32_optimizer_state, moe)
    if why:
        return why
    p = case["parallel"]
    if any(p.get(a, 1) > 1 for a in ("dp", "tp", "pp", "cp", "ep") if a not in axes):
        return what
    from .base import unsupported_sp_mode, zero_offloaded

    if not offload and zero_offloaded(case):
        return f"{what.split(' ')[0]} has no ZeRO offloading"
    return unsupported_sp_mode(case, what.split(" ")[0], sp_modes)


def build(case, inputs, sparse_embedding=False, dtype=None):
    """The case's model in its dtype (or the dtype named `dtype`) with the case's initial parameters; returns
    (model, dtype)."""
    from .torch_common import torch_dtype

    dt = torch_dtype(dtype or case["train"]["dtype"])
    model = Model(model_defaults(case), sparse_embedding).to(dt)
    load_case_params(model, inputs, dt)
    return freeze(model, case), dt


def sparse_embedding(case):
    """Whether the case asks for the embedding's gradient as a sparse tensor (`model.sparse_embedding`)."""
    return bool((case.get("model") or {}).get("sparse_embedding", False))


def unsupported_sparse_embedding(case):
    """Why a target that reduces sparse gradients cannot run the case's sparse embedding gradient, or None."""
    if not sparse_embedding(case):
        return None
    t = case["train"]
    if model_defaults(case).get("tied_embeddings"):
        return "a tied LM head adds a dense gradient to the embedding's: it cannot stay sparse"
    o = t["optimizer"]
    if t["dtype"] == "f16":
        # Measured: the backward's accumulation of sparse gradients raises `"cadd_sparse" not implemented for
        # 'Half'` on CPU (torch has no CPU kernel for it; bf16 has one).
        return "torch has no CPU kernel adding f16 sparse gradients"
    if o["kind"] != "sgd":
        return f"torch's {o['kind']} takes no sparse gradients (SGD does)"
    if o.get("weight_decay", 0.0):
        # torch's SGD adds the decay as add(sparse, dense), which torch refuses.
        return "torch's SGD takes no sparse gradient with weight decay"
    return None


def is_linear_weight(name):
    """Whether `name` is an `nn.Linear` weight ([out, in]; the case holds it [in, out])."""
    return name.endswith(".weight") and (".attn." in name or ".mlp." in name or name.endswith(".moe.router.weight")
                                         or ".moe.shared." in name or name.endswith(".moe.shared_gate.weight"))


def load_case_params(model, inputs, dtype):
    """Copies the case's initial parameters (reference names and layouts) into `model`."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            src = torch.tensor(inputs[name])
            if is_linear_weight(name):
                src = src.t()
            p.copy_(src.to(dtype))


def freeze(model, case):
    """`model` with the case's frozen parameters (`train.frozen`) set requires_grad=False, as a user freezes them before
    a framework wraps the model."""
    for name, p in model.named_parameters():
        if is_frozen(case, name):
            p.requires_grad_(False)
    return model


def to_case_layout(name, t):
    """A full parameter or gradient in the reference's layout (linear weights [in, out])."""
    return t.t() if is_linear_weight(name) else t


def token_slices(case, dp_index, dp):
    """The batch rows a data-parallel rank holds (torch.chunk split) and the global token count."""
    from .base import chunk_range

    m = case["model"]
    lo, hi = chunk_range(m["batch"], dp, dp_index)
    return lo, hi, m["batch"] * m["seq"]


def make_optimizer(case, params, split_groups=None):
    """The case's optimizer over the trainable ones of `params` (a frozen parameter is left out, as fine-tuning
    scripts do); `split_groups` maps its parameter groups (dicts) to the ones the optimizer gets (a framework's own
    grouping)."""
    cls, groups, kw = optimizer_parts(case, params, split_groups)
    return cls(groups, **kw)


#: torch's keyword for each optimizer implementation (`train.optimizer.implementation`).
IMPLEMENTATION_KWARGS = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def rounds_in_parameter_dtype(optimizer):
    """Whether the case's optimizer is an Adam whose implementation (for-loop, foreach) rounds every intermediate (the
    moments, the denominator) to the parameters' dtype, where the fused kernel and the case's optimizer compute in
    float32: a different computation over low-precision parameters."""
    return optimizer["kind"] != "sgd" and optimizer.get("implementation") in ("for_loop", "foreach")


def implementation_kwargs(optimizer, low):
    """torch's keyword for the case's optimizer implementation over low-precision parameters (`low`) or not: the
    case's, else the default: fused for an Adam over low-precision parameters (its arithmetic in float32, as the
    reference's, where eps and v underflow in f16 otherwise), the for-loop otherwise."""
    if low and rounds_in_parameter_dtype(optimizer):
        raise HarnessError(f"a {optimizer['implementation']} Adam over low-precision parameters should have been "
                           "refused (unsupported_model)")
    default = "fused" if low and optimizer["kind"] != "sgd" else "for_loop"
    return IMPLEMENTATION_KWARGS[optimizer.get("implementation") or default]


def foreach_clip(case):
    """Whether gradient clipping takes torch's foreach path (`foreach=True`): where the case's optimizer does
    (`train.optimizer.implementation` foreach), as torch's default on an accelerator does for both."""
    return case["train"]["optimizer"].get("implementation") == "foreach"


def clip_norm_type(case):
    """torch's `norm_type` for the case's gradient clipping (`train.clip_norm_type`: 1, 2 or inf)."""
    return {"l1": 1.0, "l2": 2.0, "inf": math.inf}[case["train"].get("clip_norm_type") or "l2"]


def optimizer_parts(case, params, split_groups=None):
    """(optimizer class, parameter groups, keyword arguments) of make_optimizer's optimizer: what a wrapper building
    the optimizer itself (torch's ZeroRedundancyOptimizer) takes."""
    params = [p for p in params if p.requires_grad]
    o = case["train"]["optimizer"]
    lr, wd = o["lr"], o.get("weight_decay", 0.0)
    betas = (o.get("beta1", 0.9), o.get("beta2", 0.999))
    eps = o.get("eps", 1e-8)
    low = params[0].dtype in (torch.float16, torch.bfloat16) if params else False
    impl = implementation_kwargs(o, low)
    groups = params
    if o.get("no_decay_vectors"):
        # nanoGPT's configure_optimizers: matrices decay, biases and norm weights (fewer than two dims) do not.
        # (By the parameter's dimensions before a framework flattened it: FSDP1's are 1-D views, `case_ndim` set.)
        ndim = {id(p): getattr(p, "case_ndim", p.dim()) for p in params}
        groups = [{"params": [p for p in params if ndim[id(p)] >= 2]},
                  {"params": [p for p in params if ndim[id(p)] < 2], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
    if split_groups is not None:
        groups = split_groups(groups if isinstance(groups[0], dict) else [{"params": groups}])
    if o["kind"] == "sgd":
        # SGD's update is one rounding of w - lr * g either way.
        return torch.optim.SGD, groups, {"lr": lr, "weight_decay": wd, **impl}
    cls = torch.optim.AdamW if o["kind"] == "adamw" else torch.optim.Adam
    return cls, groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": wd, **impl}
