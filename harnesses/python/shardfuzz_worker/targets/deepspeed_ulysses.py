"""The case's context parallelism (`parallel.cp`) as DeepSpeed-Ulysses: each of the cp ranks of a sequence-parallel
group holds a contiguous part of every sequence, and each attention runs under DeepSpeed's `DistributedAttention`,
whose all-to-alls trade the sequence split for a split of the heads around the local attention (uneven head counts
partitioned by key-value group, as DeepSpeed does), then back.

The engine is told the layout as DeepSpeed's Ulysses users tell it (`sequence_parallel_size`, `data_parallel_size`:
a (dp, sp) device mesh, rank = dp index x cp + sp index); `DistributedAttention` gets the engine's
`seq_parallel_group`. The engine reduces gradients over the sequence-and-data-parallel ranks, dividing by dp only:
gradients are summed over the sp ranks, so each rank's loss is its own tokens' share of the global token mean, as in
every data-parallel target here (`train`'s loss seed with dp ranks).
"""

from .base import parallel
from .torch_model import causal_attention


def context_parallel(case):
    """The case's cp degree (1: none)."""
    return parallel(case)["cp"]


def unsupported_ulysses(case):
    """Why DeepSpeed-Ulysses cannot express the case's context parallelism, or None (also None without it)."""
    cp = context_parallel(case)
    if cp == 1:
        return None
    m = case["model"]
    if m["seq"] % cp:
        # The caller splits the sequence; DistributedAttention's layouts assume equal parts (an open DeepSpeed issue,
        # deepspeedai/DeepSpeed#7384: garbage on NCCL, an abort on gloo), so an uneven split is the user's error.
        return "DeepSpeed-Ulysses takes a sequence the caller split evenly: seq must be a multiple of cp"
    if "moe" in m.get("layers", ()):
        return "MoE blocks beside DeepSpeed-Ulysses are not expressed"
    return None


def config(cfg, case):
    """The engine's config with the case's (dp, sp) mesh, where the case has context parallelism."""
    p = parallel(case)
    if p["cp"] > 1:
        cfg["sequence_parallel_size"] = p["cp"]
        cfg["data_parallel_size"] = p["dp"]
        cfg["train_batch_size"] = cfg["gradient_accumulation_steps"] * p["dp"]
    return cfg


def install(engine, case):
    """Every attention block of the engine's model attends through DeepSpeed's DistributedAttention (nothing where the
    case has no context parallelism)."""
    if context_parallel(case) > 1:
        attend_through_ulysses(engine)


def attend_through_ulysses(engine):
    """Each attention block of the engine's model runs its core under DeepSpeed's DistributedAttention over the engine's
    sequence-parallel group, in its batch-first layout [batch, seq, heads, head_dim]."""
    from deepspeed.sequence.layer import DistributedAttention

    def local(q, k, v):
        return causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    for layer in engine.module.layers:
        if hasattr(layer, "attn"):
            ulysses = DistributedAttention(local, engine.seq_parallel_group, scatter_idx=2, gather_idx=1)
            layer.attn.attend = lambda q, k, v, u=ulysses: u(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                             0).transpose(1, 2)


def rank_part(rank, case):
    """(dp index, `train`'s `seq` part or None) of a rank on the (dp, sp) mesh."""
    cp = context_parallel(case)
    if cp == 1:
        return rank, None
    return rank // cp, rank % cp


def features(stage, case):
    """How the case's heads meet the sp ranks: evenly, or DeepSpeed's uneven partition by key-value group; and GQA."""
    cp = context_parallel(case)
    if cp == 1:
        return []
    m = case["model"]
    heads = "even-heads" if m["kv_heads"] % cp == 0 else "uneven-heads"
    out = [f"{stage}:ulysses-sp{cp}", f"{stage}:ulysses:{heads}"]
    if m["kv_heads"] < m["heads"]:
        out.append(f"{stage}:ulysses:gqa")
    return out
