# ---------------------------------------------------- reference and entry point


def run_reference(xs, ids, gout):
    """The same op on one device in float64, without jit: the single-device reference."""
    full = {n: jnp.asarray(v, dtype=jnp.float64) for n, v in xs.items()}
    out, vjp = jax.vjp(lambda a: forward(OP["kind"], OP, a, ids), full)
    (grads,) = vjp(jnp.asarray(gout, dtype=jnp.float64))
    result = {"out": np.asarray(out, dtype=np.float64).reshape(OUT_SHAPE)}
    result.update({f"grad/{n}": np.asarray(g, dtype=np.float64).reshape(SHAPES[n]) for n, g in grads.items()})
    return result


def main():
    data = load_blob()
    xs = {n: data[n] for n in SHAPES}
    arrs = {n: data.get(f"{n}@summands", xs[n]) for n in SHAPES}
    ids = {n: data[n] for n in IDS}
    gout = data["grad_out"].reshape(OUT_SHAPE)
    sharded = run_sharded(arrs, ids, gout)
    reference = run_reference(xs, ids, gout)
    dump(sharded, reference)
    return report(sharded, reference, BOUNDS)
