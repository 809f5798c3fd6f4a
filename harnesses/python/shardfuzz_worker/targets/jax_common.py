"""Shared by the JAX targets: one process with 8 host CPU devices, dtypes, placements, op math, HLO features.

JAX runs in the worker process itself (`world(case) == 0` makes the coordinator call `run_local`):
`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be in the environment before jax is imported,
and `jax_enable_x64` must be on, or float64 silently becomes float32. Traceback filtering is off: the
verdict depends on the framework frame that raised (validation.py), which filtering would hide.
"""

import os
import re
import zlib

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_traceback_filtering", "off")

from ..partial import partial_parts  # noqa: E402
from .base import HarnessError, Target, dtype_name, input_shapes, op_dim, output_shape, parallel  # noqa: E402

LN_EPS = 1e-5
N_DEVICES = 8
AXES = ("dp", "tp")

_DTYPES = {"f64": jnp.float64, "f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
_MESHES = {}


def jnp_dtype(name):
    return _DTYPES[name]


def mesh(dp, tp):
    from jax.sharding import Mesh

    key = (dp, tp)
    if key not in _MESHES:
        devs = np.array(jax.devices()[: dp * tp]).reshape(dp, tp)
        _MESHES[key] = Mesh(devs, AXES)
    return _MESHES[key]


def model_mesh(dp, pp, tp):
    """The mesh of a model case: [dp, tp], or [dp, pp, tp] with a pipeline."""
    if pp == 1:
        return mesh(dp, tp)
    from jax.sharding import Mesh

    key = (dp, pp, tp)
    if key not in _MESHES:
        _MESHES[key] = Mesh(np.array(jax.devices()[: dp * pp * tp]).reshape(dp, pp, tp), ("dp", "pp", "tp"))
    return _MESHES[key]


def placements(case, name):
    return list(case["op"].get("placements", {}).get(name, ["R", "R"]))


class Layout:
    """One input's placements over the [dp, tp] mesh: mesh axes per tensor dim, and partial axes."""

    def __init__(self, places, ndim):
        self.places = places
        self.dims = [[] for _ in range(ndim)]
        self.partial = []
        for m, pl in enumerate(places):
            if pl == "P":
                self.partial.append(AXES[m])
            elif pl.startswith("S("):
                self.dims[int(pl[2:-1])].append(AXES[m])

    def spec_entries(self):
        return [None if not a else (a[0] if len(a) == 1 else tuple(a)) for a in self.dims]

    def spec(self):
        from jax.sharding import PartitionSpec

        return PartitionSpec(*self.spec_entries())

    def parts_spec(self):
        """Spec of the partial-summands array: one leading dim per partial axis, then the tensor dims."""
        from jax.sharding import PartitionSpec

        return PartitionSpec(*self.partial, *self.spec_entries())


def check_placements(case, mesh_shape):
    """A reason the placements cannot be expressed, or None."""
    op = case["op"]
    names = {n: s for n, s in input_shapes(op)}
    for name, places in op.get("placements", {}).items():
        if name not in names:
            return f"placement for unknown input {name!r}"
        if len(places) != 2:
            return f"placements of {name!r} must name the 2 mesh dims [dp, tp]"
        for pl in places:
            if pl.startswith("S(") and int(pl[2:-1]) >= len(names[name]):
                return f"placement {pl} of {name!r} names a dim the {len(names[name])}-d tensor does not have"
    return None


def summands(case, xs, layouts, mesh_shape):
    """Each input as it enters the sharded program: a Partial one as its summands (uneven, random, exact:
    partial.py), an array with one leading dim per partial mesh axis; the others as they are."""
    out = {}
    for n, x in xs.items():
        lay = layouts[n]
        if not lay.partial:
            out[n] = x
            continue
        sizes = [mesh_shape[AXES.index(a)] for a in lay.partial]
        parts = partial_parts(np.asarray(x, dtype=np.float64), sizes, dtype_name(case), case["data"]["seed"], n)
        out[n] = parts.astype(x.dtype)
    return out


def parts_grads(name, g, layout):
    """Gradient of an input from the gradient of its summands: the first copy, the others as replicas."""
    if not layout.partial:
        return g, None
    k = len(layout.partial)
    flat = g.reshape((-1,) + g.shape[k:])
    copies = [(i, np.asarray(flat[i], dtype=np.float64)) for i in range(flat.shape[0])]
    return copies[0][1], copies


# ---------------------------------------------------------------------------------------- op math


def up(x):
    """Low-precision values in f32 for the statistics of softmax / layernorm / cross-entropy, as the
    frameworks' own kernels (and the reference's f32 accumulation) compute them."""
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


def forward(kind, op, xs, ids):
    """Plain jnp forward of one op on full (unsharded) values `xs` (float) and `ids` (int)."""
    dim = op_dim(op)
    if kind == "matmul":
        return xs["a"] @ xs["b"]
    if kind == "linear":
        return xs["x"] @ xs["w"] + xs["bias"]
    if kind == "sum":
        return jnp.sum(xs["x"], axis=dim, keepdims=True)
    if kind == "max":
        x = xs["x"]
        idx = jnp.argmax(x, axis=dim, keepdims=True)  # first maximal element, as the reference
        return jnp.take_along_axis(x, idx, axis=dim)
    if kind == "softmax":
        return jax.nn.softmax(up(xs["x"]), axis=dim).astype(xs["x"].dtype)
    if kind == "layernorm":
        x = up(xs["x"])
        mean = jnp.mean(x, axis=-1, keepdims=True)
        xc = x - mean
        var = jnp.mean(xc * xc, axis=-1, keepdims=True)
        y = xc * jax.lax.rsqrt(var + jnp.asarray(LN_EPS, x.dtype)) * up(xs["w"]) + up(xs["bias"])
        return y.astype(xs["x"].dtype)
    if kind == "embedding":
        return jnp.take(xs["table"], ids["tokens"], axis=0, mode="fill", fill_value=0)
    if kind == "cross_entropy":
        logits = up(xs["logits"])
        onehot = jnp.arange(logits.shape[1])[None, :] == ids["targets"][:, None]
        lse = jax.nn.logsumexp(logits, axis=1, keepdims=True)
        tl = jnp.sum(jnp.where(onehot, logits, jnp.zeros((), logits.dtype)), axis=1, keepdims=True)
        return (lse - tl).astype(xs["logits"].dtype)
    if kind == "reshape":
        return xs["x"].reshape(tuple(int(d) for d in op.get("new_shape") or op["shape"]))
    if kind == "transpose":
        return xs["x"].T
    raise HarnessError(f"op {kind} is not implemented (unsupported_op should have refused it)")


# ---------------------------------------------------------------------------------------- HLO features

_HLO_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "dynamic-slice", "pad")
_HLO_RE = re.compile(r"\b(" + "|".join(re.escape(o) for o in _HLO_OPS) + r")(?:-start)?\(")


def hlo_features(text):
    found = sorted(set(_HLO_RE.findall(text)))
    feats = [f"hlo:{o}" for o in found]
    feats.append(f"hlo-sig:{zlib.crc32(','.join(found).encode()):08x}")
    return feats


# ---------------------------------------------------------------------------------------- target base


class JaxTarget(Target):
    #: How model cases are sharded (jax_train.py): "gspmd" or "shardmap".
    mode = ""
    freezes = True
    rotates = True
    smooths_labels = True

    def __init__(self):
        self.coverage_prefixes = (os.path.join(os.path.dirname(jax.__file__), "_src") + os.sep,)
        self.cache = {}

    def versions(self):
        import jaxlib

        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": "cpu x8"}

    def world(self, case):
        return 0

    def vocabulary(self):
        from .jax_library_op import vocabulary

        return vocabulary()

    def single_device_seconds(self, case):
        if "library_op" not in case:
            return None
        from .jax_library_op import single_device_seconds

        return single_device_seconds(case)

    def unsupported(self, case):
        if "library_op" in case:
            from .jax_library_op import unsupported

            return unsupported(case)
        if "model" in case:
            from .jax_train import unsupported

            return unsupported(case, self.mode)
        if "op" not in case:
            return f"{self.name} runs op, library-op and model cases only"
        p = parallel(case)
        if p["pp"] > 1 or p["cp"] > 1 or p["ep"] > 1:
            return "op cases shard over the [dp, tp] mesh only"
        if p["dp"] * p["tp"] > N_DEVICES:
            return f"mesh {p['dp']}x{p['tp']} needs more than the {N_DEVICES} host CPU devices"
        if dtype_name(case) not in _DTYPES:
            return f"dtype {dtype_name(case)} is not mapped for JAX"
        return check_placements(case, (p["dp"], p["tp"]))

    def prepare(self, case, inputs):
        """Mesh, dtype, float inputs (cast to the case dtype, as numpy), int ids, and layouts."""
        p = parallel(case)
        op = case["op"]
        dt = jnp_dtype(dtype_name(case))
        shapes = input_shapes(op)
        xs, layouts = {}, {}
        for name, shape in shapes:
            full = np.asarray(inputs[name], dtype=np.float64).reshape(shape)
            xs[name] = np.asarray(jnp.asarray(full, dtype=dt))
            layouts[name] = Layout(placements(case, name), len(shape))
        ids = {}
        for name in ("tokens", "targets"):
            if name in inputs and op["kind"] in ("embedding", "cross_entropy"):
                ids[name] = np.asarray(inputs[name], dtype=np.int64).reshape(-1)
        gout = np.asarray(jnp.asarray(np.asarray(inputs["grad_out"], dtype=np.float64).reshape(output_shape(op)), dtype=dt))
        return (p["dp"], p["tp"]), dt, shapes, xs, ids, layouts, gout

    def single_device(self, case, xs, ids, gout):
        """The op on one device in the case dtype (`baseline/*`): JAX's own rounding, which the oracle
        takes as a noise baseline beside its emulated one. In f64 too: XLA's f64 functions are not all
        correctly rounded, and where the math cancels (a LayerNorm over two features) that shows."""
        op = case["op"]
        full = {n: jnp.asarray(v) for n, v in xs.items()}
        out, vjp = jax.vjp(lambda a: forward(op["kind"], op, a, ids), full)
        (grads,) = vjp(jnp.asarray(gout).astype(out.dtype))
        tensors = {"baseline/out": np.asarray(out, dtype=np.float64).reshape(output_shape(op))}
        for n, g in grads.items():
            tensors[f"baseline/grad/{n}"] = np.asarray(g, dtype=np.float64).reshape(xs[n].shape)
        return tensors

    def results(self, op, shapes, out, grads, layouts, features):
        """Output tensors from the jitted results (jax Arrays): the gathered value, plus one replica per
        replica_id where XLA left a value replicated over several devices (the copies must agree)."""
        tensors, replicas = {}, {}
        oshape = output_shape(op)
        tensors["out"] = np.asarray(out, dtype=np.float64).reshape(oshape)
        copies = device_copies(out)
        if len(copies) > 1:
            replicas["out"] = [(r, c.reshape(oshape)) for r, c in copies]
        for name, shape in shapes:
            lay = layouts[name]
            g, _ = parts_grads(name, np.asarray(grads[name], dtype=np.float64), lay)
            tensors[f"grad/{name}"] = g.reshape(shape)
            dev = device_copies(grads[name])
            k = len(lay.partial)
            reps = []
            for r, c in dev:
                if k:
                    flat = c.reshape((-1,) + c.shape[k:])
                    reps += [(r * flat.shape[0] + i, flat[i].reshape(shape)) for i in range(flat.shape[0])]
                else:
                    reps.append((r, c.reshape(shape)))
            if len(reps) > 1:
                replicas[f"grad/{name}"] = reps
        return {"tensors": tensors, "replicas": replicas, "features": features}


def device_copies(arr):
    """One full copy of a jax Array per replica_id, assembled from its addressable shards, labelled by
    the smallest device id holding a piece of it."""
    shards = getattr(arr, "addressable_shards", None)
    if not shards:
        return []
    check_shards(arr, shards)
    groups = {}
    for sh in shards:
        groups.setdefault(sh.replica_id, []).append(sh)
    copies = []
    for rid in sorted(groups):
        full = np.zeros(arr.shape, dtype=np.float64)
        for sh in groups[rid]:
            full[sh.index] = np.asarray(sh.data, dtype=np.float64)
        copies.append((min(sh.device.id for sh in groups[rid]), full))
    return copies


def check_shards(arr, shards):
    """An array whose shards hold other shapes than the slices its sharding names for them is the framework's
    inconsistency: JAX's own constructor of an array from its shards is asked to check it, so that the failure is
    raised (and classified) in JAX."""
    def named(sh):
        return tuple(len(range(*s.indices(n))) for s, n in zip(sh.index, arr.shape))

    bad = [sh for sh in shards if tuple(sh.data.shape) != named(sh)]
    if not bad:
        return
    jax.make_array_from_single_device_arrays(arr.shape, arr.sharding, [sh.data for sh in shards])
    raise HarnessError(f"device {bad[0].device.id} holds a {tuple(bad[0].data.shape)} shard where the array's sharding "
                       f"names a {named(bad[0])} slice, and JAX accepted it")
