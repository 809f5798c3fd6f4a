"""What every repro generator shares: refusals, bounds, embedded arrays, source taken from the worker, the header
and the assembly of the script."""

import ast
import base64
import io
import math
import os
import textwrap
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_DIR = os.path.dirname(HERE)
STATS = ("max", "rms", "norm", "sum", "direction")


class ReproError(Exception):
    """The target or the case cannot be expressed as a repro script (the CLI exits 2 with this message)."""


def refuse_op_case(target, worker, case, fields):
    """ReproError when the worker's target `worker` would not run the op case (`fields`: the case fields its
    other refusals are about)."""
    if "op" not in case:
        raise ReproError(f"{target} runs op cases only: the case has no case.op")
    why = worker.unsupported_op(case)
    if why:
        raise ReproError(f"{target} cannot run case.op.kind {case['op'].get('kind')!r}: {why}")
    why = worker.unsupported(case)
    if why:
        raise ReproError(f"{target} cannot run this case ({fields}): {why}")


def load_bounds(raw):
    """{tensor: {stat: bound}} with float bounds; refuses a stat the fuzzer does not compute. Empty for a crash
    or a hang: the script then reproduces the failure itself (it exits 1 when the framework raises)."""
    if not isinstance(raw, dict):
        raise ReproError("BOUNDS must be an object {tensor name: {stat: bound}}")
    bounds = {}
    for name, stats in raw.items():
        if not isinstance(stats, dict):
            raise ReproError(f"BOUNDS[{name!r}] must be an object {{stat: bound}}")
        unknown = sorted(set(stats) - set(STATS))
        if unknown:
            raise ReproError(f"BOUNDS[{name!r}] names unknown statistics {unknown} (known: {', '.join(STATS)})")
        kept = {s: float(b) for s, b in stats.items() if b is not None}
        if kept:
            bounds[name] = kept
    return bounds


def split_bounds(bounds, producible):
    """(bounds of the tensors the repro computes, names it drops); refuses when nothing is left."""
    kept = {n: b for n, b in bounds.items() if n in producible}
    dropped = [n for n in bounds if n not in producible]
    if bounds and not kept:
        raise ReproError(f"BOUNDS names no tensor this repro computes (it computes: {', '.join(sorted(producible))})")
    return kept, dropped


def require_inputs(inputs, names, target):
    missing = [n for n in names if n not in inputs]
    if missing:
        raise ReproError(f"{target}: INPUTS lacks {', '.join(missing)}, which the case needs")


def valid_placement(pl, ndim):
    """"R", "P", or "S(d)" with d a dim of an ndim-d tensor."""
    if pl in ("R", "P"):
        return True
    return pl.startswith("S(") and pl.endswith(")") and pl[2:-1].isdigit() and int(pl[2:-1]) < ndim


def embed(arrays):
    """The arrays as a zlib-compressed .npz, base64, in lines of 100 characters (read back by load_blob)."""
    buf = io.BytesIO()
    np.savez(buf, **{n: np.asarray(a, order="C") for n, a in arrays.items()})  # (0-d stays 0-d)
    text = base64.b64encode(zlib.compress(buf.getvalue(), 9)).decode()
    lines = "\n".join(text[i:i + 100] for i in range(0, len(text), 100))
    return f'BLOB = """\n{lines}\n"""\n'


def _top_level(relpath):
    """(source text, {name: top-level function / class / assignment node}) of a worker module, not imported."""
    with open(os.path.join(WORKER_DIR, relpath)) as f:
        text = f.read()
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            names = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            found.update({t.id: node for t in names if isinstance(t, ast.Name)})
    return text, found


def worker_source(relpath, *names):
    """Source of top-level functions, classes and assignments `names` of a worker module (path relative to
    shardfuzz_worker/), in the order asked, decorators included."""
    text, found = _top_level(relpath)
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"{relpath} has no top-level {', '.join(missing)}")
    lines = text.splitlines()

    def segment(node):
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        return "\n".join(lines[start - 1: node.end_lineno])

    parts = [segment(found[n]) for n in names]
    return f"# from shardfuzz_worker/{relpath}\n" + "\n\n\n".join(parts) + "\n"


def module_source(relpath, *names):
    """Functions `names` of a worker module that other embedded helpers call as `module.…`: the functions, and the
    script itself bound to the module's name."""
    module = relpath.rsplit("/", 1)[-1].removesuffix(".py")
    return (worker_source(relpath, *names)
            + f'\n\n{module} = __import__("sys").modules[__name__]  # (the functions above, as the worker\'s module)\n')


def known_fixes_section(target, script):
    """The fixes of known bugs the finding was found under (SHARDFUZZ_KNOWN_FIXES: those concerning `target`, in the
    table's order), embedded from known_fixes.py with the top-level names they use and applied at import on every
    rank, so that the script shows the finding rather than a bug already known; and the module's `batch_tokens`,
    which embedded worker code calls as `known_fixes.batch_tokens`. Empty where the script needs neither."""
    from .. import known_fixes

    names = known_fixes.concerning(target)
    if not names and "known_fixes." not in script:
        return ""
    functions = [known_fixes.FIXES[name][1].__name__ for name in names]
    # (The table and the module's own request handling stay out: the script applies its fixes itself.)
    needed = with_dependencies("known_fixes.py", functions + ["_BATCH", "batch_tokens"],
                               exclude=("FIXES", "_APPLIED", "ENV", "requested", "apply"))
    text = rule("fixes of known bugs, applied before the run") + module_source("known_fixes.py", *needed)
    if names:
        text += (f"\n# The fuzzer ran the case with these fixes of bugs already reported (docs/findings/ of shardfuzz)"
                 f"\n# applied; delete a name to see that bug instead.\nKNOWN_FIXES = {names!r}\n"
                 + "".join(f"if {name!r} in KNOWN_FIXES:\n    {fn}()\n" for name, fn in zip(names, functions)))
    return text


def with_known_fixes(target, script):
    """`script` with its known_fixes_section inserted before its entry point (after every definition, so that the
    fixes are applied at import, before main() runs)."""
    section = known_fixes_section(target, script)
    entry = '\n\nif __name__ == "__main__":'
    if not section or entry not in script:
        return script
    head, tail = script.rsplit(entry, 1)
    return f"{head}\n\n{section.rstrip()}\n{entry}{tail}"


def with_dependencies(relpath, names, exclude=()):
    """`names` and the top-level names of the worker module `relpath` they use, transitively, in the module's order
    (`exclude` left out)."""
    _, found = _top_level(relpath)
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in wanted or name in exclude or name not in found:
            continue
        wanted.add(name)
        todo += [n.id for n in ast.walk(found[name]) if isinstance(n, ast.Name)]
    return sorted(wanted, key=lambda n: (found[n].lineno, n))


def public_dtensor_source():
    """The worker's torch release difference (targets/torch_release.py) run at import, so that the script's
    `from torch.distributed.tensor import DTensor, ...` works on torch 2.4 too."""
    return ("\n# torch < 2.5 kept DTensor in torch.distributed._tensor: the worker's torch_release.public_dtensor.\n"
            + worker_source("targets/torch_release.py", "DTENSOR_NAMES", "public_dtensor") + "\n\npublic_dtensor()\n")


def megatron_release_source():
    """The worker's megatron-core release differences (targets/megatron_release.py)."""
    return module_source("targets/megatron_release.py", "OPTIONS_OFF", "installed_version", "config_class",
                         "fields_of", "missing_options", "new_config", "new_optimizer", "grad_offset",
                         "replicated_sharded_tensors", "in_process_checkpoint_writer")


def worker_op_source(relpath, name, kind):
    """Source of the op function `name` of a worker module with only the branch of op `kind`: its
    `if kind == "...":` / `if kind in (...):` blocks of other kinds left out."""
    text, found = _top_level(relpath)
    func = found[name]
    lines = text.splitlines()
    drop = set()
    for stmt in func.body:
        kinds = _branch_kinds(stmt)
        if kinds is not None and kind not in kinds:
            drop.update(range(stmt.lineno, stmt.end_lineno + 1))
    kept = []
    for i in range(func.lineno, func.end_lineno + 1):
        if i not in drop and (lines[i - 1].strip() or (kept and kept[-1].strip())):
            kept.append(lines[i - 1])  # (one blank line where branches were left out)
    return f"# from shardfuzz_worker/{relpath} (the branch of op {kind!r} only)\n" + "\n".join(kept) + "\n"


def _branch_kinds(stmt):
    """The op kinds of an `if kind == "k":` or `if kind in ("k", ...):` statement; None for another one."""
    test = stmt.test if isinstance(stmt, ast.If) else None
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "kind"):
        return None
    op, right = test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq) and isinstance(right, ast.Constant):
        return {right.value}
    if isinstance(op, ast.In) and isinstance(right, ast.Tuple):
        return {e.value for e in right.elts if isinstance(e, ast.Constant)}
    return None


def template(name):
    with open(os.path.join(HERE, "templates", f"{name}.py")) as f:
        return f.read()


def literal(name, value):
    """`NAME = value` as readable Python: a dict too long for one line gets one line per key."""
    return f"{name} = {_literal(value, 0, len(name) + 3)}\n"


def _repr(value):
    """repr() that reads back as Python: a non-finite float as float("inf") / float("nan") (repr gives `inf`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_repr(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_repr(k)}: {_repr(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _literal(value, indent, used):
    text = _repr(value)
    if not isinstance(value, dict) or not value or indent + used + len(text) <= 110:
        return text
    pad = " " * (indent + 4)
    items = [f"{pad}{_repr(k)}: {_literal(v, indent + 4, len(_repr(k)) + 3)}," for k, v in value.items()]
    return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"


def header(title, about, command, dropped, case_name):
    lines = [f"shardfuzz repro: {title}", ""]
    for line in about:
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        lines += textwrap.wrap(line, 110, subsequent_indent=indent, break_on_hyphens=False)
    lines += ["", f"Run (in this file's folder):  {command}"]
    lines += [
        "Runs the sharded path and a single-device float64 reference on the same inputs (embedded below), computes",
        "the fuzzer's statistics of every tensor it bounded, and prints",
        "  MISMATCH: <tensor> <stat> <value> > bound <b>   (exit status 1)  or",
        "  CRASH on rank <r>: <exception>                 (exit status 1)  or",
        "  OK: all tensors within the fuzzer's noise bounds  (exit status 0).",
        "Needs only the framework and numpy.",
    ]
    if dropped:
        lines += ["", "Not reproduced here (the fuzzer bounded them, this script does not compute them):"]
        lines += textwrap.wrap(", ".join(dropped), 100, initial_indent="  ", subsequent_indent="  ")
    lines += ["", f"Generated by shardfuzz_worker.repro from case {case_name!r}."]
    return '#!/usr/bin/env python3\n"""' + "\n".join(lines) + '\n"""\n'


def assemble(head, imports, sections, blob):
    """The script: header, imports, then each section, the data blob, the entry point."""
    body = "\n\n".join(s.strip("\n") + "\n" for s in sections)
    tail = '\n\nif __name__ == "__main__":\n    sys.exit(crash_guard(main))\n'
    return f"{head}\n{imports.strip()}\n\n{body}\n\n{rule('inputs')}\n{blob}{tail}"


def rule(title):
    """A section rule of the generated script."""
    return f"# {'-' * (77 - len(title))} {title}\n"


def mesh_words(dp, tp, what="ranks"):
    return f"mesh [dp={dp}, tp={tp}] ({dp * tp} {what})"
