"""Targets by name: one module each, one line here."""

import importlib

REGISTRY = {
    "torch-dtensor": "torch_dtensor",
    "torch-tp": "torch_tp",
    "torch-fsdp2": "torch_fsdp2",
    "torch-ddp": "torch_ddp",
    "torch-fsdp1": "torch_fsdp1",
    "torch-pp": "torch_pp",
    "jax-shardmap": "jax_shardmap",
    "jax-gspmd": "jax_gspmd",
    "deepspeed-zero": "deepspeed_zero",
    "deepspeed-pp": "deepspeed_pp",
    "megatron-tp": "megatron_tp",
    "megatron-ddp": "megatron_ddp",
    "colossalai-tp": "colossalai_tp",
    "colossalai-zero": "colossalai_zero",
    "colossalai-hybrid": "colossalai_hybrid",
    "colossalai-moe": "colossalai_moe",
}


def load(name):
    if name not in REGISTRY:
        raise KeyError(f"unknown target {name!r} (known: {', '.join(sorted(REGISTRY))})")
    module = importlib.import_module(f".{REGISTRY[name]}", __name__)
    return module.TARGET
