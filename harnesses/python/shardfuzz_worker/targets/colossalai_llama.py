"""The case's model as a `transformers` Llama (no weights downloaded: built from a LlamaConfig sized by the case,
its parameters the case's), and the translation between the case's parameter names and layouts and Llama's.

A Llama decoder layer is the case's ("attention", "mlp") pair: input_layernorm + self_attn, then
post_attention_layernorm + mlp (gate/up/down with SiLU: the case's swiglu), RMSNorm (eps 1e-5), GQA,
attention scale head_dim^-0.5, no tied embeddings unless the case ties them. The model's rotary embedding
is the case's (`model.rotary_base`, angles in float64) or, without one, the identity (cos 1, sin 0), on this instance;
every other computation is Llama's own.
"""

import re

import torch

from . import colossalai_release
from .torch_model import rotary_cos_sin

NORM_EPS = 1e-5


def expressible(m):
    """Why the case's model is not a Llama, or None."""
    kinds = list(m["layers"])
    if len(kinds) % 2 or kinds != ["attention", "mlp"] * (len(kinds) // 2):
        return "a Llama model is (attention, mlp) layer pairs"
    if m.get("norm", "layernorm") != "rmsnorm":
        return "a Llama model normalises with RMSNorm (the case uses LayerNorm)"
    if m.get("activation", "gelu") != "swiglu":
        return "a Llama MLP is SwiGLU (the case uses GELU)"
    if architecture(m) != "llama" and m["bias"]:
        return f"a {architecture(m)} model has no biases on its output and MLP projections (the case's model.bias)"
    return None


def config(m, dtype):
    """The LlamaConfig options of the case (colossalai_release.llama_model builds the installed release's model)."""
    return dict(
        vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
        num_hidden_layers=len(m["layers"]) // 2, num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
        head_dim=m["hidden"] // m["heads"], rms_norm_eps=NORM_EPS, attention_bias=m["bias"], mlp_bias=m["bias"],
        tie_word_embeddings=bool(m.get("tied_embeddings")), hidden_act="silu", attention_dropout=0.0,
        torch_dtype=dtype, pad_token_id=None, bos_token_id=None, eos_token_id=None,
        _attn_implementation="eager",
    )


class Rotation(torch.nn.Module):
    """In place of LlamaRotaryEmbedding (same call: the (cos, sin) of `position_ids`, in `x`'s dtype): the case's
    rotary embedding (`model.rotary_base`) with angles in float64, so a float64 run is exact (transformers computes
    them in float32); cos 1 and sin 0 at every position without one (no positional encoding). The positions are the
    ones the framework passes, so a framework that hands a piece of the sequence the wrong positions is seen."""

    def __init__(self, head_dim, base=None):
        super().__init__()
        self.head_dim, self.base = head_dim, base

    def forward(self, x, position_ids):
        if self.base is None:
            shape = (position_ids.shape[0], position_ids.shape[1], self.head_dim)
            return torch.ones(shape, dtype=x.dtype), torch.zeros(shape, dtype=x.dtype)
        return rotary_cos_sin(position_ids, self.head_dim, self.base, x.dtype)


def rotation(m):
    """The rotary embedding module of the case's model (identity without `model.rotary_base`)."""
    return Rotation(m["hidden"] // m["heads"], m.get("rotary_base"))


def architecture(m):
    """The transformers class that realises the case (`model.hf_model`): a Llama unless the case names another."""
    return m.get("hf_model") or "llama"


def other_model(arch, m, dtype):
    """A Mistral or a Qwen2 of the case: the Llama's layers under other classes, whose shardformer policies and forwards
    are their own (Qwen2's q/k/v biases, which the case's model lacks, are built zero and frozen: `is_extra`)."""
    import transformers

    options = {k: v for k, v in config(m, dtype).items() if k not in ("attention_bias", "mlp_bias", "head_dim")}
    if arch == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**options, head_dim=m["hidden"] // m["heads"],
                                                                          sliding_window=None))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**options, use_sliding_window=False))


def is_extra(name, m):
    """A parameter the case's model lacks: a Qwen2's q/k/v biases (built zero and frozen)."""
    return architecture(m) == "qwen2" and bool(re.match(r"^model\.layers\.\d+\.self_attn\.[qkv]_proj\.bias$", name))


def build(m, inputs, dtype):
    """The Llama (or the case's `hf_model`) of the case with its initial parameters, in `dtype`."""
    arch = architecture(m)
    model = (colossalai_release.llama_model(**config(m, dtype)) if arch == "llama" else other_model(arch, m, dtype)).to(dtype)
    colossalai_release.replace_llama_rotary_embedding(model, lambda: rotation(m))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_extra(name, m):
                p.zero_()
                p.requires_grad_(False)
                continue
            p.copy_(to_llama(case_name(name), torch.tensor(inputs[case_name(name)])).to(dtype))
    return model


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm|self_attn|mlp)(?:\.(\w+)_proj)?\.(weight|bias)$")


def case_name(name):
    """Llama's parameter name -> the case's."""
    fixed = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "final_norm.weight",
             "lm_head.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    match = _LAYER.match(name)
    if not match:
        raise KeyError(f"harness: no case name for Llama parameter {name}")
    i, part, proj, leaf = int(match[1]), match[2], match[3], match[4]
    if part == "input_layernorm":
        return f"layers.{2 * i}.norm.{leaf}"
    if part == "post_attention_layernorm":
        return f"layers.{2 * i + 1}.norm.{leaf}"
    if part == "self_attn":
        return f"layers.{2 * i}.attn.{proj}.{leaf}"
    return f"layers.{2 * i + 1}.mlp.{proj}.{leaf}"


def is_projection_weight(case):
    return case.endswith(".weight") and (".attn." in case or ".mlp." in case)


def to_llama(case, t):
    """A case-layout tensor in Llama's layout (linear weights [out, in])."""
    return t.t() if is_projection_weight(case) else t


def to_case(case, t):
    return t.t() if is_projection_weight(case) else t


def case_tensors(name, t, m):
    """Llama's parameter (or its gradient, or a tensor-parallel rank's shard of either) -> [(case name, tensor in the
    case's layout)]; none for a Qwen2's frozen q/k/v biases."""
    if is_extra(name, m):
        return []
    case = case_name(name)
    return [(case, to_case(case, t))]


def shardformer_loss(m, plugin):
    """Whether the model's loss is shardformer's (`dist_cross_entropy`): each policy replaces the causal LM's forward
    under pipeline parallelism; without a pipeline, Llama's under tensor or sequence parallelism, Qwen2's under tensor
    parallelism and Mistral's under tensor parallelism with parallel_output (policies/qwen2.py:421-447,
    mistral.py:360-381); elsewhere transformers' own forward computes it (a rank's own mean)."""
    config = plugin.shard_config
    if plugin.stage_manager is not None:
        return True
    arch = architecture(m)
    if arch == "qwen2":
        return config.enable_tensor_parallelism
    if arch == "mistral":
        return config.enable_tensor_parallelism and config.parallel_output
    return config.enable_tensor_parallelism or config.enable_sequence_parallelism
