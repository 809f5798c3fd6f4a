"""Repro of a jax-shardmap op case: the worker's explicit SPMD program of the op under jax.shard_map on a
[dp, tp] mesh of host CPU devices, one process."""

from ..targets.base import dtype_name, input_shapes, output_shape, parallel
from .common import assemble, embed, header, literal, mesh_words, rule, template
from .common import module_source, worker_op_source, worker_source
from .jax_gspmd import IMPORTS, arrays, check_jax_op_case, op_preamble

TARGET = "jax-shardmap"


def check(case):
    from ..targets.jax_shardmap import TARGET as WORKER

    check_jax_op_case(case, TARGET, WORKER)


def producible(case):
    return {"out"} | {f"grad/{n}" for n, _ in input_shapes(case["op"])}


def describe(case, lays):
    p, op = parallel(case), case["op"]
    extra = {k: op[k] for k in ("dim", "new_shape") if k in op}
    lines = [
        f"JAX shard_map op {op['kind']}{' ' + str(extra) if extra else ''} (an explicit SPMD program: local blocks,"
        f" psum / pmax / all_gather) on a {mesh_words(p['dp'], p['tp'], 'host CPU devices')},"
        f" dtype {dtype_name(case)}; one process.",
        "Inputs (full shape: placement over [dp, tp]; P = uneven random summands, one per partial coordinate):",
    ]
    lines += [f"  {n} {list(s)}: [{', '.join(lays[n]['places'])}]" for n, s in input_shapes(op)]
    lines.append(f"Output {list(output_shape(op))}; gradients of every float input from grad_out.")
    return lines


def sources(kind):
    """The worker's op math: placements, the sharded program of op `kind` and the plain forward (the reference)."""
    common = worker_source("targets/jax_common.py", "AXES", "LN_EPS", "_MESHES", "mesh", "Layout", "up")
    program = worker_source("targets/jax_shardmap.py", "_ax", "_entry", "_Ctx", "_probe_spec")
    release = "import inspect  # noqa: E402\n\n" + module_source("targets/jax_release.py", "_takes", "CHECK_REFUSALS",
                                                                  "shard_map", "all_gather_invarying")
    return [
        rule("the op (as the worker runs it)") + "\n" + worker_source("targets/base.py", "op_dim"),
        rule("what differs between JAX releases (as the worker's jax_release)") + "\n" + release,
        common,
        program,
        worker_op_source("targets/jax_shardmap.py", "_program", kind).replace("HarnessError", "ValueError"),
        worker_op_source("targets/jax_common.py", "forward", kind).replace("HarnessError", "ValueError"),
    ]


def generate(case, inputs, bounds, dropped):
    op, shapes, ids, lays, config = op_preamble(case, inputs, TARGET)
    command = "python repro.py"
    config += [
        literal("PLACES", {n: lays[n]["places"] for n, _ in shapes}),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        *sources(op["kind"]),
        template("jax_shardmap"),
        template("jax_main"),
    ]
    head = header(f"{TARGET}, op {op['kind']}", describe(case, lays), command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(arrays(case, inputs, lays, ids))), command
