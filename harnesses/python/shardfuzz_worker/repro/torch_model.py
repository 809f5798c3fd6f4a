"""What the generators of the torch model-case targets share: refusals, tensor names, the case's model and its
training loop taken from the worker, the header lines about the model, and the embedded inputs."""

from ..targets.base import (dtype_name, is_frozen, unsupported_frozen, unsupported_label_smoothing,
                            unsupported_model_vocabulary)
from .common import ReproError, rule, worker_source

TORCH_DTYPES = {"f64": "torch.float64", "f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16"}
MODEL_SOURCE = ("NORM_EPS", "Norm", "_POSITIONS", "positions_of", "rotary_cos_sin", "rotate", "Attention", "causal_attention", "Mlp", "Block", "Model", "block_sequence",
                "checkpointed_block", "is_linear_weight", "load_case_params", "freeze", "to_case_layout", "make_optimizer",
                "optimizer_parts", "IMPLEMENTATION_KWARGS", "rounds_in_parameter_dtype", "implementation_kwargs",
                "foreach_clip", "clip_norm_type")

IMPORTS = """
import base64
import contextlib
import contextvars
import functools
import gc
import io
import math
import os
import sys
import zlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
"""


def check_model_case(case, target, worker, fields):
    """ReproError unless the worker's target `worker` would run the case (`fields`: what its refusals are
    about) and its dtype has a torch dtype."""
    if "op" in case:
        raise ReproError(f"{target} runs model cases only (the case has case.op, not case.model)")
    why = (unsupported_frozen(worker, case) or unsupported_label_smoothing(worker, case)
           or unsupported_model_vocabulary(worker, case) or worker.unsupported(case))
    if why:
        raise ReproError(f"{target} cannot run this case ({fields}): {why}")
    if dtype_name(case) not in TORCH_DTYPES:
        raise ReproError(f"{target}: case.train.dtype {dtype_name(case)!r} has no torch dtype")


def param_names(case):
    """The model's parameter names (as the case and the fuzzer name them), from a model on the meta device."""
    import torch

    from ..targets.torch_model import Model, model_defaults

    with torch.device("meta"):
        return [n for n, _ in Model(model_defaults(case)).named_parameters()]


def producible(case):
    params = param_names(case)
    losses = [f"loss/step{k}" for k in range(case["train"]["steps"])]
    grads = {f"grad/{n}" for n in params if not is_frozen(case, n)}
    return {"logits", *losses, *grads} | {f"param/{n}" for n in params}


def model_about(case):
    """Header lines: the model, the training, what is compared."""
    from ..targets.torch_model import model_defaults

    m, t = model_defaults(case), case["train"]
    o = t["optimizer"]
    opt = ", ".join(f"{k}={v}" for k, v in o.items() if k != "kind")
    passes = f" run {m['layer_passes']} times (the same modules each pass)" if m.get("layer_passes", 1) > 1 else ""
    return [
        f"Model: vocab {m['vocab']}, hidden {m['hidden']}, ffn {m['ffn']}, heads {m['heads']} (kv {m['kv_heads']}),"
        f" layers {m['layers']}{passes}, {m['norm']}, {m['activation']}, bias {m['bias']};"
        f" batch {m['batch']} x seq {m['seq']}.",
        f"Training: {t['steps']} step(s) of {o['kind']} ({opt}), grad accumulation {t.get('grad_accumulation', 1)},"
        f" clip_grad_norm {t.get('clip_grad_norm')}; loss = token-mean cross-entropy.",
        "Compared: step-0 logits and gradients, every step's loss, final parameters (as BOUNDS lists them).",
    ]


def model_line(case):
    """`M = ...`: the case's model with the defaults torch_model.model_defaults() fills in."""
    from ..targets.torch_model import model_defaults

    m = model_defaults(case)
    defaults = {k: v for k, v in m.items() if k not in case["model"]}
    return f'M = {{**CASE["model"], **{defaults!r}}}  # with model_defaults()' if defaults else 'M = CASE["model"]'


#: The worker's MoE block (targets/torch_moe.py), which the model's Block builds for a `moe` layer (the units of its
#: auxiliary loss, `_AUX_UNIT` / `set_aux_unit`, come with the training loop, which sets them).
MOE_SOURCE = ("slots", "ExpertLinear", "_AuxLossGradient", "Moe")


def model_source():
    moe = worker_source("targets/torch_moe.py", *MOE_SOURCE).replace("HarnessError", "RuntimeError")
    return rule("the model (as the worker's)") + "\n" + moe + "\n\n" + worker_source("targets/torch_model.py", *MODEL_SOURCE).replace(
        "HarnessError", "RuntimeError")


def training_source():
    """The worker's own training loop (torch_training.train, with what it calls) and its combine_dp."""
    base = worker_source("targets/base.py", "IGNORE_INDEX", "loss_denominator", "class_weight", "chunk_range", "grad_or_fail",
                         "is_frozen", "setup_features", "moe_setup_features", "optimizer_features", "moe_of", "case_slots", "drops_tokens",
                         "resume_after", "label_smoothing").replace("HarnessError", "RuntimeError")
    aux = worker_source("targets/torch_moe.py", "_AUX_UNIT", "set_aux_unit")
    loop = worker_source("targets/torch_training.py", "full", "dense", "local_mean_count", "micro_batch_loss", "train",
                         "DataPart", "SequencePart", "_LowPrecisionGradScaler", "loss_scaler", "scaled_step", "skipped_steps_stats",
                         "combine_dp")
    return rule("training (the worker's loop)") + "\n" + base + "\n\n" + aux + "\n\n" + loop


def model_arrays(case, inputs, target):
    """The embedded inputs: parameters as float64 (values of the case dtype), token ids and targets as int64."""
    from .common import require_inputs

    params = param_names(case)
    require_inputs(inputs, params + ["tokens", "targets"], target)
    arrays = {n: inputs[n].astype("float64") for n in params}
    arrays.update({n: inputs[n].astype("int64").reshape(-1) for n in ("tokens", "targets")})
    if "class_weights" in inputs:
        arrays["class_weights"] = inputs["class_weights"].astype("float64")
    return arrays
