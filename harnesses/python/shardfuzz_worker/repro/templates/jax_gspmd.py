# -------------------------------------------------------------- the sharded run


def run_sharded(arrs, ids, gout):
    """One jitted function computes the output and every gradient (jax.vjp inside jit, cotangent grad_out), as
    the fuzzer's jax-gspmd target runs it: each float input enters with its NamedSharding (replicated where a
    shard would be uneven), with_sharding_constraint asks for its layout inside jit, and a Partial input enters
    as its summands (one leading dim per partial mesh axis, sharded over it) that the function sums."""
    mesh = Mesh(np.array(jax.devices()[: DP * TP]).reshape(DP, TP), ("dp", "tp"))
    repl = NamedSharding(mesh, PartitionSpec())
    layout = {n: NamedSharding(mesh, PartitionSpec(*lay["spec"])) for n, lay in LAYOUT.items()}

    def step(arrs, idv, g):
        def fwd(arrs):
            full = {}
            for n in LAYOUT:
                a = jax.lax.with_sharding_constraint(arrs[n], layout[n])
                if LAYOUT[n]["partial"]:
                    a = a.sum(axis=tuple(range(LAYOUT[n]["partial"])))
                full[n] = a
            return forward(OP["kind"], OP, full, idv)

        out, vjp = jax.vjp(fwd, arrs)
        (grads,) = vjp(g.astype(out.dtype))
        return out, grads

    args = {n: jax.device_put(jnp.asarray(arrs[n], dtype=DTYPE), repl if LAYOUT[n]["padded"] else layout[n])
            for n in LAYOUT}
    idv = {n: jax.device_put(v, repl) for n, v in ids.items()}
    out, grads = jax.jit(step)(args, idv, jax.device_put(jnp.asarray(gout, dtype=DTYPE), repl))
    result = {"out": np.asarray(out, dtype=np.float64).reshape(OUT_SHAPE)}
    for n, shape in SHAPES.items():
        # A Partial input's gradient: that of its first summand (the fuzzer's choice; the others are replicas).
        g = np.asarray(grads[n], dtype=np.float64).reshape((-1,) + tuple(shape))[0]
        result[f"grad/{n}"] = g
    return result
