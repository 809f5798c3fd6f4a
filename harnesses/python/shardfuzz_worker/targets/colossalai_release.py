"""What differs between the `transformers` releases colossalai-hybrid builds its models with, in one place, so that
the target runs unchanged against an older Colossal-AI (`--python` pointing at another environment; each Colossal-AI
release pins its own transformers). Measured: transformers 4.51.3 (Colossal-AI 0.5.0's pin) has everything below;
4.39.3 (Colossal-AI 0.4.9's) has no `LlamaConfig.mlp_bias` (its MLP projections are bias-free) and no
`LlamaConfig.head_dim` (always hidden / heads, which the case model guarantees), and keeps Llama's rotary embedding
in each attention layer (`self_attn.rotary_emb`) instead of once in the model (`model.rotary_emb`)."""

import inspect

import torch

#: LlamaConfig options some supported transformers release lacks; the model is built without them and completed.
LLAMA_NEWER_OPTIONS = ("head_dim", "mlp_bias")


def llama_options():
    """The options the installed release's LlamaConfig takes."""
    from transformers import LlamaConfig

    return set(inspect.signature(LlamaConfig.__init__).parameters)


def llama_model(**kwargs):
    """The installed release's LlamaForCausalLM with the LlamaConfig of `kwargs`: where the release lacks `head_dim`
    it is hidden / heads already; where it lacks `mlp_bias`, the MLP projections are rebuilt with biases as later
    releases build them (`nn.Linear(..., bias=config.mlp_bias)`) when the case asks for them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    options = llama_options()
    assert "head_dim" in options or kwargs["hidden_size"] % kwargs["num_attention_heads"] == 0, kwargs
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in kwargs.items()
                                            if k in options or k not in LLAMA_NEWER_OPTIONS}))
    if kwargs.get("mlp_bias") and "mlp_bias" not in options:
        for layer in model.model.layers:
            for name in ("gate_proj", "up_proj", "down_proj"):
                old = getattr(layer.mlp, name)
                setattr(layer.mlp, name, torch.nn.Linear(old.in_features, old.out_features, bias=True,
                                                         dtype=old.weight.dtype))
    return model


def replace_llama_rotary_embedding(model, make):
    """Put `make()` in place of the Llama's rotary embedding wherever the installed release keeps it: once in the
    model (4.48+), or in every attention layer (older)."""
    if hasattr(model.model, "rotary_emb"):
        model.model.rotary_emb = make()
        return
    for layer in model.model.layers:
        assert hasattr(layer.self_attn, "rotary_emb"), "harness: no rotary embedding in this transformers' Llama"
        layer.self_attn.rotary_emb = make()
