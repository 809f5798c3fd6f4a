"""Redistributions written with explicit collectives inside a jax-shardmap program, as hand-written SPMD code
does them (the library-op path of jax_library_op uses them for its Partial arguments and output chains):

  Partial -> Shard(d)      `psum_scatter` into dim d, where the partial axis is the split's innermost and divides it
                           (an argument entering at its source: `entered`)
  Partial -> Replicate     as ZeRO / FSDP reduce flat buffers: flattened, padded to a multiple of the axes' size,
                           reduce-scattered (`psum_scatter`), all-gathered back, unpadded
                           (all-reduce = reduce-scatter + all-gather)
  Shard(d) -> Replicate    a ring all-gather: n - 1 `ppermute` steps, each block written at its owner's offset
                           (as collective matmuls and ring attention pass blocks); the innermost axis first
  Shard(d) -> Shard(e)     `all_to_all` (split e, concat d) where one mesh axis alone moves from d to e
  Replicate -> Shard(d)    the device's block, picked by `axis_index` (outer axes first)

A layout is per tensor dim the mesh axes that split it (outer first) and the partial axes (jax_library_op.Layout).
Values a ring leaves varying are typed so by JAX even where they are equal on every device, so a program that
uses a ring runs with shard_map's replication check off (`uses_ring`)."""

import math

from . import jax_release
from .jax_common import jax, jnp


def reduce_partial(v, partial, sizes):
    """The full value of a local block `v` whose `partial` axes hold summands, reduced as ZeRO and FSDP reduce
    flat buffers: flattened, zero-padded to a multiple of the partial axes' size, reduce-scattered, gathered
    back and unpadded (`psum` for an empty block). `sizes[a]` is mesh axis a's size."""
    n = math.prod(sizes[a] for a in partial)
    axes = tuple(partial)
    if v.size == 0:
        return jax.lax.psum(v, axes)
    flat = v.reshape(-1)
    pad = (-flat.shape[0]) % n
    if pad:
        flat = jnp.pad(flat, (0, pad))
    part = jax.lax.psum_scatter(flat, axes, scatter_dimension=0, tiled=True)
    return jax_release.all_gather_invarying(part, axes, 0)[:v.size].reshape(v.shape)


def ring_gather(x, a, n, d):
    """The tiled all-gather of `x` along dim `d` over mesh axis `a` (size n) as a ring of ppermutes."""
    if n == 1:
        return x
    block = x.shape[d]
    idx = jax.lax.axis_index(a)
    shape = x.shape[:d] + (n * block,) + x.shape[d + 1:]
    out = jax.lax.dynamic_update_slice_in_dim(jnp.zeros(shape, x.dtype), x, idx * block, d)
    ring = [(i, (i + 1) % n) for i in range(n)]
    cur = x
    for step in range(1, n):
        cur = jax.lax.ppermute(cur, a, ring)
        out = jax.lax.dynamic_update_slice_in_dim(out, cur, ((idx - step) % n) * block, d)
    return out


def local_block(x, a, n, d):
    """This device's block of `x` along dim `d` for mesh axis `a` (size n): 1/n of the dim."""
    if n == 1:
        return x
    block = x.shape[d] // n
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(a) * block, block, d)


def _swaps(cur, tgt):
    """(axis, from dim, to dim) for each mesh axis that alone moves a whole split from one dim to another."""
    out = []
    for d, axes in enumerate(cur):
        if len(axes) == 1 and not tgt[d]:
            e = next((e for e in range(len(tgt)) if tgt[e] == axes and not cur[e] and e != d), None)
            if e is not None:
                out.append((axes[0], d, e))
    return out


def _common(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def _plan(cur, tgt):
    """How a block split per dim as `cur` is re-split as `tgt` (lists of mesh axes per dim, no partials):
    (all_to_all moves (axis, from dim, to dim), ring gathers (dim, axis), slices (dim, axis)), in that order.
    Gathers come before slices: an axis moving between dims must leave one before it splits another."""
    cur = [list(a) for a in cur]
    swaps = _swaps(cur, tgt)
    for a, d, e in swaps:
        cur[d], cur[e] = [], [a]
    gathers, slices = [], []
    for d in range(len(cur)):
        k = _common(cur[d], tgt[d])
        gathers += [(d, a) for a in reversed(cur[d][k:])]
        slices += [(d, a) for a in tgt[d][k:]]
    return swaps, gathers, slices


def redistribute(x, cur, tgt, sizes):
    """The local block of `x` (split per dim as `cur`) re-split as `tgt` with explicit collectives (`_plan`)."""
    swaps, gathers, slices = _plan(cur, tgt)
    for a, d, e in swaps:
        x = jax.lax.all_to_all(x, a, split_axis=e, concat_axis=d, tiled=True)
    for d, a in gathers:
        x = ring_gather(x, a, sizes[a], d)
    for d, a in slices:
        x = local_block(x, a, sizes[a], d)
    return x


def uses_ring(steps):
    """Whether a chain of layouts (each: per dim the mesh axes) gathers with a ring anywhere."""
    return any(_plan(cur, tgt)[1] for cur, tgt in zip(steps, steps[1:]))


def scattered_partials(start, lay, local_shape, sizes):
    """Where an argument entering at `start` reduce-scatters its partial axes straight into `lay`'s splits:
    (per dim the mesh axes after those scatters, [(axis, dim)] scattered, the partial axes left to reduce).
    A partial axis is scattered into dim d when `lay` splits d with it innermost after start's own and it
    divides d's local size."""
    dims = [list(a) for a in start.dims]
    scattered, rest = [], []
    for a in start.partial:
        d = next((d for d, axes in enumerate(lay.dims) if axes == dims[d] + [a] and local_shape[d] % sizes[a] == 0), None)
        if d is None:
            rest.append(a)
        else:
            scattered.append((a, d))
            dims[d].append(a)
    return dims, scattered, rest


def entered(v, start, lay, sizes):
    """Argument block `v` entering at `start` (partial summands as leading dims) brought to `lay`: partial axes
    reduce-scattered into `lay`'s splits where they can be (`scattered_partials`), the others reduced as flat
    buffers (`reduce_partial`), then shards moved (`redistribute`)."""
    v = v.reshape(v.shape[len(start.partial):])
    dims, scattered, rest = scattered_partials(start, lay, v.shape, sizes)
    for a, d in scattered:
        v = jax.lax.psum_scatter(v, a, scatter_dimension=d, tiled=True)
    if rest:
        v = reduce_partial(v, rest, sizes)
    return redistribute(v, dims, lay.dims, sizes)
