"""The case's model as a `transformers` Cohere Command (`model.hf_model: command`; no weights downloaded: built from a
CohereConfig sized by the case, its parameters the case's), and the translation between the case's parameter names
and layouts and Cohere's.

A Cohere decoder layer is the case's "parallel" block: one LayerNorm without bias (input_layernorm, eps 1e-5) whose
output feeds both self_attn (q, k, v, o; GQA; scale head_dim^-0.5) and the MLP (gate/up/down with SiLU: the case's
swiglu), both added to the residual stream; no biases anywhere, a final LayerNorm (model.norm), the logits times
`logit_scale` (1 here); with `model.qk_norm` Cohere's q_norm / k_norm (`use_qk_norm`: a LayerNorm without bias over
each head, weights [heads, head_dim], the case's [heads * head_dim]). Cohere's rotary embedding turns interleaved pairs (dimensions 2i and 2i + 1 by the angle of
frequency i) where the case's turns halves (i and i + head_dim / 2): the same attention scores once the q and k
projections' output columns are permuted head by head, interleaved position 2i taking the case's column i and 2i + 1
its column i + head_dim / 2 (`_interleaved`), as transformers' Llama conversion permutes Meta's checkpoints. The
angles are the case's (`model.rotary_base`) in float64, at the positions Colossal-AI's forwards pass (`Rotation`).
"""

import re

import torch

from .colossalai_llama import is_projection_weight
from .torch_model import rotary_cos_sin

NORM_EPS = 1e-5


def expressible(m):
    """Why the case's model is not a Command, or None."""
    if not m["layers"] or any(kind != "parallel" for kind in m["layers"]):
        return "a Command model is parallel blocks (model.layers all \"parallel\")"
    if m.get("rotary_base") is None:
        return "Command encodes positions by a rotary embedding: the case has no model.rotary_base"
    if m.get("norm", "layernorm") != "layernorm":
        return "a Command model normalises with LayerNorm (the case uses RMSNorm)"
    if m.get("activation", "gelu") != "swiglu":
        return "a Command MLP is SwiGLU (the case uses GELU)"
    if m["bias"]:
        return "a Command model has no biases (its MLP and norms have none; the case's model.bias)"
    return None


def config(m, dtype):
    from transformers import CohereConfig

    return CohereConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"], num_hidden_layers=len(m["layers"]),
        num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"], hidden_act="silu",
        max_position_embeddings=max(m["seq"], 2), layer_norm_eps=NORM_EPS, logit_scale=1.0,
        use_qk_norm=bool(m.get("qk_norm")),
        attention_bias=False, attention_dropout=0.0, rope_theta=float(m["rotary_base"]), use_cache=False,
        tie_word_embeddings=bool(m.get("tied_embeddings")), torch_dtype=dtype, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, _attn_implementation="eager",
    )


class Rotation(torch.nn.Module):
    """In place of CohereRotaryEmbedding (same call: the (cos, sin) of `position_ids`, in `x`'s dtype, each angle on
    two neighbouring dimensions): the case's rotary embedding with angles in float64 (transformers computes them in
    float32), at the positions the framework passes."""

    def __init__(self, head_dim, base):
        super().__init__()
        self.head_dim, self.base = head_dim, base

    def forward(self, x, position_ids):
        cos, sin = rotary_cos_sin(position_ids, self.head_dim, self.base, torch.float64)
        half = self.head_dim // 2
        return (cos[..., :half].repeat_interleave(2, dim=-1).to(x.dtype),
                sin[..., :half].repeat_interleave(2, dim=-1).to(x.dtype))


def build(m, inputs, dtype):
    """The Command of the case with its initial parameters and rotary embedding, in `dtype`."""
    from transformers import CohereForCausalLM

    model = CohereForCausalLM(config(m, dtype)).to(dtype)
    model.model.rotary_emb = Rotation(m["hidden"] // m["heads"], m["rotary_base"])
    d = m["hidden"] // m["heads"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            case = case_name(name)
            p.copy_(to_command(case, torch.tensor(inputs[case]), d).to(dtype))
    return model


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(input_layernorm|self_attn\.(\w)_proj|mlp\.(\w+)_proj|self_attn\.(\w)_norm)"
                    r"\.weight$")
_FIXED = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "final_norm.weight",
          "lm_head.weight": "lm_head.weight"}


def case_name(name):
    """Cohere's parameter name -> the case's."""
    if name in _FIXED:
        return _FIXED[name]
    match = _LAYER.match(name)
    if not match:
        raise KeyError(f"harness: no case name for Command parameter {name}")
    i, attn, mlp, norm = int(match[1]), match[3], match[4], match[5]
    if norm:
        return f"layers.{i}.attn.{norm}_norm.weight"
    if attn:
        return f"layers.{i}.attn.{attn}.weight"
    if mlp:
        return f"layers.{i}.mlp.{mlp}.weight"
    return f"layers.{i}.norm.weight"


def _interleaved(rows, d):
    """The row order that turns a q or k projection's rows (whole heads of `d`) from the case's half-split pairs to
    Cohere's interleaved ones: row h*d + 2i takes row h*d + i, row h*d + 2i + 1 takes row h*d + i + d/2."""
    within = [j // 2 + (d // 2) * (j % 2) for j in range(d)]
    return torch.tensor([h * d + j for h in range(rows // d) for j in within])


def _turns(case):
    """Whether the case tensor's elements turn with the rotary embedding's pairs (q and k projections, their norms)."""
    return bool(re.match(r"^layers\.\d+\.attn\.[qk](_norm)?\.weight$", case))


def _is_head_norm(case):
    return bool(re.match(r"^layers\.\d+\.attn\.[qk]_norm\.weight$", case))


def to_command(case, t, d):
    """A case-layout tensor in Cohere's layout (linear weights [out, in], q and k rows interleaved)."""
    t = t.t() if is_projection_weight(case) else t
    t = t[_interleaved(t.shape[0], d)] if _turns(case) else t
    return t.reshape(-1, d) if _is_head_norm(case) else t  # (Cohere's norm weights: [heads, head_dim])


def case_tensors(name, t, m):
    """Cohere's parameter (or its gradient, or a tensor-parallel rank's shard of either: whole heads) -> [(case name,
    tensor in the case's layout)]."""
    case = case_name(name)
    if _is_head_norm(case):
        t = t.reshape(-1)
    if _turns(case):
        d = m["hidden"] // m["heads"]
        t = t[torch.argsort(_interleaved(t.shape[0], d))]
    return [(case, t.t() if is_projection_weight(case) else t)]


def shardformer_loss(m, plugin):
    """Whether the model's loss is shardformer's (`dist_cross_entropy`): Command's policy replaces the forward under
    pipeline parallelism, and under tensor parallelism with parallel_output; else transformers' own forward computes
    it."""
    config = plugin.shard_config
    return plugin.stage_manager is not None or (config.enable_tensor_parallelism and config.parallel_output)
