# -------------------------------------------------------------- the op, sharded and on one device


def resolve_op():
    import importlib

    module, name = OP_PATH.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def step_of(call, cot_in=None):
    """(args, cots) -> (outputs, gradients of the float arguments), the vjp inside, as the fuzzer's step;
    `cot_in(k, c)` takes cotangent k from how it entered to its full value before its convert."""

    def step(args, cots):
        def fwd(fvals):
            vals = list(args)
            for p, j in enumerate(FLOAT_ARGS):
                vals[j] = fvals[p]
            outs = call(vals)
            return [outs[k] for k in FLOAT_OUTS], outs

        fvals = [args[j] for j in FLOAT_ARGS]
        if not cots:
            return fwd(fvals)[1], []
        floats, vjp, outs = jax.vjp(fwd, fvals, has_aux=True)
        (grads,) = vjp([(cot_in(k, c) if cot_in else c).astype(o.dtype) for k, (c, o) in enumerate(zip(cots, floats))])
        return outs, grads

    return step


def results(outs, grads):
    got = {f"out/{k}": np.asarray(o, dtype=np.float64) for k, o in enumerate(outs)}
    got.update({f"grad/{j}": np.asarray(g, dtype=np.float64) for j, g in zip(FLOAT_ARGS, grads)})
    return got


def run_sharded(data, op):
    mesh = Mesh(np.array(jax.devices()[: int(np.prod(MESH))]).reshape(MESH), AXES)
    repl = NamedSharding(mesh, PartitionSpec())
    wsc = jax.lax.with_sharding_constraint

    def call(vals):
        fulls = []
        for v, a in zip(vals, ARGS):
            v = wsc(v, NamedSharding(mesh, PartitionSpec(*a["spec"])))
            if a["partial"]:
                v = v.sum(axis=tuple(range(a["partial"])))
            if a["to"] is not None:
                v = wsc(v, NamedSharding(mesh, PartitionSpec(*a["to"])))
            fulls.append(v)
        outs = [viewed(o, VIEWS) for o in jax.tree_util.tree_leaves(op(*fulls, **KWARGS))]
        for specs in CHAIN:
            outs = [wsc(o, NamedSharding(mesh, PartitionSpec(*s))) for o, s in zip(outs, specs)]
        return [wsc(o, repl) if r else o for o, r in zip(outs, REPLICATE_AFTER)]

    args = []
    for j, a in enumerate(ARGS):
        x = data[f"arg{j}@entering"]
        x = jnp.asarray(x, dtype=DTYPE) if j in FLOAT_ARGS else jnp.asarray(x)
        args.append(jax.device_put(x, repl if a["replicated"] else NamedSharding(mesh, PartitionSpec(*a["spec"]))))
    cots, cot_in = entering_cotangents(data, mesh, repl)
    outs, grads = jax.jit(step_of(call, cot_in))(args, cots)
    got = results(outs, grads)
    for j in FLOAT_ARGS:
        # A partial argument's gradient: that of its first summand (the fuzzer's choice; the others are copies).
        k = ARGS[j]["partial"]
        if k:
            got[f"grad/{j}"] = got[f"grad/{j}"].reshape((-1,) + data[f"arg{j}"].shape)[0]
    return got


def entering_cotangents(data, mesh, repl):
    """The cotangents as they enter the program (COTANGENTS: each one's PartitionSpec, partial summand axes
    first; float64 unless COTS_IN_DTYPE), and the function that takes each to its full value inside it."""
    cots = []
    for k in range(len(FLOAT_OUTS)):
        if f"cot{k}" not in data:
            continue
        c = data[f"cot{k}@entering"] if COTANGENTS else data[f"cot{k}"]
        c = jnp.asarray(c, dtype=DTYPE) if COTS_IN_DTYPE else np.asarray(c)
        at = COTANGENTS[k] if COTANGENTS else None
        cots.append(jax.device_put(c, repl if at is None or at["replicated"] else NamedSharding(mesh, PartitionSpec(*at["spec"]))))
    if not COTANGENTS:
        return cots, None

    def cot_in(k, c):
        at = COTANGENTS[k]
        c = jax.lax.with_sharding_constraint(c, NamedSharding(mesh, PartitionSpec(*at["spec"])))
        return c.sum(axis=tuple(range(at["partial"]))) if at["partial"] else c

    return cots, cot_in


def run_reference(data, op):
    """The same op on one device in float64 on the same (rounded) values."""
    args = [jnp.asarray(data[f"arg{j}"], dtype=jnp.float64) if j in FLOAT_ARGS else jnp.asarray(data[f"arg{j}"])
            for j in range(len(ARGS))]
    cots = [jnp.asarray(data[f"cot{k}"], dtype=jnp.float64) for k in range(len(FLOAT_OUTS)) if f"cot{k}" in data]
    outs, grads = jax.jit(step_of(lambda vals: [viewed(o, VIEWS) for o in jax.tree_util.tree_leaves(op(*vals, **KWARGS))]))(args, cots)
    return results(outs, grads)


def main():
    data = load_blob()
    op = resolve_op()
    sharded = run_sharded(data, op)
    reference = run_reference(data, op)
    dump(sharded, reference)
    return report(sharded, reference, BOUNDS)
