"""Repro of a torch-dtensor library-op case (an OpInfo op): the sample's tensors and every rank's local piece
embedded, DTensor.from_local on a real gloo mesh under torchrun, against the same op single-device in float64."""

import numpy as np

from .common import ReproError, embed, header, literal, public_dtensor_source, rule, template, worker_source

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
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import init_device_mesh
""" + public_dtensor_source() + """from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
"""

TORCH_DTYPES = {"f64": "torch.float64", "f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16"}
PLAIN = (bool, int, float, str, type(None))


def check(case):
    from ..targets.torch_library_op import unsupported

    why = unsupported(case)
    if why:
        raise ReproError(f"torch-dtensor cannot run this library op here: {why}")


def op_path(op):
    """`torch.sum`, `torch.nn.functional.mse_loss` … when the OpInfo's function is a public torch function
    (found by identity in torch's public namespaces), else None."""
    import importlib

    f = op.op
    name = getattr(f, "__name__", "") or ""
    for module in ("torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft", "torch.masked"):
        try:
            if name and getattr(importlib.import_module(module), name, None) is f:
                return f"{module}.{name}"
        except ImportError:
            continue
    return None


def structure(prep):
    """The call's non-tensor leaves as literals (tensors as None) and its pytree spec as JSON."""
    import torch.utils._pytree as pytree

    import torch

    # (torch.float32, torch.preserve_format, torch.strided: their repr is the script's own expression.)
    named = (torch.dtype, torch.memory_format, torch.layout)
    leaves = []
    for i, x in enumerate(prep.leaves):
        if i in prep.positions:
            leaves.append(None)
        elif isinstance(x, PLAIN + named) or (isinstance(x, (list, tuple)) and all(isinstance(y, PLAIN) for y in x)):
            leaves.append(x)
        else:
            raise ReproError(f"the sample has an argument a repro cannot write as a literal: {type(x).__name__}")
    return leaves, pytree.treespec_dumps(prep.spec)


def arrays(prep, lib, seed):
    from ..targets.base import normalise_placements
    from ..targets.torch_local_dtensor import ArgumentLayout, starting_placements

    mesh_shape = tuple(int(d) for d in lib["mesh"])
    world = int(np.prod(mesh_shape))
    given = lib.get("placements") or []
    out, places, starts, dtypes = {}, [], [], []
    for j, i in enumerate(prep.positions):
        full = prep.leaves[i]
        p = normalise_placements(given[j] if j < len(given) else [], full.ndim, len(mesh_shape), full.is_floating_point())
        start = starting_placements(lib, j, p, full, len(mesh_shape))
        layout = ArgumentLayout(full, start, mesh_shape, prep.dtype_name, seed, f"arg{j}")
        out[f"arg{j}"] = layout.values
        for r in range(world):
            local = layout.local(r)
            out[f"arg{j}@rank{r}"] = (local.double() if local.is_floating_point() else local).numpy()
        places.append(p)
        starts.append(start)
        dtypes.append(str(layout.dtype))
    return out, places, starts, dtypes


def generate(case, inputs, bounds, dropped):
    import torch

    from ..targets.torch_opinfo import Prepared, find

    lib, seed = case["library_op"], int(case["data"]["seed"])
    op = find(lib)
    prep = Prepared(op, lib, seed, case["train"]["dtype"])
    data, places, starts, dtypes = arrays(prep, lib, seed)
    refusal = refusal_of(prep)
    for k, g in enumerate(getattr(prep, "last_grad_outputs", [])):
        if g is not None:
            data[f"gout{k}"] = g.to(torch.float64).numpy()
    cotangent = cotangent_pieces(prep, lib, seed, data)
    leaves, spec = structure(prep)
    warm = warmup_call(op, lib, seed, case["train"]["dtype"], prep)
    if warm is not None:
        data.update(warm.pop("gouts"))
    world = int(np.prod(lib["mesh"]))
    path = op_path(op)
    command = f"torchrun --nproc_per_node {world} repro.py"
    config = [
        rule("the case"),
        literal("CASE", case),
        f"MESH = {tuple(int(d) for d in lib['mesh'])}\nWORLD = {world}\nDTYPE = {TORCH_DTYPES[case['train']['dtype']]}",
        literal("OP_PATH", path),
        literal("OPINFO", [lib["name"], lib.get("variant", "")]),
        literal("LEAVES", leaves),
        literal("SPEC", spec),
        literal("POSITIONS", list(prep.positions)),
        literal("GRAD_ARGS", [prep.positions.index(i) for i in prep.grad_args]),
        literal("ARG_DTYPES", dtypes),
        literal("PLACEMENTS", places),
        literal("STARTS", starts),
        literal("VIEWS", list(lib.get("views") or [])),
        literal("REDISTRIBUTE", [list(r) for r in lib.get("redistribute") or []]),
        "# Per output, the placements its cotangent enters the backward at (library_op.cotangent), or None:",
        "# at the gathered output. Each rank's piece of it is embedded as cout<k>@rank<r>.",
        literal("COTANGENT", cotangent),
        literal("BOUNDS", bounds),
        literal("REFUSAL", refusal),
        "# The warm-up call before the case's own (library_op.warmup): its non-tensor leaves and spec, or None.",
        literal("WARMUP", warm),
    ]
    sections = ["\n".join(c.rstrip("\n") for c in config), template("common"),
                rule("output views (as the worker's)") + "\n" + worker_source("targets/torch_opinfo.py", "viewed"),
                template("torch_library_op"), template("torch_main")]
    about = [f"torch DTensor {lib['name']}{'.' + lib['variant'] if lib.get('variant') else ''} (OpInfo sample "
             f"{prep.index}, seed {seed}) on a mesh {list(lib['mesh'])} ({world} ranks), dtype {case['train']['dtype']}.",
             "Placements of the tensor arguments, per mesh dim (P = a random uneven partial value per rank):"]
    about += [f"  argument {j} {list(prep.leaves[i].shape)}: [{', '.join(places[j])}]"
              + (f", redistributed there from [{', '.join(starts[j])}]" if starts[j] != places[j] else "")
              for j, i in enumerate(prep.positions)]
    if lib.get("views"):
        about.append("Each output then goes through the views " + ", ".join(lib["views"]) + ".")
    if lib.get("redistribute"):
        about.append("Each output is redistributed, in turn, to " + " then ".join(f"[{', '.join(r)}]" for r in lib["redistribute"])
                     + " (S(d) modulo the output's dimensions) before it is gathered.")
    if cotangent:
        about.append("The backward's cotangent of each output enters at the output itself (after its views and"
                     " redistributions), as a DTensor at " + ", ".join(f"output {k} [{', '.join(p)}]" for k, p in cotangent.items())
                     + " (P = random uneven summands per rank); the warm-up call, if any, takes it at the gathered output.")
    if prep.edit_notes:
        about.append("The sample as the fuzzer edited it (embedded below): " + "; ".join(prep.edit_notes) + ".")
    if warm is not None:
        about.append("Before that call, the op runs once on the same sharded tensors with the warm-up edits ("
                     + "; ".join(warm["notes"]) + "), its results discarded: the case's call must not depend on it.")
    if refusal:
        about.append(f"Single-device torch refuses this call ({refusal}): the sharded op must refuse it too.")
    about.append("The op is " + (f"{path}." if path else f"PyTorch's OpInfo entry {lib['name']!r} (needs expecttest)."))
    head = header(f"torch-dtensor, library op {lib['name']}", about, command, dropped, case.get("name", ""))
    from .common import assemble

    return assemble(head, IMPORTS, sections, embed(data)), command


def cotangent_pieces(prep, lib, seed, data):
    """{output k: the placements its cotangent enters at} as the worker builds it (`library_op.cotangent`),
    each rank's piece into `data` as `cout<k>@rank<r>`; None when the cotangents enter at the gathered outputs."""
    from ..targets.base import normalise_placements
    from ..targets.torch_local_dtensor import ArgumentLayout

    if not lib.get("cotangent"):
        return None
    mesh_shape = tuple(int(d) for d in lib["mesh"])
    out = {}
    for k, g in enumerate(getattr(prep, "last_grad_outputs", [])):
        if g is None:
            continue
        places = normalise_placements(lib["cotangent"], g.ndim, len(mesh_shape), True)
        layout = ArgumentLayout(g, places, mesh_shape, prep.dtype_name, seed, f"cot{k}")
        for r in range(int(np.prod(mesh_shape))):
            data[f"cout{k}@rank{r}"] = layout.local(r).double().numpy()
        out[k] = places
    return out or None


def warmup_call(op, lib, seed, dtype_name, prep):
    """The case's warm-up call as the script makes it: {"leaves", "spec", "notes", "gouts"}, or None without one.
    Its tensors must be the case's own (a warm-up edit of an index tensor is not expressible here)."""
    import torch

    from ..targets.torch_opinfo import Prepared

    if not lib.get("warmup"):
        return None
    warm = Prepared(op, {**lib, "edits": lib["warmup"]}, seed, dtype_name)
    same = warm.positions == prep.positions and all(
        warm.leaves[i].shape == prep.leaves[i].shape and torch.equal(warm.leaves[i], prep.leaves[i]) for i in prep.positions)
    if not same:
        raise ReproError("the warm-up call edits a tensor argument: the script embeds the case's tensors only")
    refusal_of(warm)  # runs it once: its upstream gradients
    leaves, spec = structure(warm)
    gouts = {f"wgout{k}": g.to(torch.float64).numpy() for k, g in enumerate(getattr(warm, "last_grad_outputs", []))
             if g is not None}
    return {"leaves": leaves, "spec": spec, "notes": list(warm.edit_notes), "gouts": gouts}


def refusal_of(prep):
    """Why single-device torch refuses the call in float64 (`Type: message`), or None when it runs it."""
    import torch

    try:
        prep.run(torch.float64)
    except Exception as e:  # noqa: BLE001 - the refusal is what the repro shows
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def producible(case):
    """The outputs and gradients this case's sample gives (its float64 single-device run names them; none
    when single-device torch refuses the call), and their copies on other ranks (`replicas/NAME`)."""
    import torch

    from ..targets.torch_opinfo import Prepared, find

    lib = case["library_op"]
    try:
        names = set(Prepared(find(lib), lib, int(case["data"]["seed"]), case["train"]["dtype"]).run(torch.float64))
        return names | {f"replicas/{n}" for n in names}
    except Exception:  # noqa: BLE001 - a refused call (refusal_of says why)
        return set()
