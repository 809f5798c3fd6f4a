"""Repro of a jax-gspmd library-op case (an op of the JAX table, jax_ops.py): one jit computing the op's outputs
and the vjp of its float arguments on a mesh of host CPU devices, every argument entering and constrained as
the worker does it (start layout, partial summands, the redistribution to its layout, the output chain),
against the same op on one device in float64. One process."""

import math

import numpy as np

from .common import ReproError, assemble, embed, header, literal, rule, template, worker_source
from .jax_gspmd import IMPORTS, JNP_DTYPES

TARGET = "jax-gspmd"
PLAIN = (bool, int, float, str, type(None))


def check(case):
    from ..targets.jax_library_op import unsupported

    why = unsupported(case)
    if why:
        raise ReproError(f"{TARGET} cannot run this library op here: {why}")
    op_path(prepared(case).op)


def prepared(case):
    from ..targets.jax_library_op import Prepared

    return Prepared(case["library_op"], int(case["data"]["seed"]), case["train"]["dtype"])


def op_path(op):
    """`jax.numpy.cumsum` … when the table's function is that public function (by identity), else ReproError:
    a composite of the table (a loss, an `.at[]` update) has no public name to call."""
    import importlib

    module, _, name = op.name.rpartition(".")
    try:
        if getattr(importlib.import_module(module), name, None) is op.fn:
            return op.name
    except ImportError:
        pass
    raise ReproError(f"{op.name} is a composite of shardfuzz's JAX table, not a public JAX function: no standalone repro")


def is_plain(value):
    return isinstance(value, PLAIN) or (isinstance(value, (list, tuple)) and all(is_plain(v) for v in value))


def plain(value, what):
    """`value` when a Python literal writes it (numbers, strings, None, nested tuples and lists of them), else
    ReproError."""
    if is_plain(value):
        return value
    raise ReproError(f"{what} is a {type(value).__name__}, which a repro cannot write as a literal")


def layout_lines(prep, lib, notes):
    """Per argument, as run_sharded sets it up: the start PartitionSpec (partial axes first), its summand axes,
    whether it enters replicated (uneven), and the layout's own spec where a constraint takes it there."""
    from ..targets.jax_library_op import entering, layouts, start_layouts

    mesh_shape = tuple(int(d) for d in lib["mesh"])
    lays = layouts(prep, lib, notes)
    starts = start_layouts(prep, lib, lays, notes)
    parts = entering(prep, starts, mesh_shape)
    out = []
    for j, (x, start, lay) in enumerate(zip(parts, starts, lays)):
        shape = np.shape(x)[len(start.partial):]
        out.append({"spec": list(start.spec()), "partial": len(start.partial),
                    "replicated": not start.divides(shape, mesh_shape),
                    "to": list(lay.entries()) if start.places != lay.places else None})
    return out, parts, lays, starts


def cotangent_lines(prep, lib, notes, data):
    """Per float output, how its cotangent enters as run_sharded has it (its summands into `data`), or None."""
    from ..targets.jax_library_op import cotangent_layouts, entering_cotangents

    mesh_shape = tuple(int(d) for d in lib["mesh"])
    lays = cotangent_layouts(prep, lib, notes)
    if not lays:
        return None
    out = []
    for k, (c, lay) in enumerate(zip(entering_cotangents(prep, lays, mesh_shape), lays)):
        data[f"cot{k}@entering"] = np.asarray(c)
        out.append({"spec": list(lay.spec()), "partial": len(lay.partial),
                    "replicated": not lay.divides(np.shape(c)[len(lay.partial):], mesh_shape)})
    return out


def generate(case, inputs, bounds, dropped):
    from ..targets.jax_library_op import AXES

    lib = case["library_op"]
    prep = prepared(case)
    path = op_path(prep.op)
    notes = list(prep.edit_notes)
    lines, parts, lays, starts = layout_lines(prep, lib, notes)
    from ..targets.jax_library_op import chain_specs

    chain = [tuple(p) for p in lib.get("redistribute") or []]
    steps, replicate = chain_specs([s for s, _ in prep.outs], chain, tuple(int(d) for d in lib["mesh"]))
    mesh = tuple(int(d) for d in lib["mesh"])
    data = {f"arg{j}": np.asarray(x) for j, x in enumerate(prep.inputs)}
    data.update({f"arg{j}@entering": np.asarray(x) for j, x in enumerate(parts)})
    data.update({f"cot{k}": np.asarray(c) for k, c in enumerate(prep.cots)})
    cotangents = cotangent_lines(prep, lib, notes, data)
    kwargs = {k: plain(v, f"keyword argument {k!r}") for k, v in prep.kwargs.items()}
    config = [
        rule("the case"),
        literal("CASE", case),
        f"MESH = {mesh}\nAXES = {tuple(AXES[:len(mesh)])}\nDTYPE = {JNP_DTYPES[case['train']['dtype']]}",
        literal("OP_PATH", path),
        literal("KWARGS", kwargs),
        literal("VIEWS", list(prep.views)),
        literal("FLOAT_ARGS", list(prep.float_args)),
        literal("FLOAT_OUTS", list(prep.float_outs)),
        "# Per argument: start PartitionSpec (partial axes first), summand axes, entered replicated, layout spec",
        literal("ARGS", lines),
        literal("CHAIN", steps),
        "# Per float output, how its cotangent enters (library_op.cotangent): PartitionSpec (partial axes first),\n"
        "# summand axes, entered replicated (uneven); None: replicated. COTS_IN_DTYPE: in DTYPE, not float64.",
        literal("COTANGENTS", cotangents),
        literal("COTS_IN_DTYPE", bool(lib.get("cotangent_in_dtype")) and prep.grad),
        literal("REPLICATE_AFTER", replicate),
        literal("BOUNDS", bounds),
    ]
    sections = ["\n".join(c.rstrip("\n") for c in config), template("common"),
                rule("output views (as the worker's)") + "\n" + worker_source("targets/jax_library_op.py", "viewed"),
                template("jax_library_op")]
    world = math.prod(mesh)
    about = [f"JAX {lib['name']} (jit + NamedSharding, sample {prep.index} of shardfuzz's table, seed {prep.seed}) on a mesh"
             f" {list(mesh)} of host CPU devices ({world}), dtype {case['train']['dtype']}, keyword arguments {kwargs}."]
    about += [f"  argument {j} {list(np.shape(prep.inputs[j]))}: [{', '.join(lay.places)}]"
              + (f", from [{', '.join(start.places)}]" if start.places != lay.places else "")
              for j, (start, lay) in enumerate(zip(starts, lays))]
    if lib.get("cotangent") and prep.grad:
        about.append(f"Cotangents enter at [{', '.join(lib['cotangent'])}]"
                     + (" in the case dtype." if lib.get("cotangent_in_dtype") else ", in float64 converted inside."))
    elif lib.get("cotangent_in_dtype") and prep.grad:
        about.append("Cotangents enter in the case dtype.")
    if lib.get("redistribute"):
        about.append("Outputs constrained in turn to " + " then ".join(f"[{', '.join(p)}]" for p in lib["redistribute"]) + ".")
    about += notes
    head = header(f"jax-gspmd, library op {lib['name']}", about, "python repro.py", dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(data)), "python repro.py"


def producible(case):
    from ..targets.jax_library_op import single_device

    return set(single_device(prepared(case), [])["reference"])
