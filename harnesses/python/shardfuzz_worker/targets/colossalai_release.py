"""What differs between Colossal-AI releases and the `transformers` releases they pin, in one place, so that the
colossalai targets run unchanged against an older Colossal-AI (`--python` pointing at another environment).

Colossal-AI options: one a release lacks is left out where the case asks for what the release did before the option
existed (its `OPTIONS_OFF` value); a case that needs it is `unsupported`, naming the release and the option. The
options a release has are read from its source, not from the imported callables: a known fix may have wrapped one
in a function taking `*args, **kwargs` (known_fixes.py does so for cross_entropy_1d). Measured against 0.5.0: 0.4.9 has them all; 0.4.6 lacks `LowLevelZeroPlugin.extra_dp_size`; 0.4.0
also lacks both plugins' `overlap_allgather` and `cross_entropy_1d`'s `mode` (always a mean).

transformers: 4.51.3 (0.5.0's pin) has everything below; 4.39.3 (the pin of 0.4.0 to 0.4.9) has no
`LlamaConfig.mlp_bias` (its MLP projections are bias-free) and no `LlamaConfig.head_dim` (always hidden / heads,
which the case model guarantees), and keeps Llama's rotary embedding in each attention layer
(`self_attn.rotary_emb`) instead of once in the model (`model.rotary_emb`)."""

import ast
import functools
import importlib.util
import inspect
import os

import torch

#: Options newer than some supported release: {callable: {option: the value that means "off"}}.
OPTIONS_OFF = {
    "HybridParallelPlugin": {"overlap_allgather": False},
    "MoeHybridParallelPlugin": {"overlap_allgather": False},
    "LowLevelZeroPlugin": {"extra_dp_size": 1, "overlap_allgather": False},
    "cross_entropy_1d": {"mode": "mean"},
}
#: Where each callable of OPTIONS_OFF is defined: (file under the colossalai package, class or None for a function).
DEFINED_IN = {
    "HybridParallelPlugin": ("booster/plugin/hybrid_parallel_plugin.py", "HybridParallelPlugin"),
    "MoeHybridParallelPlugin": ("booster/plugin/moe_hybrid_parallel_plugin.py", "MoeHybridParallelPlugin"),
    "LowLevelZeroPlugin": ("booster/plugin/low_level_zero_plugin.py", "LowLevelZeroPlugin"),
    "cross_entropy_1d": ("shardformer/layer/loss.py", None),
}


def installed_version():
    from importlib.metadata import version as installed

    return installed("colossalai")


@functools.lru_cache(maxsize=None)
def parameters(name):
    """The parameter names the installed release's `name` takes (a class: its __init__), read from its source."""
    path, cls = DEFINED_IN[name]
    spec = importlib.util.find_spec("colossalai")  # a top-level package: found, not imported
    with open(os.path.join(os.path.dirname(spec.origin), path)) as f:
        tree = ast.parse(f.read())
    if cls is not None:
        tree = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
        name = "__init__"
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    return frozenset(a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs)


def missing_options(name, kwargs):
    """The options of `kwargs` the installed release's `name` lacks and the case needs ({option: value})."""
    have, off = parameters(name), OPTIONS_OFF.get(name, {})
    return {k: v for k, v in kwargs.items() if k not in have and not (k in off and off[k] == v)}


def unsupported_options(name, kwargs):
    """Why the installed release cannot run a case whose `name` takes `kwargs` (None: it can)."""
    needed = missing_options(name, kwargs)
    if not needed:
        return None
    option, value = next(iter(needed.items()))
    return f"Colossal-AI {installed_version()} has no {name}({option}=...) (the case needs {value!r})"


def options(name, kwargs):
    """`kwargs` for the installed release's `name`: options it lacks left out where they are off. One it lacks and
    the case needs reaching here is our error (a harness error): `unsupported_options` refuses such cases first."""
    needed = missing_options(name, kwargs)
    if needed:
        raise TypeError(f"Colossal-AI {installed_version()} has no {name}({next(iter(needed))}=...); "
                        "the case was not refused")
    have = parameters(name)
    return {k: v for k, v in kwargs.items() if k in have}


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

    accepted = llama_options()
    assert "head_dim" in accepted or kwargs["hidden_size"] % kwargs["num_attention_heads"] == 0, kwargs
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in kwargs.items()
                                            if k in accepted or k not in LLAMA_NEWER_OPTIONS}))
    if kwargs.get("mlp_bias") and "mlp_bias" not in accepted:
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
