"""The case's context parallelism (`parallel.cp`) as DeepSpeed-Ulysses: each of the cp ranks of a sequence-parallel
group holds a contiguous part of every sequence, and each attention runs under DeepSpeed's `DistributedAttention`,
whose all-to-alls trade the sequence split for a split of the heads around the local attention (uneven head counts
partitioned by key-value group, as DeepSpeed does), then back.

The engine is told the layout as DeepSpeed's Ulysses users tell it: by default (and with the case's `ulysses_mpu` false)
`sequence_parallel_size` and `data_parallel_size` in the config, from which deepspeed.initialize builds a (dp, sp)
device mesh; with `ulysses_mpu` true DeepSpeed's own sequence-parallel unit (`parallel_state_sp`, initialised for the
case's cp and passed as `mpu`, as its Ulysses-for-Hugging-Face / ALST setup does). Either way rank = dp index x cp + sp
index, and `DistributedAttention` gets the engine's `seq_parallel_group`. The engine reduces gradients over the
sequence-and-data-parallel ranks, dividing by dp only: gradients are summed over the sp ranks, so each rank's loss is its
own tokens' share of the global token mean, as in every data-parallel target here (`train`'s loss seed with dp ranks).
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


def uses_mpu(case):
    """Whether the case's sequence-parallel groups come from DeepSpeed's sequence-parallel unit (else the config's
    mesh)."""
    return context_parallel(case) > 1 and bool(parallel(case)["ulysses_mpu"])


def initialize_kw(case):
    """deepspeed.initialize's `mpu` where the case asks for DeepSpeed's sequence-parallel unit (else nothing)."""
    return sequence_parallel_unit(context_parallel(case)) if uses_mpu(case) else {}


def sequence_parallel_unit(cp):
    """deepspeed.initialize's `mpu`: DeepSpeed's sequence-parallel unit, its groups made afresh for `cp` (every rank
    calls: new groups are collective)."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    release(parallel_state_sp)
    parallel_state_sp.initialize_sequence_parallel(cp)
    return {"mpu": parallel_state_sp}


def release(parallel_state_sp):
    """Drops the sequence-parallel unit's groups (module globals, as its own `_release_sequence_parallel_groups` does)."""
    for name in ("_SEQUENCE_PARALLEL_GROUP", "_SEQUENCE_DATA_PARALLEL_GROUP"):
        if hasattr(parallel_state_sp, name):
            setattr(parallel_state_sp, name, None)


def forget():
    """What a fresh process has: no sequence-parallel unit's groups and no registered mpu or device mesh left by an
    earlier case's engine (DeepSpeed keeps all three in module globals that no engine's teardown clears: a later engine
    without sequence parallelism would take its sp degree from them)."""
    from deepspeed.utils import groups

    for name in ("mesh_device", "mpu"):
        if hasattr(groups, name):
            setattr(groups, name, None)
    import importlib.util

    if importlib.util.find_spec("deepspeed.runtime.sequence_parallel") is not None:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        release(parallel_state_sp)


def config(cfg, case):
    """The engine's config with the case's (dp, sp) mesh, where the case has context parallelism through the mesh."""
    p = parallel(case)
    if p["cp"] > 1:
        cfg["train_batch_size"] = cfg["gradient_accumulation_steps"] * p["dp"]
        if not uses_mpu(case):
            cfg["sequence_parallel_size"] = p["cp"]
            cfg["data_parallel_size"] = p["dp"]
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
    out = [f"{stage}:ulysses-sp{cp}", f"{stage}:ulysses:{heads}",
           f"{stage}:ulysses:{'sequence-parallel-unit' if uses_mpu(case) else 'config-mesh'}"]
    if m["kv_heads"] < m["heads"]:
        out.append(f"{stage}:ulysses:gqa")
    return out
