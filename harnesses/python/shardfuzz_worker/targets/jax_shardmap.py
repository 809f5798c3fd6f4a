"""jax-shardmap: op-level cases as explicit SPMD programs under jax.shard_map on a [dp, tp] mesh.

Each input enters with the PartitionSpec its placements name (a Partial input as its summands: one
leading dim per partial mesh axis, uneven random summands that add up to the value exactly, the same
ones torch-dtensor makes: partial.py). Every op has a sharded algorithm on local blocks with explicit
collectives, keeping a sharding where the math allows and gathering (all_gather, to='invarying') where
it does not:
  matmul / linear  contraction dim sharded alike on both sides -> local matmul + psum; row / column
                   shardings kept; partial summands deferred to one psum where linearity allows
  sum              local sum + psum over the reduced dim's axes (and partial axes)
  max              local first-argmax, all_gather of the block maxima, first argmax among blocks
  softmax          pmax of the (stop-gradient) block max, psum of the block exp-sums
  layernorm        psum of block sums and squared deviations over a sharded feature dim
  embedding        vocab-parallel lookup (ids offset by the block start, out-of-block rows zero) + psum
  cross_entropy    vocab-parallel: pmax, psum of exp-sums and of the target logit
  reshape          gather, reshape (replicated output)
  transpose        local transpose, spec swapped
Gradients: jax.vjp through the shard_map (inside jit). Shapes that do not divide the mesh are refused by
shard_map (ValueError "... evenly divisible ...") - a clean rejection.
"""


from . import jax_release
from .base import HarnessError, dtype_name
from .jax_common import AXES, JaxTarget, LN_EPS, hlo_features, jax, jnp, mesh, op_dim, summands, up


def _ax(axes):
    axes = tuple(axes)
    return axes[0] if len(axes) == 1 else axes


def _entry(axes):
    return None if not axes else _ax(axes)


class _Ctx:
    def __init__(self, mesh_shape, layouts, shapes):
        self.mesh_shape = mesh_shape
        self.layouts = layouts
        self.shapes = dict(shapes)
        self.features = set()

    def size(self, axes):
        k = 1
        for a in axes:
            k *= self.mesh_shape[AXES.index(a)]
        return k

    def psum(self, x, axes):
        axes = list(axes)
        if not axes:
            return x
        self.features.add("sm:psum")
        return jax.lax.psum(x, _ax(axes))

    def pmax(self, x, axes):
        if not axes:
            return x
        self.features.add("sm:pmax")
        return jax.lax.pmax(x, _ax(axes))

    def gather(self, x, d, axes):
        if not axes:
            return x
        self.features.add("sm:all_gather")
        return jax_release.all_gather_invarying(x, _ax(axes), d)

    def unpartial(self, name, x):
        return self.psum(x, self.layouts[name].partial)

    def full(self, name, x):
        x = self.unpartial(name, x)
        for d, axes in enumerate(self.layouts[name].dims):
            x = self.gather(x, d, axes)
        return x

    def offset(self, axes, block):
        if not axes:
            return 0
        return jax.lax.axis_index(_ax(axes)) * block

    def local_slice(self, x, d, axes):
        """This device's block of an invariant full-length dim `d` under sharding over `axes`."""
        if not axes:
            return x
        self.features.add("sm:axis_index_slice")
        block = x.shape[d] // self.size(axes)
        return jax.lax.dynamic_slice_in_dim(x, self.offset(axes, block), block, axis=d)


def _program(kind, op, ctx, loc, ids):
    """Body of the shard_map: local blocks `loc` (partial summands squeezed) -> (local out, out spec)."""
    from jax.sharding import PartitionSpec as P

    lay = ctx.layouts
    dim = op_dim(op)
    zero = lambda x: jnp.zeros((), x.dtype)  # noqa: E731

    if kind in ("matmul", "linear"):
        an, bn = ("a", "b") if kind == "matmul" else ("x", "w")
        la, lb = lay[an], lay[bn]
        a, b = loc[an], loc[bn]
        ka, kb = la.dims[1], lb.dims[0]
        k_axes = list(ka) if ka and ka == kb else []
        if not k_axes:
            a, b = ctx.gather(a, 1, ka), ctx.gather(b, 0, kb)
        m_axes = list(la.dims[0]) if not set(la.dims[0]) & set(k_axes) else []
        if not m_axes:
            a = ctx.gather(a, 0, la.dims[0])
        used = set(k_axes) | set(m_axes)
        n_axes = list(lb.dims[1]) if not set(lb.dims[1]) & used else []
        if not n_axes:
            b = ctx.gather(b, 1, lb.dims[1])
        used |= set(n_axes)
        pa, pb = set(la.partial), set(lb.partial)
        deferred = []
        if not (pa & pb) and not ((pa | pb) & used):
            deferred = sorted(pa | pb, key=AXES.index)
            if deferred:
                ctx.features.add("sm:deferred-partial")
        else:
            a, b = ctx.psum(a, la.partial), ctx.psum(b, lb.partial)
        out = ctx.psum(a @ b, sorted(set(k_axes) | set(deferred), key=AXES.index))
        if k_axes:
            ctx.features.add("sm:contraction-sharded")
        if kind == "linear":
            bias = ctx.full("bias", loc["bias"])
            out = out + ctx.local_slice(bias, 0, n_axes)
        return out, P(_entry(m_axes), _entry(n_axes))

    if kind == "sum":
        lx = lay["x"]
        x = loc["x"]
        out = jnp.sum(x, axis=dim, keepdims=True)
        out = ctx.psum(out, sorted(set(lx.dims[dim]) | set(lx.partial), key=AXES.index))
        spec = [None, None]
        spec[1 - dim] = _entry(lx.dims[1 - dim])
        return out, P(*spec)

    if kind == "max":
        lx = lay["x"]
        x = ctx.unpartial("x", loc["x"])
        idx = jnp.argmax(x, axis=dim, keepdims=True)
        m = jnp.take_along_axis(x, idx, axis=dim)
        r = lx.dims[dim]
        if r:
            g = ctx.gather(m, dim, r)
            j = jnp.argmax(g, axis=dim, keepdims=True)
            m = jnp.take_along_axis(g, j, axis=dim)
        spec = [None, None]
        spec[1 - dim] = _entry(lx.dims[1 - dim])
        return m, P(*spec)

    if kind == "softmax":
        lx = lay["x"]
        x = ctx.unpartial("x", loc["x"])
        dt = x.dtype
        x = up(x)
        r = lx.dims[dim]
        mx = jax.lax.stop_gradient(jnp.max(x, axis=dim, keepdims=True))
        mx = ctx.pmax(mx, r)
        e = jnp.exp(x - mx)
        s = ctx.psum(jnp.sum(e, axis=dim, keepdims=True), r)
        return (e / s).astype(dt), lx.spec()

    if kind == "layernorm":
        lx = lay["x"]
        x = ctx.unpartial("x", loc["x"])
        dt = x.dtype
        x = up(x)
        f = lx.dims[1]
        n = ctx.shapes["x"][1]
        mean = ctx.psum(jnp.sum(x, axis=1, keepdims=True), f) / n
        xc = x - mean
        var = ctx.psum(jnp.sum(xc * xc, axis=1, keepdims=True), f) / n
        w = up(ctx.local_slice(ctx.full("w", loc["w"]), 0, f))
        b = up(ctx.local_slice(ctx.full("bias", loc["bias"]), 0, f))
        return (xc * jax.lax.rsqrt(var + jnp.asarray(LN_EPS, x.dtype)) * w + b).astype(dt), lx.spec()

    if kind == "embedding":
        lt = lay["table"]
        t = loc["table"]
        v = lt.dims[0]
        rows = t.shape[0]
        li = ids["tokens"] - ctx.offset(v, rows)
        valid = (li >= 0) & (li < rows)
        got = jnp.take(t, jnp.where(valid, li, 0), axis=0)
        out = jnp.where(valid[:, None], got, zero(t))
        if v:
            ctx.features.add("sm:vocab-parallel")
        out = ctx.psum(out, sorted(set(v) | set(lt.partial), key=AXES.index))
        return out, P(None, _entry(lt.dims[1]))

    if kind == "cross_entropy":
        ll = lay["logits"]
        x = ctx.unpartial("logits", loc["logits"])
        dt = x.dtype
        x = up(x)
        v = ll.dims[1]
        rows_axes = ll.dims[0]
        tg = ctx.local_slice(ids["targets"], 0, rows_axes)
        mx = ctx.pmax(jax.lax.stop_gradient(jnp.max(x, axis=1, keepdims=True)), v)
        s = ctx.psum(jnp.sum(jnp.exp(x - mx), axis=1, keepdims=True), v)
        cols = ctx.offset(v, x.shape[1]) + jnp.arange(x.shape[1])
        onehot = cols[None, :] == tg[:, None]
        tl = ctx.psum(jnp.sum(jnp.where(onehot, x, zero(x)), axis=1, keepdims=True), v)
        if v:
            ctx.features.add("sm:vocab-parallel")
        return (jnp.log(s) + mx - tl).astype(dt), P(_entry(rows_axes), None)

    if kind == "reshape":
        x = ctx.full("x", loc["x"])
        return x.reshape(tuple(int(d) for d in op.get("new_shape") or op["shape"])), P()

    if kind == "transpose":
        lx = lay["x"]
        out = ctx.psum(loc["x"].T, lx.partial)
        e = lx.spec_entries()
        return out, P(e[1], e[0])

    raise HarnessError(f"op {kind} has no sharded program (unsupported_op should have refused it)")


class JaxShardMap(JaxTarget):
    name = "jax-shardmap"
    mode = "shardmap"

    def run_local(self, case, inputs):
        if "model" in case:
            from .jax_train import run

            return run(case, inputs, self.mode)
        if "library_op" in case:
            from .jax_library_op import run

            return run(case, "shardmap")
        from jax.sharding import PartitionSpec

        op = case["op"]
        kind = op["kind"]
        mesh_shape, dt, shapes, xs, ids, layouts, gout = self.prepare(case, inputs)
        parts = summands(case, xs, layouts, mesh_shape)
        m = mesh(*mesh_shape)
        names = [n for n, _ in shapes]
        id_names = sorted(ids)
        key = (
            kind, tuple(op["shape"]), op.get("dim"), tuple(op.get("new_shape") or ()), mesh_shape, dtype_name(case),
            tuple((n, tuple(layouts[n].places)) for n in names), tuple(id_names),
        )
        entry = self.cache.get(key)
        if entry is None:
            ctx = _Ctx(mesh_shape, layouts, shapes)

            def body(arrs, idv):
                loc = {}
                for n in names:
                    a = arrs[n]
                    k = len(layouts[n].partial)
                    loc[n] = a.reshape(a.shape[k:]) if k else a
                return _program(kind, op, ctx, loc, idv)[0]

            in_specs = ({n: layouts[n].parts_spec() for n in names}, {n: PartitionSpec() for n in id_names})

            # out_specs must be known before tracing: trace once abstractly to find it.
            def probe(arrs, idv):
                loc = {}
                for n in names:
                    a = arrs[n]
                    k = len(layouts[n].partial)
                    loc[n] = a.reshape(a.shape[k:]) if k else a
                return _program(kind, op, _Ctx(mesh_shape, layouts, shapes), loc, idv)[1]

            spec = _probe_spec(probe, parts, ids, layouts, mesh_shape, dt)
            smap = jax_release.shard_map(body, mesh=m, in_specs=in_specs, out_specs=spec)

            def step(arrs, idv, g):
                out, vjp = jax.vjp(lambda a: smap(a, idv), arrs)
                (grads,) = vjp(g.astype(out.dtype))
                return out, grads

            args = self._args(parts, ids, gout, layouts, m, dt)
            compiled = jax.jit(step).lower(*args).compile()
            feats = sorted(ctx.features) + hlo_features(compiled.as_text())
            entry = (compiled, feats)
            if len(self.cache) > 256:
                self.cache.clear()
            self.cache[key] = entry
        else:
            args = self._args(parts, ids, gout, layouts, m, dt)
        compiled, feats = entry
        out, grads = compiled(*args)
        features = [f"op:{kind}", f"dtype:{dtype_name(case)}"]
        features += [f"place:{n}:{'/'.join(layouts[n].places)}" for n in names]
        features += feats
        result = self.results(op, shapes, out, grads, layouts, features)
        result["tensors"].update(self.single_device(case, xs, ids, gout))
        return result

    @staticmethod
    def _args(parts, ids, gout, layouts, m, dt):
        from jax.sharding import NamedSharding, PartitionSpec

        repl = NamedSharding(m, PartitionSpec())
        arrs = {}
        for n, p in parts.items():
            arr = jnp.asarray(p, dtype=dt)
            try:
                arrs[n] = jax.device_put(arr, NamedSharding(m, layouts[n].parts_spec()))
            except Exception:  # noqa: BLE001 - uneven: let shard_map itself refuse the shape
                arrs[n] = jax.device_put(arr, repl)
        idv = {n: jax.device_put(v, repl) for n, v in ids.items()}
        return arrs, idv, jax.device_put(jnp.asarray(gout, dtype=dt), repl)


def _probe_spec(probe, parts, ids, layouts, mesh_shape, dt):
    """The out spec `_program` picks depends only on layouts and shapes: trace the program once
    abstractly (eval_shape, no vma checks) to learn it before building the real shard_map."""
    from jax.sharding import PartitionSpec

    spec_box = []

    def body(arrs, idv):
        spec_box.append(probe(arrs, idv))
        return jnp.zeros(())

    names = list(parts)
    in_specs = ({n: layouts[n].parts_spec() for n in names}, {n: PartitionSpec() for n in ids})
    shp = {n: jax.ShapeDtypeStruct(parts[n].shape, dt) for n in names}
    ishp = {n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in ids.items()}
    f = jax_release.shard_map(body, mesh(*mesh_shape), in_specs, PartitionSpec(), check=False)
    jax.eval_shape(f, shp, ishp)
    return spec_box[0]


TARGET = JaxShardMap()
