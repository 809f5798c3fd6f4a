"""Standalone repro scripts for a finding: the case's sharded run and a single-device float64 reference on the
exact inputs, compared with the fuzzer's statistics and noise bounds, in one file that needs only the framework
and numpy.

    python -m shardfuzz_worker.repro --target T --case CASE.json --inputs INPUTS.safetensors \\
        --bounds BOUNDS.json --out DIR

writes DIR/repro.py and prints the command that runs it. One module per target; `common` holds what they
share and `templates/` the code the scripts are assembled from.
"""

import importlib
import os

from .common import ReproError, load_bounds, split_bounds, with_known_fixes

GENERATORS = {
    "torch-dtensor": "torch_dtensor",
    "jax-gspmd": "jax_gspmd",
    "torch-tp": "torch_tp",
    "torch-fsdp2": "torch_fsdp2",
    "torch-ddp": "torch_ddp",
    "torch-fsdp1": "torch_fsdp1",
    "torch-pp": "torch_pp",
    "megatron-tp": "megatron_tp",
    "megatron-ddp": "megatron_ddp",
    "deepspeed-zero": "deepspeed_zero",
    "deepspeed-pp": "deepspeed_pp",
    "jax-shardmap": "jax_shardmap",
    "colossalai-tp": "colossalai_tp",
    "colossalai-zero": "colossalai_zero",
    "colossalai-hybrid": "colossalai_hybrid",
    "colossalai-moe": "colossalai_moe",
}


def generate(target, case, inputs, raw_bounds):
    """(script text, command) for one case; ReproError when the target or the case cannot be expressed."""
    if "library_op" in case and target in ("torch-dtensor", "jax-gspmd"):
        from . import jax_library_op, torch_library_op

        module = torch_library_op if target == "torch-dtensor" else jax_library_op
        module.check(case)
        bounds, dropped = split_bounds(load_bounds(raw_bounds), module.producible(case))
        text, command = module.generate(case, inputs, bounds, dropped)
        return with_known_fixes(target, text), command
    if target not in GENERATORS:
        raise ReproError(f"no repro generator for target {target!r} (supported: {', '.join(sorted(GENERATORS))})")
    module = importlib.import_module(f".{GENERATORS[target]}", __name__)
    module.check(case)
    bounds, dropped = split_bounds(load_bounds(raw_bounds), module.producible(case))
    text, command = module.generate(case, inputs, bounds, dropped)
    return with_known_fixes(target, text), command


def write(out_dir, text):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "repro.py")
    with open(path, "w") as f:
        f.write(text)
    return path
