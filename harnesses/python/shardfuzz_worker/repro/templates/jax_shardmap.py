# -------------------------------------------------------------- the sharded run


def run_sharded(arrs, ids, gout):
    """The op as an explicit SPMD program under jax.shard_map (_program above: local blocks, explicit collectives)
    on the [dp, tp] mesh, as the fuzzer's jax-shardmap target runs it: each input enters with the PartitionSpec of
    its placements (a Partial one as its summands, one leading dim per partial mesh axis, that the program sums),
    the output spec is the program's own (traced once abstractly), and one jitted function computes the output and
    every gradient (jax.vjp through the shard_map, cotangent grad_out)."""
    mesh_shape = (DP, TP)
    m = mesh(DP, TP)
    layouts = {n: Layout(PLACES[n], len(s)) for n, s in SHAPES.items()}
    shapes = [(n, tuple(s)) for n, s in SHAPES.items()]

    def local(a):
        """The program's local blocks: a Partial input's summand axes squeezed."""
        loc = {}
        for n in SHAPES:
            k = len(layouts[n].partial)
            loc[n] = a[n].reshape(a[n].shape[k:]) if k else a[n]
        return loc

    def probe(a, idv):
        return _program(OP["kind"], OP, _Ctx(mesh_shape, layouts, shapes), local(a), idv)[1]

    ctx = _Ctx(mesh_shape, layouts, shapes)
    spec = _probe_spec(probe, arrs, ids, layouts, mesh_shape, DTYPE)
    in_specs = ({n: layouts[n].parts_spec() for n in SHAPES}, {n: PartitionSpec() for n in ids})
    smap = jax_release.shard_map(lambda a, idv: _program(OP["kind"], OP, ctx, local(a), idv)[0], mesh=m,
                         in_specs=in_specs, out_specs=spec)

    def step(a, idv, g):
        out, vjp = jax.vjp(lambda x: smap(x, idv), a)
        (grads,) = vjp(g.astype(out.dtype))
        return out, grads

    repl = NamedSharding(m, PartitionSpec())

    def put(n):
        a = jnp.asarray(arrs[n], dtype=DTYPE)
        try:
            return jax.device_put(a, NamedSharding(m, layouts[n].parts_spec()))
        except Exception:  # noqa: BLE001 - uneven: shard_map itself refuses the shape, as in the worker
            return jax.device_put(a, repl)

    args = ({n: put(n) for n in SHAPES}, {n: jax.device_put(v, repl) for n, v in ids.items()},
            jax.device_put(jnp.asarray(gout, dtype=DTYPE), repl))
    out, grads = jax.jit(step).lower(*args).compile()(*args)
    result = {"out": np.asarray(out, dtype=np.float64).reshape(OUT_SHAPE)}
    for n, shape in SHAPES.items():
        # A Partial input's gradient: that of its first summand (the fuzzer's choice; the others are replicas).
        result[f"grad/{n}"] = np.asarray(grads[n], dtype=np.float64).reshape((-1,) + tuple(shape))[0]
    return result
