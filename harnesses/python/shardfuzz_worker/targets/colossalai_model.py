"""The case's model sharded by Colossal-AI's shardformer layers (see colossalai_tp.py), its training loop on one
tensor-parallel rank, and the assembly of the ranks' slices into full case-layout tensors.

The plain torch model (torch_model.Model, the case's parameters loaded) is converted layer by layer with each
shardformer layer's own `from_native_module`, as shardformer's policies do; the forward follows shardformer's
Llama forward (modeling/llama.py): under sequence parallelism (`split_gather` / `ring`) the embedding output is
split along the sequence, the column-parallel linears gather it and the row-parallel ones reduce-scatter it,
the final norm's output is gathered before the LM head, and the norms' partial gradients are all-reduced by
`SeqParallelUtils.allreduce_partial_data_grad` (what HybridParallelPlugin's optimizer does).
"""

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from . import colossalai_release
from .base import (IGNORE_INDEX, dtype_name, grad_or_fail, is_frozen, loss_denominator, micro_batches, parallel,
                   vocab_sharded_loss)
from .megatron_model import linear_kind, shard_dim
from .torch_common import torch_dtype
from .torch_model import (Model, block_sequence, causal_attention, checkpointed_block, freeze, load_case_params,
                          make_optimizer, model_defaults)


def _col(linear, group, sp_mode):
    from colossalai.shardformer.layer import Linear1D_Col

    return Linear1D_Col.from_native_module(linear, process_group=group, seq_parallel_mode=sp_mode, seq_parallel_dim=1)


def _row(linear, group, sp_mode):
    from colossalai.shardformer.layer import Linear1D_Row

    return Linear1D_Row.from_native_module(linear, process_group=group, parallel_input=True, seq_parallel_mode=sp_mode,
                                           seq_parallel_dim=1)


class Attention(nn.Module):
    def __init__(self, plain, m, group, sp_mode):
        super().__init__()
        self.d = m["hidden"] // m["heads"]
        self.q, self.k, self.v = (_col(plain.q, group, sp_mode), _col(plain.k, group, sp_mode), _col(plain.v, group, sp_mode))
        self.o = _row(plain.o, group, sp_mode)

    def forward(self, x):  # x [b, s (/ tp under sequence parallelism), h]
        q, k, v = self.q(x), self.k(x), self.v(x)  # [b, s, heads_local * d]: the column linears gathered s
        b, s = q.shape[0], q.shape[1]
        q, k, v = (t.view(b, s, t.shape[-1] // self.d, self.d).transpose(1, 2) for t in (q, k, v))
        a = causal_attention(q, k, v)
        return self.o(a.transpose(1, 2).reshape(b, s, a.shape[1] * a.shape[3]))


class Mlp(nn.Module):
    def __init__(self, plain, group, sp_mode):
        super().__init__()
        self.swiglu = plain.swiglu
        self.up = _col(plain.up, group, sp_mode)
        if self.swiglu:
            self.gate = _col(plain.gate, group, sp_mode)
        self.down = _row(plain.down, group, sp_mode)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, plain, m, group, sp_mode):
        super().__init__()
        self.norm = plain.norm
        if hasattr(plain, "attn"):
            self.attn = Attention(plain.attn, m, group, sp_mode)
        else:
            self.mlp = Mlp(plain.mlp, group, sp_mode)

    def forward(self, x):
        inner = self.attn if hasattr(self, "attn") else self.mlp
        return x + inner(self.norm(x))


class ColossalModel(nn.Module):
    """ids [b, s] -> this rank's logits [b, s, its valid vocabulary columns], or with `gather_output` the logits
    gathered over the vocabulary [b, s, vocab]."""

    def __init__(self, plain, m, group, sp_mode, gather_output=False, vocab_divisor=1):
        from colossalai.shardformer.layer import VocabParallelEmbedding1D, VocabParallelLMHead1D
        from colossalai.shardformer.layer.utils import SeqParallelUtils

        super().__init__()
        self.group, self.sp_mode = group, sp_mode
        self.recompute, self.passes = plain.recompute, plain.passes
        # Vocabulary padded to a multiple of the case's `vocab_divisible_by` x tp, by default of tp only: with the
        # layers' default divisor (64 x tp) the cases' small vocabularies would sit on rank 0 alone.
        pad = dict(make_vocab_size_divisible_by=vocab_divisor)
        self.embed = VocabParallelEmbedding1D.from_native_module(plain.embed, process_group=group, **pad)
        self.layers = nn.ModuleList(Block(b, m, group, sp_mode) for b in plain.layers)
        self.final_norm = plain.final_norm
        self.lm_head = VocabParallelLMHead1D.from_native_module(plain.lm_head, process_group=group,
                                                                gather_output=gather_output, **pad)
        if sp_mode:
            for name, p in self.named_parameters():
                if "norm" in name:
                    SeqParallelUtils.marked_as_sp_partial_derived_param(p)

    def forward(self, ids):
        from colossalai.shardformer.layer._operation import gather_forward_split_backward, split_forward_gather_backward

        x = self.embed(ids)
        if self.sp_mode:
            x = split_forward_gather_backward(x, 1, self.group)
        for layer in block_sequence(self.layers, self.passes):
            x = checkpointed_block(layer, x, self.recompute)
        x = self.final_norm(x)
        if self.sp_mode:
            x = gather_forward_split_backward(x, 1, self.group)
        return self.lm_head(x)


#: Case-layout names of the vocabulary-parallel parameters (padded to a multiple of the vocabulary
#: divisor x tp by Colossal-AI; the padding rows are cut off when assembling).
VOCAB_PARALLEL = ("embed.weight", "lm_head.weight")


def case_view(name, t):
    """A local parameter or gradient in the case layout (its slice of it)."""
    t = t.detach().to(torch.float64, copy=True)
    if linear_kind(name) and name.endswith(".weight"):
        t = t.t()
    return t.contiguous().numpy()


def build(case, inputs, group):
    m = model_defaults(case)
    dt = torch_dtype(dtype_name(case))
    plain = Model(m).to(dt)
    load_case_params(plain, inputs, dt)
    freeze(plain, case)  # the case's frozen parameters, frozen before shardformer converts the layers, as a user does
    p = parallel(case)
    # (On one rank there is no sequence to split: ShardConfig refuses split_gather / ring without tensor
    # parallelism, and the model cases mean no sequence parallelism there.)
    sp_mode = p["sequence_parallel_mode"] if p["sequence_parallel"] and dist.get_world_size(group) > 1 else None
    return ColossalModel(plain, m, group, sp_mode, gather_output=not vocab_sharded_loss(case, True),
                         vocab_divisor=p["vocab_divisible_by"] or 1), dt


def loss_mode(case):
    """How the case's loss is reduced: one micro-batch, Colossal-AI's own mean (cross_entropy_1d's default mode)
    over the batch's counted targets; several, sums divided by the global count here (a mean per micro-batch would be
    our mistake, not theirs). The plain loss on gathered logits (the case's vocab_loss `gathered`) is our own code:
    always summed."""
    chunks = micro_batches(model_defaults(case)["batch"], case["train"].get("grad_accumulation", 1))
    return "mean" if len(chunks) == 1 and vocab_sharded_loss(case, True) else "sum"


def run(case, inputs, rank, tp):
    from colossalai.shardformer.layer import cross_entropy_1d
    from colossalai.shardformer.layer.utils import SeqParallelUtils

    m, t = model_defaults(case), case["train"]
    group = dist.group.WORLD
    model, dt = build(case, inputs, group)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    opt = make_optimizer(case, params)
    b, s = m["batch"], m["seq"]
    ids = torch.tensor(inputs["tokens"].astype(np.int64)).view(b, s)
    tgt = torch.tensor(inputs["targets"].astype(np.int64)).view(b, s)
    denominator = loss_denominator(inputs)
    ga = t.get("grad_accumulation", 1)
    chunks = micro_batches(b, ga)
    mode = loss_mode(case)
    vocab_padded = model.lm_head.out_features  # what shardformer's Llama passes as vocab_size

    losses, logits0, grads0 = [], None, {}
    for k in range(t["steps"]):
        opt.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64)
        rows = []
        for a, c in chunks:
            logits = model(ids[a:c])  # [bc, s, valid vocabulary columns of this rank]
            flat = logits.reshape((c - a) * s, logits.shape[-1])
            if k == 0:
                rows.append(flat.detach().to(torch.float64, copy=True))
            if model.lm_head.gather_output:
                # The case's vocab_loss `gathered`: the whole vocabulary on every rank, the plain loss.
                l = F.cross_entropy(flat, tgt[a:c].reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
            else:
                l = cross_entropy_1d(flat, tgt[a:c].reshape(-1), process_group=group, vocab_size=vocab_padded,
                                     dtype=dt, **colossalai_release.options("cross_entropy_1d", {"mode": mode}))
            if mode == "mean":
                l.backward()
                loss_sum += l.detach().to(torch.float64) * denominator
            else:
                (l * (1.0 / denominator)).backward()
                loss_sum += l.detach().to(torch.float64)
        SeqParallelUtils.allreduce_partial_data_grad(group, model=model)
        losses.append(float(loss_sum) / denominator)
        if k == 0:
            logits0 = torch.cat(rows).numpy()
            for name, p in named:
                if not is_frozen(case, name):  # a frozen parameter has no gradient to report
                    grads0[name] = case_view(name, grad_or_fail(name, p.grad))
        if t.get("clip_grad_norm") is not None:
            clip_global(named, t["clip_grad_norm"], rank, group)
        opt.step()
    final = {name: case_view(name, p) for name, p in named}
    # from_native_module leaves a linear narrower than tp unsharded (linear.py:303, :500): what is sharded
    # is what Colossal-AI made a distributed tensor.
    sharded = {name: is_distributed_tensor(p) for name, p in named}
    return {"logits": logits0, "losses": losses, "grads": grads0, "params": final, "sharded": sharded}


def is_distributed_tensor(p):
    from colossalai.tensor.d_tensor import is_distributed_tensor as sharded

    return sharded(p)


def clip_global(named, max_norm, rank, group):
    """Clipping by the global norm as HybridParallelPlugin's optimizer takes it over tensor-parallel shards:
    sharded parameters from every rank, replicated ones once (plain torch clipping on the local shards
    would be the bug the taxonomy lists)."""
    sq = torch.zeros((), dtype=torch.float64)
    for _, p in named:
        if p.grad is not None and (is_distributed_tensor(p) or rank == 0):
            sq += p.grad.detach().to(torch.float64).pow(2).sum()
    dist.all_reduce(sq, group=group)
    coeff = max_norm / (float(sq.sqrt()) + 1.0e-6)
    if coeff < 1.0:
        with torch.no_grad():
            for _, p in named:
                if p.grad is not None:
                    p.grad.mul_(coeff)


def assemble_outputs(case, outs):
    """Per-rank slices -> per-rank results holding full tensors (sharded ones concatenated and cut to the
    case's sizes, the same on every rank; replicated ones each rank's own copy)."""
    m = case["model"]
    full = [dict(o) for o in outs]
    gathered = not vocab_sharded_loss(case, True)
    logits = outs[0]["logits"] if gathered else np.concatenate([o["logits"] for o in outs], axis=1)[:, : m["vocab"]]
    for kind in ("grads", "params"):
        names = list(outs[0][kind])
        merged = {}
        for name in names:
            d = shard_dim(name) if outs[0]["sharded"][name] else None
            if d is not None:
                merged[name] = np.concatenate([o[kind][name] for o in outs], axis=d)
                if name in VOCAB_PARALLEL:
                    merged[name] = merged[name][: m["vocab"]]
        for r, o in enumerate(outs):
            full[r][kind] = {n: (merged[n] if n in merged else o[kind][n]) for n in names}
    for f in full:
        f["logits"] = logits
        f["rows"] = (0, m["batch"] * m["seq"])
    full[0]["baseline"] = outs[0].get("baseline")
    return full
