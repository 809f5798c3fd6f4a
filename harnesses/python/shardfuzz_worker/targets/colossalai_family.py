"""Which `transformers` model colossalai-hybrid builds for a case (a Llama for RMSNorm + SwiGLU, a GPT-2 for LayerNorm +
GELU: colossalai_llama.py, colossalai_gpt2.py; colossalai-moe a Mixtral for MoE blocks: colossalai_mixtral.py). Both translate to the case's names and layouts, whose tensor-parallel
axes megatron_model.shard_dim gives. Each family module has `expressible(m)`, `build(m, inputs,
dtype)` and `case_tensors(name, t)` (a model parameter, gradient or shard -> [(case name, tensor in the case's
layout)]); the functions below dispatch to the family of the case or of the parameter name."""

from . import colossalai_gpt2, colossalai_llama, colossalai_mixtral

FAMILIES = (colossalai_llama, colossalai_gpt2, colossalai_mixtral)


def family(m):
    """The first family that expresses the case's model, or None."""
    return next((f for f in FAMILIES if f.expressible(m) is None), None)


def expressible(m):
    if family(m) is not None:
        return None
    return "; ".join(f"{f.__name__.rsplit('_', 1)[-1]}: {f.expressible(m)}" for f in FAMILIES)


def build(m, inputs, dtype):
    return family(m).build(m, inputs, dtype)


def case_tensors(name, t):
    family = (colossalai_gpt2 if name.startswith("transformer.") else colossalai_mixtral if ".block_sparse_moe." in name
              else colossalai_llama)
    return family.case_tensors(name, t)


def unfreezable(m, case):
    """Why the case's family cannot freeze what the case's `train.frozen` asks (a parameter fusing frozen and trained
    case tensors), or None."""
    f = family(m)
    return f.unfreezable(m, case) if hasattr(f, "unfreezable") else None


def shardformer_loss(m, plugin):
    return family(m).shardformer_loss(m, plugin)
