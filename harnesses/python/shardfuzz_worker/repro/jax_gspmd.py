"""Repro of a jax-gspmd op case: jit + NamedSharding on a [dp, tp] mesh of host CPU devices, one process."""

from ..partial import partial_parts, round_to
from ..targets.base import dtype_name, input_shapes, output_shape, parallel
from .common import ReproError, assemble, embed, header, literal, mesh_words, require_inputs, rule, template
from .common import refuse_op_case, valid_placement, worker_op_source, worker_source

TARGET = "jax-gspmd"

IMPORTS = """
import os

# As the fuzzer's JAX worker: 8 host CPU devices, set before jax is imported (and float64 on, below).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import base64  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import zlib  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

jax.config.update("jax_enable_x64", True)
"""

JNP_DTYPES = {"f64": "jnp.float64", "f32": "jnp.float32", "bf16": "jnp.bfloat16", "f16": "jnp.float16"}


def check(case):
    from ..targets.jax_gspmd import TARGET as WORKER

    check_jax_op_case(case, TARGET, WORKER)


def check_jax_op_case(case, target, worker):
    """ReproError unless the JAX target `worker` would run the op case and its placements are R, P or S(d)."""
    refuse_op_case(target, worker, case, "case.parallel / case.train.dtype / case.op.placements")
    shapes = dict(input_shapes(case["op"]))
    for name, places in case["op"].get("placements", {}).items():
        if not all(valid_placement(pl, len(shapes[name])) for pl in places):
            raise ReproError(f"{target}: case.op.placements[{name!r}] holds a placement other than R, P or S(d)")


def producible(case):
    return {"out"} | {f"grad/{n}" for n, _ in input_shapes(case["op"])}


def layouts(case):
    """Per input, as jax_gspmd.py sets it up: the PartitionSpec entries of what enters jit (partial axes first),
    the number of summand axes, and whether it enters replicated (a shard would be uneven: XLA pads)."""
    from ..targets.jax_common import Layout, placements
    from ..targets.jax_gspmd import _divisible

    p = parallel(case)
    mesh_shape = (p["dp"], p["tp"])
    out = {}
    for name, shape in input_shapes(case["op"]):
        lay = Layout(placements(case, name), len(shape))
        out[name] = {"spec": tuple(lay.partial) + tuple(lay.spec_entries()), "partial": len(lay.partial),
                     "padded": not _divisible(shape, lay, mesh_shape), "places": lay.places,
                     "partial_sizes": [mesh_shape[("dp", "tp").index(a)] for a in lay.partial]}
    return out


def arrays(case, inputs, lays, ids):
    """Inputs rounded to the case dtype (float64), every Partial input's summands, grad_out, ids."""
    op, dt = case["op"], dtype_name(case)
    out = {}
    for name, shape in input_shapes(op):
        out[name] = round_to(inputs[name].reshape(shape), dt)
        if lays[name]["partial"]:
            parts = partial_parts(out[name], lays[name]["partial_sizes"], dt, case["data"]["seed"], name)
            out[f"{name}@summands"] = parts
    out["grad_out"] = round_to(inputs["grad_out"].reshape(output_shape(op)), dt)
    for name in ids:
        out[name] = inputs[name].astype("int64").reshape(-1)
    return out


def describe(case, lays):
    p, op = parallel(case), case["op"]
    extra = {k: op[k] for k in ("dim", "new_shape") if k in op}
    lines = [
        f"JAX jit + NamedSharding (GSPMD) op {op['kind']}{' ' + str(extra) if extra else ''} on a "
        f"{mesh_words(p['dp'], p['tp'], 'host CPU devices')}, dtype {dtype_name(case)}; one process.",
        "Inputs (full shape: placement over [dp, tp]; P = uneven random summands, one per partial coordinate):",
    ]
    for name, shape in input_shapes(op):
        lay = lays[name]
        how = "replicated + with_sharding_constraint (uneven)" if lay["padded"] else "device_put sharded"
        lines.append(f"  {name} {list(shape)}: [{', '.join(lay['places'])}]  PartitionSpec{lay['spec']}, {how}")
    lines.append(f"Output {list(output_shape(op))}; gradients of every float input from grad_out.")
    return lines


def op_preamble(case, inputs, target):
    """What both JAX generators start from: (op, shapes, id inputs, layouts, the case's config lines)."""
    op = case["op"]
    p = parallel(case)
    shapes = input_shapes(op)
    ids = [n for n in ("tokens", "targets") if n in inputs] if op["kind"] in ("embedding", "cross_entropy") else []
    need = {"embedding": ["tokens"], "cross_entropy": ["targets"]}.get(op["kind"], [])
    require_inputs(inputs, [n for n, _ in shapes] + ["grad_out"] + need, target)
    config = [
        rule("the case"),
        literal("CASE", case),
        f"DP, TP = {p['dp']}, {p['tp']}\nDTYPE = {JNP_DTYPES[dtype_name(case)]}",
        'OP = CASE["op"]',
        literal("SHAPES", {n: list(s) for n, s in shapes}),
        f"OUT_SHAPE = {tuple(output_shape(op))}\nIDS = {ids}",
    ]
    return op, shapes, ids, layouts(case), config


def generate(case, inputs, bounds, dropped):
    op, shapes, ids, lays, config = op_preamble(case, inputs, TARGET)
    command = "python repro.py"
    config += [
        "# PartitionSpec entries of what enters jit (partial axes first), summand axes, entered replicated",
        literal("LAYOUT", {n: {k: lay[k] for k in ("spec", "partial", "padded")} for n, lay in lays.items()}),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        rule("the op (as the worker runs it)") + "\n" + worker_source("targets/base.py", "op_dim"),
        worker_source("targets/jax_common.py", "LN_EPS", "up"),
        worker_op_source("targets/jax_common.py", "forward", op["kind"]).replace("HarnessError", "ValueError"),
        template("jax_gspmd"),
        template("jax_main"),
    ]
    head = header(f"{TARGET}, op {op['kind']}", describe(case, lays), command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(arrays(case, inputs, lays, ids))), command
