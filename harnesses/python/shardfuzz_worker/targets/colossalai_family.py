"""Which `transformers` model colossalai-hybrid builds for a case (a Llama for RMSNorm + SwiGLU, a GPT-2 for LayerNorm +
GELU: colossalai_llama.py, colossalai_gpt2.py; the class the case's `model.hf_model` names: colossalai_llama.py's
Mistral and Qwen2, colossalai_opt.py's OPT, colossalai_falcon.py's Falcon, colossalai_command.py's Command; colossalai-moe a Mixtral for MoE blocks: colossalai_mixtral.py). Both translate to the case's names and layouts, whose tensor-parallel
axes megatron_model.shard_dim gives. Each family module has `expressible(m)`, `build(m, inputs,
dtype)` and `case_tensors(name, t)` (a model parameter, gradient or shard -> [(case name, tensor in the case's
layout)]); the functions below dispatch to the family of the case or of the parameter name."""

from . import colossalai_command, colossalai_falcon, colossalai_gpt2, colossalai_llama, colossalai_mixtral, colossalai_opt

FAMILIES = (colossalai_llama, colossalai_gpt2, colossalai_mixtral)


def families(m):
    """The families that may build the case's model: the one of the transformers class the case names
    (`model.hf_model`: the Llama's for a Llama, a Mistral or a Qwen2; an OPT's), else any."""
    named = m.get("hf_model")
    if named == "opt":
        return (colossalai_opt,)
    if named == "falcon":
        return (colossalai_falcon,)
    if named == "command":
        return (colossalai_command,)
    return (colossalai_llama,) if named else FAMILIES


def family(m):
    """The first family that expresses the case's model, or None."""
    return next((f for f in families(m) if _expresses(f, m) is None), None)


def _expresses(f, m):
    """Why family `f` cannot express the case's model, or None (query/key norms: a Command's only)."""
    if m.get("qk_norm") and f is not colossalai_command:
        return "only a Command (model.hf_model: command) has query/key norms (model.qk_norm)"
    return f.expressible(m)


def expressible(m):
    if family(m) is not None:
        return None
    return "; ".join(f"{f.__name__.rsplit('_', 1)[-1]}: {_expresses(f, m)}" for f in families(m))


def build(m, inputs, dtype):
    return family(m).build(m, inputs, dtype)


def case_tensors(name, t, m):
    if m.get("hf_model") == "command":
        return colossalai_command.case_tensors(name, t, m)
    if name.startswith("transformer.") and m.get("hf_model") == "falcon":
        return colossalai_falcon.case_tensors(name, t, m)
    if name.startswith("transformer."):
        return colossalai_gpt2.case_tensors(name, t)
    if name.startswith("model.decoder."):
        return colossalai_opt.case_tensors(name, t)
    if ".block_sparse_moe." in name:
        return colossalai_mixtral.case_tensors(name, t)
    return colossalai_llama.case_tensors(name, t, m)


def unfreezable(m, case):
    """Why the case's family cannot freeze what the case's `train.frozen` asks (a parameter fusing frozen and trained
    case tensors), or None."""
    f = family(m)
    return f.unfreezable(m, case) if hasattr(f, "unfreezable") else None


def shardformer_loss(m, plugin):
    return family(m).shardformer_loss(m, plugin)
