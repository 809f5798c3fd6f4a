"""Repro of a torch-dtensor op case: DTensor.from_local pieces on the [dp, tp] mesh, under torchrun."""

from ..partial import partial_parts
from ..targets.base import dtype_name, input_shapes, output_shape, parallel
from .common import ReproError, assemble, embed, header, literal, mesh_words, require_inputs, rule, template
from .common import public_dtensor_source, refuse_op_case, valid_placement, worker_op_source, worker_source

TARGET = "torch-dtensor"

IMPORTS = """
import base64
import gc
import io
import os
import sys
import zlib

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
""" + public_dtensor_source() + """from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
"""

TORCH_DTYPES = {"f64": "torch.float64", "f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16"}
ID_INPUTS = {"embedding": "tokens", "cross_entropy": "targets"}


def check(case):
    from ..targets.torch_dtensor import TARGET as WORKER

    refuse_op_case(TARGET, WORKER, case, "case.parallel / case.data")
    if dtype_name(case) not in TORCH_DTYPES:
        raise ReproError(f"{TARGET}: case.train.dtype {dtype_name(case)!r} has no torch dtype")


def placements(case):
    given = case["op"].get("placements", {})
    shapes = dict(input_shapes(case["op"]))
    for name, places in given.items():
        if name not in shapes or len(places) != 2:
            raise ReproError(f"{TARGET}: case.op.placements[{name!r}] must name an input of the op and 2 mesh dims")
        for pl in places:
            if not valid_placement(pl, len(shapes[name])):
                raise ReproError(f"{TARGET}: case.op.placements[{name!r}] holds {pl!r}, not R, P or S(d<ndim)")
    return {n: list(given.get(n, ["R", "R"])) for n in shapes}


def arrays(case, inputs, places, mesh_shape):
    """Full inputs, grad_out, ids, and every Partial input's summands (as partial.py splits them)."""
    op = case["op"]
    out = {}
    for name, shape in input_shapes(op):
        out[name] = inputs[name].astype("float64").reshape(shape)
        pdims = [m for m, pl in enumerate(places[name]) if pl == "P"]
        if pdims:
            sizes = [mesh_shape[m] for m in pdims]
            out[f"{name}@summands"] = partial_parts(out[name], sizes, dtype_name(case), case["data"]["seed"], name)
    out["grad_out"] = inputs["grad_out"].astype("float64").reshape(output_shape(op))
    ids = ID_INPUTS.get(op["kind"])
    if ids:
        out[ids] = inputs[ids].astype("int64").reshape(-1)
    return out


def describe(case, places, shapes):
    p, op = parallel(case), case["op"]
    extra = {k: op[k] for k in ("dim", "new_shape") if k in op}
    lines = [
        f"torch DTensor op {op['kind']}{' ' + str(extra) if extra else ''} on a {mesh_words(p['dp'], p['tp'])},"
        f" dtype {dtype_name(case)}.",
        "Inputs (full shape: placement over [dp, tp]; P = a random uneven Partial summand per rank):",
    ]
    lines += [f"  {n} {list(s)}: [{', '.join(places[n])}]" for n, s in shapes]
    lines.append(f"Output {list(output_shape(op))}; gradients of every float input from grad_out.")
    return lines


def generate(case, inputs, bounds, dropped):
    op = case["op"]
    p = parallel(case)
    mesh_shape = (p["dp"], p["tp"])
    shapes = input_shapes(op)
    names = [n for n, _ in shapes]
    require_inputs(inputs, names + ["grad_out"] + ([ID_INPUTS[op["kind"]]] if op["kind"] in ID_INPUTS else []), TARGET)
    places = placements(case)
    world = mesh_shape[0] * mesh_shape[1]
    command = f"torchrun --nproc_per_node {world} repro.py"
    config = [
        rule("the case"),
        literal("CASE", case),
        f"DP, TP = {mesh_shape[0]}, {mesh_shape[1]}\nWORLD = DP * TP\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        'OP = CASE["op"]',
        literal("PLACEMENTS", places),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        rule("the op (as the worker runs it)") + "\n" + worker_source("targets/base.py", "chunk_range", "shard_ranges"),
        worker_source("targets/torch_dtensor.py", "LN_EPS"),
        worker_op_source("targets/torch_dtensor.py", "apply_op", op["kind"]).replace("HarnessError", "ValueError"),
        template("torch_dtensor"),
        template("torch_main"),
    ]
    head = header(f"{TARGET}, op {op['kind']}", describe(case, places, shapes), command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(arrays(case, inputs, places, mesh_shape))), command


def producible(case):
    return {"out"} | {f"grad/{n}" for n, _ in input_shapes(case["op"])}
