"""The case's MoE model as a `transformers` Mixtral (no weights downloaded: built from a MixtralConfig sized by the
case, its parameters the case's), and the translation between the case's parameter names and layouts and Mixtral's.

A Mixtral decoder layer is the case's ("attention", "moe") pair: input_layernorm + self_attn (as the Llama's:
colossalai_llama.py), then post_attention_layernorm + block_sparse_moe: a router without bias (`gate`), a softmax over
every expert in float32, each token's top-k experts, their probabilities divided by their sum (the case's
`renormalize`), no capacity (dropless: the case's capacity must hold every token), each expert a SwiGLU MLP (`w1` the
gate projection, `w3` the up one, `w2` the down one) without biases, no auxiliary loss in the gradients
(`output_router_logits` off). The rotary embedding is the case's (or the identity), as for the Llama.

The case holds every expert's weight stacked (`layers.N.moe.{gate,up,down}.weight`, [experts, in, out]); Mixtral holds
one linear per expert. Each expert's tensor is reported under `<case name>#e<expert>` (`expert_part`), and
colossalai_hybrid_run.combine stacks the parts (`stack_experts`): under expert parallelism a rank holds its own
experts only."""

import re

import torch

from .colossalai_llama import NORM_EPS, case_name as llama_case_name, is_projection_weight, rotation

EXPERT = "#e"
_PROJ = {"w1": "gate", "w3": "up", "w2": "down"}
_MOE_LAYER = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.(?:gate|experts\.(\d+)\.(w1|w2|w3))\.weight$")


def expressible(m):
    """Why the case's model is not a Mixtral, or None."""
    kinds = list(m["layers"])
    if len(kinds) % 2 or kinds != ["attention", "moe"] * (len(kinds) // 2):
        return "a Mixtral model is (attention, moe) layer pairs"
    if m.get("norm", "layernorm") != "rmsnorm" or m.get("activation", "gelu") != "swiglu":
        return "a Mixtral model normalises with RMSNorm and its experts are SwiGLU"
    if m["bias"]:
        return "a Mixtral model has no biases"
    moe = m["moe"]
    if not moe.get("renormalize"):
        return "Mixtral divides each token's gates by their sum (the case's moe.renormalize)"
    if moe.get("aux_loss") or moe.get("shared_ffn") or moe.get("pad_to_capacity"):
        return "a Mixtral model has no auxiliary loss in its gradients, no shared expert and no capacity padding"
    if moe["capacity_factor"] * moe["top_k"] < moe["experts"]:
        return "Mixtral drops no token (the case's capacity_factor x top_k is below its experts: tokens would drop)"
    return None


def build(m, inputs, dtype):
    """The Mixtral of the case with its initial parameters, in `dtype`."""
    from transformers import MixtralConfig, MixtralForCausalLM

    moe = m["moe"]
    config = MixtralConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
        num_hidden_layers=len(m["layers"]) // 2, num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
        head_dim=m["hidden"] // m["heads"], rms_norm_eps=NORM_EPS,
        tie_word_embeddings=bool(m.get("tied_embeddings")), hidden_act="silu", attention_dropout=0.0,
        num_local_experts=moe["experts"], num_experts_per_tok=moe["top_k"], output_router_logits=False,
        router_aux_loss_coef=0.0, router_jitter_noise=0.0, sliding_window=None, torch_dtype=dtype,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, _attn_implementation="eager")
    model = MixtralForCausalLM(config).to(dtype)
    model.model.rotary_emb = rotation(m)
    with torch.no_grad():
        for name, p in model.named_parameters():
            case, expert = split(case_name(name))
            t = torch.tensor(inputs[case])
            p.copy_(to_mixtral(name, t if expert is None else t[expert]).to(dtype))
    return model


def split(name):
    """(case name, expert index or None) of a reported name."""
    if EXPERT in name:
        case, e = name.split(EXPERT)
        return case, int(e)
    return name, None


def expert_part(case, expert):
    return f"{case}{EXPERT}{expert}"


def case_name(name):
    """Mixtral's parameter name -> the case's (an expert's weight: its part of the stacked case tensor)."""
    match = _MOE_LAYER.match(name)
    if match is None:
        if ".block_sparse_moe." in name:
            raise KeyError(f"harness: no case name for Mixtral parameter {name}")
        return llama_case_name(name)
    i, expert, proj = int(match[1]), match[2], match[3]
    if expert is None:
        return f"layers.{2 * i + 1}.moe.router.weight"
    return expert_part(f"layers.{2 * i + 1}.moe.{_PROJ[proj]}.weight", int(expert))


def is_weight_matrix(name):
    return ".block_sparse_moe." in name or is_projection_weight(llama_case_name(name))


def to_mixtral(name, t):
    """A case-layout tensor (an expert's part of a stacked one) in Mixtral's layout (linear weights [out, in])."""
    return t.t() if is_weight_matrix(name) else t


def case_tensors(name, t, m=None):
    """Mixtral's parameter (or its gradient) -> [(reported case name, tensor in the case's layout)]."""
    return [(case_name(name), t.t() if is_weight_matrix(name) else t)]


def shardformer_loss(m, plugin):
    """Whether the model's loss is shardformer's: Mixtral's policy replaces the causal LM's forward under pipeline
    parallelism only (under tensor or sequence parallelism transformers' forward computes the loss, a mean over the
    rank's own batch)."""
    return plugin.stage_manager is not None


def unsteppable_unused_experts(case):
    """Why an expert without a gradient could be stepped differently from the reference (see the module), or None:
    then each run watches its routing (colossalai_mixtral.RoutingWatch) and is unsupported where it happened."""
    o = case["train"]["optimizer"]
    if o.get("weight_decay"):
        return "torch's optimizer does not step, where the reference applies its weight decay"
    if o["kind"] == "sgd" and not o.get("momentum"):
        return None
    if o["kind"] != "sgd" and case["train"]["steps"] == 1:
        return None  # (Adam's first step moves nothing whose gradient is zero)
    return "torch's optimizer does not step, where the reference applies its momentum (or Adam's step count)"


class RoutingWatch:
    """Counts, on this rank, the tokens each expert of each MoE block is routed in a step (a hook on the router's
    output, top-k as the block takes it), so that `idle()` can tell, over every rank, whether some expert got none:
    torch's optimizers then do not step it, where the reference steps every parameter. Layers are indexed by the
    model's full layer list, so every rank (every pipeline stage) reduces the same vector."""

    def __init__(self, model):
        import torch

        config = model.config
        self.counts = torch.zeros(config.num_hidden_layers, config.num_local_experts, dtype=torch.float64)
        for name, module in model.named_modules():
            if hasattr(module, "gate") and hasattr(module, "experts") and ".layers." in f".{name}":
                layer = int(name.split("layers.")[1].split(".")[0])
                module.gate.register_forward_hook(self._hook(layer, module.top_k))

    def _hook(self, layer, top_k):
        def count(_module, _inputs, logits):
            import torch

            chosen = torch.topk(logits.detach().float(), top_k, dim=-1).indices.reshape(-1)
            self.counts[layer] += torch.bincount(chosen, minlength=self.counts.shape[1]).to(self.counts.dtype)

        return count

    def idle(self):
        """Whether some expert got no token on any rank since the last call (a collective over every rank)."""
        import torch.distributed as dist

        counts, self.counts = self.counts, self.counts.new_zeros(self.counts.shape)
        dist.all_reduce(counts)
        return bool((counts == 0).any())
