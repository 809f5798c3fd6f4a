"""Repro of a torch-tp model case: the case's model with parallelize_module (the torchtitan plan), its training
steps under loss_parallel, on a 1-D tensor-parallel mesh under torchrun."""

from ..targets.base import dtype_name, parallel
from .common import ReproError, assemble, embed, header, literal, require_inputs, rule, template, worker_source

TARGET = "torch-tp"

TORCH_DTYPES = {"f64": "torch.float64", "f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16"}
MODEL_SOURCE = ("NORM_EPS", "Norm", "Attention", "causal_attention", "Mlp", "Block", "Model", "is_linear_weight",
                "load_case_params", "to_case_layout", "make_optimizer")


def check(case):
    from ..targets.torch_tp import TARGET as WORKER

    if "op" in case:
        raise ReproError(f"{TARGET} runs model cases only (the case has case.op, not case.model)")
    why = WORKER.unsupported(case)
    if why:
        raise ReproError(f"{TARGET} cannot run this case (case.model / case.parallel / case.train): {why}")
    if dtype_name(case) not in TORCH_DTYPES:
        raise ReproError(f"{TARGET}: case.train.dtype {dtype_name(case)!r} has no torch dtype")


def param_names(case):
    """The model's parameter names (as the case and the fuzzer name them), from a model on the meta device."""
    import torch

    from ..targets.torch_model import Model, model_defaults

    with torch.device("meta"):
        return [n for n, _ in Model(model_defaults(case)).named_parameters()]


def producible(case):
    params = param_names(case)
    losses = [f"loss/step{k}" for k in range(case["train"]["steps"])]
    return {"logits", *losses} | {f"{kind}/{n}" for kind in ("grad", "param") for n in params}


def plan_source(case):
    """`tp_plan()`: the parallelize_module plan torch_tp.py builds for this model, written out."""
    from ..targets.torch_model import model_defaults

    m, sp = model_defaults(case), parallel(case)["sequence_parallel"]
    seq = "Shard(1)" if sp else "Replicate()"
    lines = [
        f'"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts={seq}),',
        f'"lm_head": ColwiseParallel(input_layouts={seq}, output_layouts=Shard(-1), use_local_output=False),',
    ]
    if sp:
        lines.append('"final_norm": SequenceParallel(),')
    for i, kind in enumerate(m["layers"]):
        pre = f"layers.{i}"
        if sp:
            lines.append(f'"{pre}.norm": SequenceParallel(),')
        if kind == "attention":
            inner, cols, row = "attn", ("q", "k", "v"), "o"
        else:
            inner, cols, row = "mlp", ("up", "gate") if m["activation"] == "swiglu" else ("up",), "down"
        if sp:
            lines.append(f'"{pre}.{inner}": PrepareModuleInput(input_layouts=(Shard(1),), '
                         'desired_input_layouts=(Replicate(),)),')
        lines += [f'"{pre}.{inner}.{c}": ColwiseParallel(),' for c in cols]
        lines.append(f'"{pre}.{inner}.{row}": RowwiseParallel(output_layouts={seq}),')
    body = "\n".join(f"        {ln}" for ln in lines)
    return ("def tp_plan():\n"
            '    """The parallelize_module plan of torch_tp.py for this model (module name -> parallel style)."""\n'
            f"    return {{\n{body}\n    }}\n")


def imports(sp):
    extra = "PrepareModuleInput, RowwiseParallel, SequenceParallel" if sp else "RowwiseParallel"
    return f"""
import base64
import contextlib
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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, {extra}, loss_parallel, parallelize_module
"""


def describe(case):
    from ..targets.torch_model import model_defaults

    m, p, t = model_defaults(case), parallel(case), case["train"]
    o = t["optimizer"]
    opt = ", ".join(f"{k}={v}" for k, v in o.items() if k != "kind")
    return [
        f"torch tensor parallelism (parallelize_module) over tp={p['tp']} ranks"
        f"{', sequence parallel' if p['sequence_parallel'] else ''}, dtype {dtype_name(case)}.",
        f"Model: vocab {m['vocab']}, hidden {m['hidden']}, ffn {m['ffn']}, heads {m['heads']} (kv {m['kv_heads']}),"
        f" layers {m['layers']}, {m['norm']}, {m['activation']}, bias {m['bias']};"
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


def generate(case, inputs, bounds, dropped):
    params = param_names(case)
    require_inputs(inputs, params + ["tokens", "targets"], TARGET)
    p = parallel(case)
    command = f"torchrun --nproc_per_node {p['tp']} repro.py"
    config = [
        rule("the case"),
        literal("CASE", case),
        f"TP = WORLD = {p['tp']}\nSEQUENCE_PARALLEL = {bool(p['sequence_parallel'])}",
        f"DTYPE = {TORCH_DTYPES[dtype_name(case)]}\nGRAD_ACCUMULATION = {case['train'].get('grad_accumulation', 1)}",
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        rule("the model (as the worker's)") + "\n" + worker_source("targets/torch_model.py", *MODEL_SOURCE),
        worker_source("targets/torch_training.py", "full"),
        plan_source(case),
        template("torch_tp"),
        template("torch_main"),
    ]
    arrays = {n: inputs[n].astype("float64") for n in params}
    arrays.update({n: inputs[n].astype("int64").reshape(-1) for n in ("tokens", "targets")})
    head = header(f"{TARGET}, model", describe(case), command, dropped, case.get("name", ""))
    return assemble(head, imports(p["sequence_parallel"]), sections, embed(arrays)), command
