"""The case's model as a `transformers` Falcon (`model.hf_model: falcon`; no weights downloaded: built from a
FalconConfig sized by the case, its parameters the case's), and the translation between the case's parameter names and
layouts and Falcon's.

A Falcon decoder layer with `new_decoder_architecture` and `parallel_attn` off is the case's ("attention", "mlp") pair with the GPT-2 family's math and a rotary embedding:
input_layernorm + self_attention (q, k and v fused in one projection, `query_key_value`, head by head: each head's q,
k and v rows in turn; dense), post_attention_layernorm + mlp (dense_h_to_4h, tanh GELU, dense_4h_to_h); LayerNorm
(eps 1e-5) with bias, biases in every projection, as many key/value heads as query heads, attention scale
head_dim^-0.5, a final LayerNorm (ln_f), an LM head without bias. Falcon encodes positions only by its rotary
embedding (or ALiBi, not used), so only cases with one (`model.rotary_base`): the embedding is the case's
(colossalai_llama.Rotation, in place of Falcon's, the positions the ones Colossal-AI's forwards pass). With
`parallel_attn` on (Falcon-7B's layout) a decoder layer is the case's "parallel" block: input_layernorm feeding both
self_attention and the MLP, both added to the residual stream (no post_attention_layernorm).
"""

import re

import torch

from . import colossalai_gpt2
from .colossalai_llama import is_projection_weight, rotation

NORM_EPS = 1e-5


def expressible(m):
    """Why the case's model is not a Falcon, or None: the GPT-2 family's conditions with a rotary embedding, in
    (attention, mlp) pairs or parallel blocks (`parallel_attn`)."""
    if m.get("rotary_base") is None:
        return "Falcon encodes positions by a rotary embedding (or ALiBi): the case has no model.rotary_base"
    pairs = ["attention", "mlp"] * len(m["layers"]) if parallel_attn(m) else m["layers"]
    why = colossalai_gpt2.expressible({**m, "rotary_base": None, "layers": pairs})
    return why.replace("GPT-2", "Falcon").replace("layer pairs", "layer pairs or parallel blocks") if why else None


def parallel_attn(m):
    """Whether the case's layers are parallel blocks (Falcon's `parallel_attn`)."""
    return bool(m["layers"]) and all(kind == "parallel" for kind in m["layers"])


def _case_layer(m, i, offset):
    """The case's layer of Falcon decoder layer `i`'s attention (offset 0) or MLP (offset 1) part."""
    return i if parallel_attn(m) else 2 * i + offset


def config(m, dtype):
    from transformers import FalconConfig

    return FalconConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"],
        num_hidden_layers=len(m["layers"]) if parallel_attn(m) else len(m["layers"]) // 2,
        num_attention_heads=m["heads"], num_kv_heads=m["heads"], ffn_hidden_size=m["ffn"],
        activation="gelu_pytorch_tanh", layer_norm_epsilon=NORM_EPS, hidden_dropout=0.0, attention_dropout=0.0,
        alibi=False, new_decoder_architecture=False, multi_query=False, parallel_attn=parallel_attn(m), bias=True,
        rope_theta=float(m["rotary_base"]), max_position_embeddings=max(m["seq"], 2), use_cache=False,
        tie_word_embeddings=bool(m.get("tied_embeddings")), torch_dtype=dtype, bos_token_id=None, eos_token_id=None,
        _attn_implementation="eager",
    )


def build(m, inputs, dtype):
    """The Falcon of the case with its initial parameters and rotary embedding, in `dtype`."""
    from transformers import FalconForCausalLM

    model = FalconForCausalLM(config(m, dtype)).to(dtype)
    model.transformer.rotary_emb = rotation(m)
    d = m["hidden"] // m["heads"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            pieces = {case: torch.tensor(inputs[case]) for case, _ in case_tensors(name, p, m)}
            p.copy_(to_falcon(name, pieces, d).to(dtype))
    return model


_LAYER = re.compile(r"^transformer\.h\.(\d+)\.(input_layernorm|post_attention_layernorm|self_attention\.query_key_value"
                    r"|self_attention\.dense|mlp\.dense_h_to_4h|mlp\.dense_4h_to_h)\.(weight|bias)$")
_PART = {"input_layernorm": (0, "norm"), "self_attention.dense": (0, "attn.o"), "post_attention_layernorm": (1, "norm"),
         "mlp.dense_h_to_4h": (1, "mlp.up"), "mlp.dense_4h_to_h": (1, "mlp.down")}
_FIXED = {"transformer.word_embeddings.weight": "embed.weight", "transformer.ln_f.weight": "final_norm.weight",
          "transformer.ln_f.bias": "final_norm.bias", "lm_head.weight": "lm_head.weight"}


def case_tensors(name, t, m):
    """Falcon's parameter (or its gradient, or a tensor-parallel rank's shard of either) -> [(case name, tensor in the
    case's layout)]: query_key_value's fused q, k, v are three (a rank's shard holds whole heads, each head's q, k and
    v rows in turn, so its q, k and v shards are its heads' rows of each)."""
    if name in _FIXED:
        return [(_FIXED[name], t)]
    match = _LAYER.match(name)
    if not match:
        raise KeyError(f"harness: no case name for Falcon parameter {name}")
    i, part, leaf = int(match[1]), match[2], match[3]
    if part == "self_attention.query_key_value":
        d = m["hidden"] // m["heads"]
        heads = t.shape[0] // (3 * d)
        split = t.reshape(heads, 3, d, *t.shape[1:])
        pieces = [split[:, j].reshape(heads * d, *t.shape[1:]) for j in range(3)]
        return [(f"layers.{_case_layer(m, i, 0)}.attn.{n}.{leaf}", piece.t() if leaf == "weight" else piece)
                for n, piece in zip("qkv", pieces)]
    offset, part_name = _PART[part]
    case = f"layers.{_case_layer(m, i, offset)}.{part_name}.{leaf}"
    return [(case, t.t() if is_projection_weight(case) else t)]


def to_falcon(name, pieces, d):
    """The case's tensors of one Falcon parameter (`pieces`, case name -> case layout) in Falcon's layout."""
    if ".query_key_value." in name:
        falcon = [t.t() if name.endswith(".weight") else t for t in pieces.values()]
        heads = falcon[0].shape[0] // d
        return torch.stack([t.reshape(heads, d, *t.shape[1:]) for t in falcon], dim=1).reshape(3 * heads * d,
                                                                                              *falcon[0].shape[1:])
    (case, t), = pieces.items()
    return t.t() if is_projection_weight(case) else t


def unfreezable(m, case):
    """Why the case's frozen parameters cannot be expressed, or None: query_key_value holds q, k and v together."""
    why = colossalai_gpt2.unfreezable(m, case)
    return why.replace("GPT-2", "Falcon").replace("(c_attn)", "(query_key_value)") if why else None


def shardformer_loss(m, plugin):
    """Whether the model's loss is shardformer's (`dist_cross_entropy`): Falcon's policy replaces the forward under
    pipeline parallelism, and under tensor parallelism with parallel_output; else transformers' own forward computes
    it."""
    config = plugin.shard_config
    return plugin.stage_manager is not None or (config.enable_tensor_parallelism and config.parallel_output)
