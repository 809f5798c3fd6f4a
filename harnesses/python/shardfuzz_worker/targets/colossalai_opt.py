"""The case's model as a `transformers` OPT (`model.hf_model: opt`; no weights downloaded: built from an OPTConfig
sized by the case, its parameters the case's), and the translation between the case's parameter names and OPT's.

OPT's decoder layer, with the layer norm before each sublayer (OPT's `do_layer_norm_before`, every size but 350m), is
the GPT-2 family's math: the case's ("attention", "mlp") pair of self_attn_layer_norm + self_attn (separate q, k,
v and out projections with biases) and final_layer_norm + fc1, tanh GELU, fc2, LayerNorm with bias (torch's default
eps 1e-5, which OPT keeps), a final LayerNorm, an LM head without bias, attention scale head_dim^-0.5. Linear weights
are [out, in] (the case's are [in, out]). The case's model has no positional encoding: the learned position table is zero and frozen, and no
token is a padding index (OPT's embedding zeroes the padding row's gradient), so the rest is OPT's own computation.
"""

import re

import torch

from . import colossalai_gpt2
from .colossalai_llama import is_projection_weight

POSITIONS = "model.decoder.embed_positions.weight"


def expressible(m):
    """Why the case's model is not an OPT, or None: the GPT-2 family's conditions (OPT has the same math)."""
    why = colossalai_gpt2.expressible(m)
    return why.replace("GPT-2", "OPT") if why else None


def config(m, dtype):
    from transformers import OPTConfig

    return OPTConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"], num_hidden_layers=len(m["layers"]) // 2, ffn_dim=m["ffn"],
        max_position_embeddings=m["seq"], do_layer_norm_before=True, word_embed_proj_dim=m["hidden"],
        num_attention_heads=m["heads"], activation_function="gelu_pytorch_tanh", dropout=0.0, attention_dropout=0.0,
        layerdrop=0.0, enable_bias=True, layer_norm_elementwise_affine=True, use_cache=False, torch_dtype=dtype,
        tie_word_embeddings=bool(m.get("tied_embeddings")), pad_token_id=None, bos_token_id=None, eos_token_id=None,
        _attn_implementation="eager",
    )


def build(m, inputs, dtype):
    """The OPT of the case with its initial parameters, in `dtype` (the position table zero and frozen)."""
    from transformers import OPTForCausalLM

    model = OPTForCausalLM(config(m, dtype)).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == POSITIONS:
                p.zero_()
                p.requires_grad_(False)
                continue
            case = case_name(name)
            p.copy_(to_opt(case, torch.tensor(inputs[case])).to(dtype))
    return model


_LAYER = re.compile(r"^model\.decoder\.layers\.(\d+)\.(self_attn_layer_norm|final_layer_norm|self_attn\.(?:q|k|v|out)_proj"
                    r"|fc1|fc2)\.(weight|bias)$")
_PART = {"self_attn_layer_norm": (0, "norm"), "self_attn.q_proj": (0, "attn.q"), "self_attn.k_proj": (0, "attn.k"),
         "self_attn.v_proj": (0, "attn.v"), "self_attn.out_proj": (0, "attn.o"), "final_layer_norm": (1, "norm"),
         "fc1": (1, "mlp.up"), "fc2": (1, "mlp.down")}


def case_name(name):
    """OPT's parameter name -> the case's."""
    fixed = {"model.decoder.embed_tokens.weight": "embed.weight", "model.decoder.final_layer_norm.weight":
             "final_norm.weight", "model.decoder.final_layer_norm.bias": "final_norm.bias", "lm_head.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    match = _LAYER.match(name)
    if not match:
        raise KeyError(f"harness: no case name for OPT parameter {name}")
    offset, part = _PART[match[2]]
    return f"layers.{2 * int(match[1]) + offset}.{part}.{match[3]}"


def to_opt(case, t):
    """A case-layout tensor in OPT's layout (linear weights [out, in])."""
    return t.t() if is_projection_weight(case) else t


def case_tensors(name, t, m=None):
    """OPT's parameter (or its gradient, or a tensor-parallel rank's shard of either) -> [(case name, tensor in the
    case's layout)]; the position table, not a parameter of the case, is none."""
    if name == POSITIONS:
        return []
    case = case_name(name)
    return [(case, to_opt(case, t))]


def shardformer_loss(m, plugin):
    """Whether the model's loss is shardformer's (`dist_cross_entropy`): OPT's policy replaces the forward under
    pipeline parallelism, and under tensor parallelism with parallel_output; else transformers' own forward computes
    it."""
    config = plugin.shard_config
    return plugin.stage_manager is not None or (config.enable_tensor_parallelism and config.parallel_output)
