"""Which `transformers` model colossalai-hybrid builds for a case (a Llama for RMSNorm + SwiGLU, a GPT-2 for LayerNorm +
GELU: colossalai_llama.py, colossalai_gpt2.py), and what the two share: the case's names and layouts, and the axis
along which tensor parallelism shards each case tensor. Each family module has `expressible(m)`, `build(m, inputs,
dtype)` and `case_tensors(name, t)` (a model parameter, gradient or shard -> [(case name, tensor in the case's
layout)]); the functions below dispatch to the family of the case or of the parameter name."""

from . import colossalai_gpt2, colossalai_llama

FAMILIES = (colossalai_llama, colossalai_gpt2)


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
    return (colossalai_gpt2 if name.startswith("transformer.") else colossalai_llama).case_tensors(name, t)


def case_axis(case):
    """The axis (in the case's layout) along which tensor parallelism shards a case tensor, or None: the vocabulary of
    the embedding and LM head, the output features of column-parallel projections (q, k, v, gate, up: weight and
    bias), the input features of row-parallel ones (o, down: the weight; their bias is replicated)."""
    if case in ("embed.weight", "lm_head.weight"):
        return 0
    parts = case.split(".")
    if len(parts) == 5 and parts[2] in ("attn", "mlp"):
        if parts[3] in ("q", "k", "v", "gate", "up"):
            return 1 if parts[4] == "weight" else 0
        return 0 if parts[4] == "weight" else None
    return None


def shardformer_loss(m, plugin):
    return family(m).shardformer_loss(m, plugin)
