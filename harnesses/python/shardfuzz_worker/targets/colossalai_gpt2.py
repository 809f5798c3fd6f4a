"""The case's model as a `transformers` GPT-2 (no weights downloaded: built from a GPT2Config sized by the case,
its parameters the case's), and the translation between the case's parameter names and GPT-2's.

A GPT-2 block is the case's ("attention", "mlp") pair: ln_1 + attn (q, k and v fused in one Conv1D, c_attn),
then ln_2 + mlp (c_fc, tanh GELU, c_proj); LayerNorm (eps 1e-5) with bias, biases in every projection, as many
key/value heads as query heads, attention scale head_dim^-0.5. GPT-2's Conv1D weights are [in, out], the case's
layout. The case's model has no positional encoding: the position table (wpe) is zero and frozen, so the rest is
GPT-2's own computation.
"""

import re

import torch

NORM_EPS = 1e-5
POSITIONS = "transformer.wpe.weight"


def expressible(m):
    """Why the case's model is not a GPT-2, or None."""
    kinds = list(m["layers"])
    if len(kinds) % 2 or kinds != ["attention", "mlp"] * (len(kinds) // 2):
        return "a GPT-2 model is (attention, mlp) layer pairs"
    if m.get("norm", "layernorm") != "layernorm":
        return "a GPT-2 model normalises with LayerNorm (the case uses RMSNorm)"
    if m.get("activation", "gelu") != "gelu":
        return "a GPT-2 MLP is GELU (the case uses SwiGLU)"
    if not m["bias"]:
        return "GPT-2's projections and norms have biases (the case has none)"
    if m.get("rotary_base") is not None:
        return "GPT-2 encodes positions with a learned table, not a rotary embedding (the case's model.rotary_base)"
    if m["kv_heads"] != m["heads"] or m["hidden"] % m["heads"]:
        return "GPT-2 attention has as many key/value heads as query heads, hidden / heads wide"
    return None


def config(m, dtype):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=m["vocab"], n_positions=m["seq"], n_embd=m["hidden"], n_layer=len(m["layers"]) // 2,
        n_head=m["heads"], n_inner=m["ffn"], activation_function="gelu_pytorch_tanh", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=NORM_EPS, tie_word_embeddings=bool(m.get("tied_embeddings")),
        scale_attn_weights=True, use_cache=False, torch_dtype=dtype, bos_token_id=None, eos_token_id=None,
        _attn_implementation="eager",
    )


def build(m, inputs, dtype):
    """The GPT-2 of the case with its initial parameters, in `dtype` (the position table zero and frozen)."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config(m, dtype)).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == POSITIONS:
                p.zero_()
                p.requires_grad_(False)
                continue
            pieces = [torch.tensor(inputs[case]) for case, _ in case_tensors(name, p)]
            p.copy_(torch.cat(pieces, dim=-1).to(dtype))
    return model


_BLOCK = re.compile(r"^transformer\.h\.(\d+)\.(ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(weight|bias)$")
_PART = {"ln_1": (0, "norm"), "attn.c_proj": (0, "attn.o"), "ln_2": (1, "norm"), "mlp.c_fc": (1, "mlp.up"),
         "mlp.c_proj": (1, "mlp.down")}


def case_tensors(name, t, m=None):
    """GPT-2's parameter (or its gradient, or a tensor-parallel rank's shard of either) -> [(case name, tensor in the
    case's layout)]: c_attn's fused q, k, v are three (a rank's shard holds its q, k and v shards in that order); the
    position table, not a parameter of the case, is none."""
    fixed = {"transformer.wte.weight": "embed.weight", "transformer.ln_f.weight": "final_norm.weight",
             "transformer.ln_f.bias": "final_norm.bias", "lm_head.weight": "lm_head.weight"}
    if name == POSITIONS:
        return []
    if name in fixed:
        return [(fixed[name], t)]
    match = _BLOCK.match(name)
    if not match:
        raise KeyError(f"harness: no case name for GPT-2 parameter {name}")
    i, part, leaf = int(match[1]), match[2], match[3]
    if part == "attn.c_attn":
        return [(f"layers.{2 * i}.attn.{n}.{leaf}", piece) for n, piece in zip("qkv", torch.chunk(t, 3, dim=-1))]
    offset, case = _PART[part]
    return [(f"layers.{2 * i + offset}.{case}.{leaf}", t)]


def unfreezable(m, case):
    """Why the case's frozen parameters (`train.frozen`) cannot be expressed, or None: c_attn holds q, k and v of its
    attention layer in one parameter, which freezes as a whole."""
    from .base import is_frozen

    for j, kind in enumerate(m["layers"]):
        for leaf in ("weight", "bias"):
            if kind in ("attention", "parallel") and len({is_frozen(case, f"layers.{j}.attn.{n}.{leaf}") for n in "qkv"}) > 1:
                return f"GPT-2 holds layers.{j}'s q, k and v {leaf}s in one parameter (c_attn): they freeze together"
    return None


def shardformer_loss(m, plugin):
    """Whether the model's loss is shardformer's (`dist_cross_entropy`): GPT-2's policy replaces the forward under
    pipeline parallelism or with parallel_output, else transformers' own forward computes it."""
    return plugin.stage_manager is not None or plugin.shard_config.parallel_output
