"""What differs between JAX releases, in one place, so that the JAX targets run unchanged against an older
release (`--python` pointing at another environment): where `shard_map` lives and what its check is called,
and whether a collective takes `to=` (the varying-manual-axes type system). Ops of the library-op table that a
release lacks are left out of its vocabulary by `jax_ops.api`. (The generated repro scripts embed these
functions and name the script itself `jax_release`.)

Measured: jax 0.4.38 has `shard_map` only as `jax.experimental.shard_map.shard_map(..., check_rep=)` and no
`to=`; jax 0.12 has `jax.shard_map(..., check_vma=)`, `all_gather(..., to=)` and no experimental module."""

import inspect

import jax


def _takes(fn, name):
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# What older releases' replication checks say when they refuse a correct program (the second names the
# workaround itself: check_rep=False).
CHECK_REFUSALS = ("can't be statically inferred", "The branches of cond produced mismatched replication types")


def shard_map(f, mesh, in_specs, out_specs, check=True):
    """`f` under the installed release's shard_map; `check=False` turns off its replication (or vma) checks.

    Releases whose collectives cannot say a result is the same on every device (no `to="invarying"`, before
    jax 0.7; and the older `check_rep` inference) refuse some correct programs, a value picked by `axis_index`
    from an all_gather among them: there, where the check refuses the program ("can't be statically inferred"),
    the call is retried without it, which JAX transposes the other correct way (cotangents divided and psummed).
    Releases with `to=` keep the check strict: they accept these programs, and a refusal there is our error."""
    smap = getattr(jax, "shard_map", None)
    if smap is None:
        from jax.experimental.shard_map import shard_map as smap
    off = {"check_vma" if _takes(smap, "check_vma") else "check_rep": False}
    if not check:
        return smap(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **off)
    checked = smap(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    if _takes(jax.lax.all_gather, "to"):
        return checked
    unchecked = smap(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **off)

    def call(*args):
        try:
            return checked(*args)
        except Exception as e:  # (the cond refusal is a bare Exception)
            if not any(refusal in str(e) for refusal in CHECK_REFUSALS):
                raise
            return unchecked(*args)

    return call


def all_gather_invarying(x, axes, axis):
    """The tiled all_gather of `x` along `axis` over mesh `axes`, typed as the same on every device where the
    release tracks which values vary across devices (`to="invarying"`); older releases infer it."""
    kwargs = {"to": "invarying"} if _takes(jax.lax.all_gather, "to") else {}
    return jax.lax.all_gather(x, axes, axis=axis, tiled=True, **kwargs)


def varying(x, axis):
    """`x` typed as varying over mesh `axis` (`pcast(to="varying")`, or `pvary` before it), where the release tracks
    which values vary; older releases infer it (returned unchanged)."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axis, to="varying")
    if hasattr(jax.lax, "pvary"):
        return jax.lax.pvary(x, axis)
    return x
