"""The case's context parallelism (`parallel.cp`) as torch's own: `torch.distributed.tensor.experimental.context_parallel`
(torchtitan's CP). Each micro-batch's token ids and targets are sharded along the sequence by the context manager
itself (head-tail load balanced where 2 x cp divides the sequence, as torch 2.15 chooses, else contiguous parts), and
every attention core calls `F.scaled_dot_product_attention`, which the context manager replaces with its ring
attention (DTensor dispatch of the flash-attention op: key/value shards rotated by all-gather, or by all-to-all with
the case's `cp_all_to_all`; blocks merged by log-sum-exp; the causal mask per block). Forward and backward run inside
the context. The logits come back to whole sequences through `context_parallel_unshard`. (What older releases lack,
torch_release says.)

CPU shim: torch's ring attention dispatches the CUDA flash-attention ops (`aten::_scaled_dot_product_flash_attention`
and its backward), and the CPU's `F.scaled_dot_product_attention` takes `_scaled_dot_product_flash_attention_for_cpu`,
which has no DTensor rule. So the CUDA ops get CPU kernels from the CPU flash ones (same math; the outputs the CPU op
lacks are placeholders torch's ring code never reads), and within the context `F.scaled_dot_product_attention` calls
the CUDA op, as it does on a GPU. Everything torch's CP does around the kernels runs unchanged."""

import contextlib
import functools
import math

import torch
import torch.nn.functional as F

from .base import parallel
from .torch_release import context_parallel_module, cp_load_balances, cp_rotate_methods, cp_unshard
from .torch_model import positions_of


def context_parallel(case):
    """The case's cp degree (1: none)."""
    return parallel(case)["cp"]


def unsupported_context_parallel(case):
    """Why torch's context parallelism cannot express the case, or None (also None without cp)."""
    cp = context_parallel(case)
    if cp == 1:
        return None
    m, p = case["model"], parallel(case)
    if m["seq"] % cp:
        # Measured: torch shards the sequence unchecked and the ring's all-gathers of unequal parts abort gloo
        # (SIGABRT); every CP implementation asks the caller to pad (TransformerEngine, Megatron, DeepSpeed #7384).
        return "torch's context parallelism takes a sequence the caller padded to a multiple of cp"
    if case["train"]["dtype"] == "f64":
        # Its kernels (flash, memory-efficient, cuDNN attention) take no float64 on a GPU, and its merge of the blocks
        # runs in float32 (`_cp_options.convert_to_f32`): float64 context parallelism does not exist there.
        return "torch's context-parallel attention kernels take no float64"
    if p["tp"] > 1 or p["pp"] > 1 or "moe" in m.get("layers", ()):
        return "torch's context parallelism is expressed beside data parallelism only (no tp, pp or MoE)"
    if p["zero_shard_group"] is not None:
        return "torch's context parallelism here reduces over the data and context ranks together (no HSDP group)"
    if case["train"].get("compiled"):
        # A compiled case with cp 4 hung (campaign 273, README "Compiled models"), and what Dynamo traces here is this
        # module's CPU shim, not the GPU path compiled CP runs: not expressed until that is settled.
        return ("torch's context parallelism runs here through a CPU shim (CUDA flash-attention ops given CPU kernels, "
                "scaled_dot_product_attention swapped within the context): not compiled")
    if p["cp_all_to_all"] is not None and not cp_rotate_methods():
        return "this torch's ring attention has one rotation (it permutes the key/value shards): no cp_all_to_all choice"
    return None


def load_balanced(case):
    """Whether torch reorders the case's sequence head-tail before sharding it (where 2 x cp divides it, on a torch
    that load balances), else contiguous parts."""
    cp = context_parallel(case)
    return case["model"]["seq"] % (2 * cp) == 0 and cp_load_balances()


def rotate_method(case):
    """The key/value rotation the case asks for: 'alltoall' with its `cp_all_to_all`, else torch's default
    'allgather'; 'permute' on a torch without the choice."""
    if not cp_rotate_methods():
        return "permute"
    return "alltoall" if parallel(case)["cp_all_to_all"] else "allgather"


@functools.lru_cache(maxsize=None)
def install_cpu_flash_kernels():
    """CPU kernels for the CUDA flash-attention ops torch's ring attention calls, from the CPU flash ones (once per
    process; the library object is kept alive by the cache)."""
    aten = torch.ops.aten
    lib = torch.library.Library("aten", "IMPL")

    def flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, scale=scale)
        unused = torch.zeros((), dtype=torch.int64)  # cumulative lengths, rng state: never read without dropout
        return out, lse, unused, unused, q.shape[2], k.shape[2], unused, unused, torch.zeros((), dtype=q.dtype)

    def flash_backward(grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset, *,
                       scale=None):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, dropout_p, is_causal,
                                                                         scale=scale)

    lib.impl("_scaled_dot_product_flash_attention", flash, "CPU")
    lib.impl("_scaled_dot_product_flash_attention_backward", flash_backward, "CPU")
    return lib


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """F.scaled_dot_product_attention as a GPU runs it: the flash-attention op (torch's CP patches this name: its
    replacement is looked up by `__name__`)."""
    if attn_mask is not None or enable_gqa:
        raise ValueError("the flash path takes no mask and no GQA (the model repeats the key/value heads)")
    return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]


def ring_attention(q, k, v):
    """The model's attention core [batch, heads, seq, head_dim] through F.scaled_dot_product_attention, which torch's
    context manager replaces by its ring attention: causal, scale 1/sqrt(head_dim), GQA as repeated key/value heads."""
    k, v = query_heads(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(q.shape[-1]))


def query_heads(q, k, v):
    """(k, v) with each key/value head repeated for the query heads that share it (GQA; the flash path takes equal
    head counts)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return k, v


def baseline_attention(case):
    """The attention core of the case's single-device baseline under context parallelism (else None: the model's
    own): the ring's arithmetic on one device (`blockwise_attention`), in blocks of the parts the sequence is split
    into (2 x cp chunks where torch load balances). Measured (campaign 259, f32, "large" data): the ring's gradients
    differ from the plain causal attention's by 10x the emulated noise, and from one flash call's by as much: a
    log-sum-exp merged over blocks in float32 carries |lse| x u into every probability the backward recomputes."""
    cp = context_parallel(case)
    if cp == 1:
        return None
    parts = 2 * cp if load_balanced(case) else cp
    return lambda q, k, v: blockwise_attention(q, k, v, parts)


def blockwise_attention(q, k, v, parts):
    """Causal attention [batch, heads, seq, head_dim] as torch's ring computes it, on one device: each of `parts`
    query blocks against every earlier key/value block (and its own, causally) by the flash kernel, merged by
    log-sum-exp in float32 (torch's `_SDPAMerger` formula); the backward block by block from the merged log-sum-exp,
    accumulated in float32 (torch's `_templated_ring_attention_backward`). GQA as repeated key/value heads."""
    return _Blockwise.apply(q, *query_heads(q, k, v), parts)


def _block_pairs(parts):
    """(query block, key/value block, causal) of a causal blockwise attention, in the ring's order: a query block's
    own key/value block first (causally), then the earlier ones as they come round the ring (nearest first)."""
    return [(i, j, i == j) for i in range(parts) for j in range(i, -1, -1)]


class _Blockwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, parts):
        aten, scale = torch.ops.aten, 1.0 / math.sqrt(q.shape[-1])
        qs, ks, vs = (t.chunk(parts, dim=2) for t in (q, k, v))
        merged = [None] * parts
        for i, j, causal in _block_pairs(parts):
            o, lse = aten._scaled_dot_product_flash_attention_for_cpu(qs[i], ks[j], vs[j], 0.0, causal, scale=scale)
            lse_dtype = lse.dtype
            o, lse = o.float(), lse.float().unsqueeze(-1)
            if merged[i] is None:
                merged[i] = (o, lse)
            else:
                out, total = merged[i]
                merged[i] = (out - torch.sigmoid(lse - total) * (out - o), total - F.logsigmoid(total - lse))
        out = torch.cat([o.to(q.dtype) for o, _ in merged], dim=2)
        lse = torch.cat([lse.squeeze(-1) for _, lse in merged], dim=2).to(lse_dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.parts, ctx.scale = parts, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        aten = torch.ops.aten
        qs, ks, vs, outs, lses, grads = (t.chunk(ctx.parts, dim=2) for t in (q, k, v, out, lse, grad.contiguous()))
        dq, dk, dv = ([torch.zeros_like(b, dtype=torch.float32) for b in blocks] for blocks in (qs, ks, vs))
        for i, j, causal in _block_pairs(ctx.parts):
            a, b, c = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grads[i], qs[i], ks[j], vs[j], outs[i], lses[i].contiguous(), 0.0, causal, scale=ctx.scale)
            dq[i] += a.float()
            dk[j] += b.float()
            dv[j] += c.float()
        return (*(torch.cat(d, dim=2).to(t.dtype) for d, t in ((dq, q), (dk, k), (dv, v))), None)


class TorchSequenceSplit:
    """`train`'s `seq` for torch's CP over `cp_mesh`: the context manager shards each micro-batch's ids and targets and
    is active through its forward and backward; the framework (FSDP2, DDP) averages gradients over dp x cp ranks
    (`averaged`)."""

    def __init__(self, cp_mesh, rotate):
        self.mesh, self.rotate, self.averaged = cp_mesh, rotate, cp_mesh.size()

    @contextlib.contextmanager
    def split(self, ids, tgt):
        cp_context = context_parallel_module().context_parallel  # (torch 2.5.1 does not export it yet)
        install_cpu_flash_kernels()
        if self.rotate != "permute":
            context_parallel_module().set_rotate_method(self.rotate)
        ids, tgt = ids.clone(), tgt.clone()
        # Each token's position, sharded as the ids are (torchtitan passes its rotary table the same way): what a
        # rotary embedding turns this rank's tokens by.
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1).clone()
        released, F.scaled_dot_product_attention = F.scaled_dot_product_attention, scaled_dot_product_attention
        try:
            with cp_context(self.mesh, buffers=[ids, tgt, positions], buffer_seq_dims=[1, 1, 1],
                            no_restore_buffers={ids, tgt, positions}), positions_of(positions):
                yield ids, tgt
        finally:
            F.scaled_dot_product_attention = released

    def whole(self, logits):
        """A micro-batch's logits [rows, this rank's tokens, vocab] as whole sequences in order."""
        return cp_unshard(self.mesh, logits, 1)


def install(model):
    """Every attention block of `model` attends through torch's ring attention."""
    for layer in model.layers:
        if hasattr(layer, "attn"):
            layer.attn.attend = ring_attention


def features(stage, case):
    """Torch CP's degree, whether the sequence is load balanced (head-tail) or in order, the rotation, GQA."""
    cp = context_parallel(case)
    if cp == 1:
        return []
    m = case["model"]
    order = "load-balanced" if load_balanced(case) else "in-order"
    out = [f"{stage}:cp{cp}", f"{stage}:cp:{order}", f"{stage}:cp:rotate-{rotate_method(case)}"]
    if m["kv_heads"] < m["heads"]:
        out.append(f"{stage}:cp:gqa")
    return out
