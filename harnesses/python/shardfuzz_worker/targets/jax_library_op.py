"""A library-op case end to end for jax-gspmd and jax-shardmap: the sample of a `jax_ops` entry, the
single-device computations the oracle judges with, the sharded run, and the tensors the fuzzer compares
(the same reply torch_library_op.combine makes).

Inputs: the op's sample `sample % len(samples)` drawn from `data.seed`, float inputs rounded to the case
dtype (float64 values). Single-device runs, each one jitted function computing the outputs and, when the
case asks for the backward and the op has float inputs and float outputs, the vjp of every float input
with a seeded cotangent per float output (rounded to the case dtype):
  reference          float64 on the rounded inputs
  baseline           the case dtype (low precision only)
  member/perturbed   float64 on the inputs and cotangents times (1 ± u), u the dtype's unit roundoff
  member/reordered   the case dtype on those inputs (low precision only)
Sharded runs, over a mesh of the case's shape on the first prod(mesh) of the 8 host CPU devices, axes
("a0", "a1", "a2"):
  gspmd     one jitted function: each input constrained with `with_sharding_constraint` to the
            NamedSharding its placements name (S(d) over mesh dim m: axis m in the spec entry of tensor
            dim d, several axes on one dim allowed; uneven shards padded by XLA), a Partial input entering
            as its summands (one leading dim per partial mesh axis, summed inside), the op and its vjp.
  shardmap  the op inside `jax.shard_map` on the value rebuilt per device: each argument brought from its
            source to its placements with explicit collectives (jax_smap_redistribute: reduce-scatter
            of partial summands, ring all-gathers of ppermutes, all_to_all, axis_index slices), then
            tiled all_gathers of every sharded dim; its outputs taken through the case's redistribution
            chain the same way and returned split as the chain's last layout (out_specs). A dim the mesh
            does not divide is refused by shard_map (a clean rejection, validation.py); a source or chain
            step that would split a dim unevenly is not applied (noted).
Only Partial sums exist in JAX's programs: P(avg|max|min) placements run as replicated (noted).
The gradient of a summand is the gradient of the whole value: the first summand's is sent, the others as
replicas (as jax_gspmd does). Compiled programs are cached by op, sample, shapes, dtype, mesh and
placements; a repeated structure costs the runs only.
"""

import collections
import math

import numpy as np

from ..partial import partial_parts, round_to
from . import jax_ops, jax_release
from . import jax_smap_redistribute as smap_redistribute
from .base import normalise_placements
from .jax_common import N_DEVICES, device_copies, hlo_features, jax, jnp

AXES = ("a0", "a1", "a2")
DTYPES = {"f64": jnp.float64, "f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
UNIT_ROUNDOFF = {"f64": 2.0**-53, "f32": 2.0**-24, "bf16": 2.0**-8, "f16": 2.0**-11}
TARGET_KINDS = ("gspmd", "shardmap")

#: Compiled programs and sample lists kept (least recently used out first).
CACHE_SIZE = 512
SAMPLE_CACHE = 256


class _Lru(collections.OrderedDict):
    def __init__(self, size):
        super().__init__()
        self.size = size

    def get_or(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)
        return value


_COMPILED = _Lru(CACHE_SIZE)
_SAMPLES = _Lru(SAMPLE_CACHE)
_MESHES = {}


class Unsupported(Exception):
    pass


def vocabulary():
    return jax_ops.vocabulary()


def unsupported(case):
    lib = case["library_op"]
    try:
        jax_ops.find(lib["name"], lib.get("variant", ""))
    except KeyError as e:
        return str(e)
    mesh = [int(d) for d in lib.get("mesh") or []]
    if not 1 <= len(mesh) <= len(AXES) or min(mesh) < 1:
        return f"a library-op mesh has 1 to {len(AXES)} dims of size >= 1 (got {mesh})"
    if math.prod(mesh) > N_DEVICES:
        return f"mesh {mesh} needs more than the {N_DEVICES} host CPU devices"
    if case["train"]["dtype"] not in DTYPES:
        return f"dtype {case['train']['dtype']} is not mapped for JAX"
    return None


def mesh_of(shape):
    from jax.sharding import Mesh

    if shape not in _MESHES:
        devs = np.array(jax.devices()[: math.prod(shape)]).reshape(shape)
        _MESHES[shape] = Mesh(devs, AXES[: len(shape)])
    return _MESHES[shape]


def is_float(dtype):
    return jnp.issubdtype(dtype, jnp.floating)


# ---------------------------------------------------------------------------------------- the case


class Prepared:
    """One library-op case made concrete: the sample's inputs (floats rounded to the case dtype, as float64
    values), which are float, the output structure, and the upstream gradient of every float output."""

    def __init__(self, lib, seed, dtype_name):
        self.op = jax_ops.find(lib["name"], lib.get("variant", ""))
        self.seed, self.dtype_name = int(seed), dtype_name
        got = _SAMPLES.get_or((self.op.name, self.seed), lambda: self.op.samples(self.seed))
        self.index = int(lib.get("sample", 0)) % len(got)
        raw, kwargs = got[self.index]
        self.kwargs, self.edit_notes = edited_kwargs(kwargs, lib.get("edits"), np.ndim(raw[0]) if raw else 0)
        self.floating = [np.issubdtype(np.asarray(x).dtype, np.floating) for x in raw]
        self.inputs = [round_to(x, dtype_name) if f else np.asarray(x) for x, f in zip(raw, self.floating)]
        self.float_args = [j for j, f in enumerate(self.floating) if f]
        self.structure = tuple((tuple(np.shape(x)), str(np.asarray(x).dtype)) for x in self.inputs)
        self.views = tuple(lib.get("views") or [])
        self.static = repr(sorted(self.kwargs.items())) + repr(self.views)
        self.key = (self.op.name, self.index, self.structure, self.static)
        self.outs = _COMPILED.get_or(("outs",) + self.key, self._out_structure)
        self.float_outs = [k for k, (_, dt) in enumerate(self.outs) if is_float(dt)]
        self.integer_outputs = {f"out/{k}" for k in range(len(self.outs)) if k not in self.float_outs}
        self.grad = bool(lib.get("backward", True)) and self.op.grad and bool(self.float_args) and bool(self.float_outs)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 11])
        self.cots = [round_to(rng.standard_normal(self.outs[k][0]), dtype_name) for k in self.float_outs] if self.grad else []

    def _out_structure(self):
        """[(shape, dtype)] of the op's outputs (float64 inputs), traced abstractly."""
        specs = [jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype) for x in self.inputs]
        try:
            got = jax.eval_shape(lambda *xs: _op_call(self)(xs), *specs)
        except Exception as e:  # noqa: BLE001 - the op refuses its own sample: not a case to run
            raise Unsupported(f"the op fails on this sample: {type(e).__name__}: {str(e)[:200]}") from e
        if not got:
            raise Unsupported("the op returns no array: nothing to compare")
        bad = [tuple(o.shape) for o in got if any(d < 0 for d in o.shape)]
        if bad:
            # (jnp.tile with negative reps traces to (2, -6) and fails later in MLIR: JAX validates less than
            # numpy, which refuses; single-device and sharded runs fail alike.)
            raise Unsupported(f"the op traces to an output of negative size {list(bad[0])} on this sample: it cannot run")
        return [(tuple(o.shape), o.dtype) for o in got]

    def perturbed(self, u):
        """The inputs times (1 + u·r), r = ±1 per element (seeded), float inputs only."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 7])
        out = list(self.inputs)
        for j in self.float_args:
            out[j] = _moved(out[j], u, rng)
        return out

    def perturbed_cots(self, u):
        """The cotangents times (1 + u·r), r = ±1 per element (seeded): the backward's inputs. A gradient that
        sums its cotangent (broadcast_to's) does not move with the inputs at all, while a sharded run rounds
        each device's partial sum of it (a clean f16 campaign case: a broadcast gradient 14 ε from every member
        that perturbed the inputs alone)."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 13])
        return [_moved(c, u, rng) for c in self.cots]


def _moved(x, u, rng):
    """`x` times (1 + u·r), r = ±1 per element drawn from `rng`."""
    return x * (1 + u * rng.choice([-1.0, 1.0], size=np.shape(x)))


def make_step(call, float_args, grad, cot_in=None):
    """A traceable (args, cots) -> (outputs, gradients of the float args): `call(args)` gives the outputs;
    `cot_in(k, c)`, when given, takes cotangent k from how it entered to its full value (the sharded run's
    `library_op.cotangent`) before it is converted to its output's dtype."""

    def step(args, cots):
        def fwd(fvals):
            vals = list(args)
            for p, j in enumerate(float_args):
                vals[j] = fvals[p]
            outs = call(vals)
            return [o for o in outs if is_float(o.dtype)], outs

        fvals = [args[j] for j in float_args]
        if not grad:
            return fwd(fvals)[1], []
        floats, vjp, outs = jax.vjp(fwd, fvals, has_aux=True)
        (grads,) = vjp([(cot_in(k, c) if cot_in else c).astype(o.dtype) for k, (c, o) in enumerate(zip(cots, floats))])
        return outs, grads

    return step


def _op_call(prep):
    return lambda vals: [viewed(o, prep.views) for o in jax.tree_util.tree_leaves(prep.op(*vals, **prep.kwargs))]


def viewed(x, views):
    """An output through the case's views, as torch_opinfo.viewed defines them (each left out where it does
    not apply)."""
    for how in views:
        n = x.ndim
        if how == "transpose" and n >= 2:
            x = jnp.swapaxes(x, 0, n - 1)
        elif how == "permute" and n >= 3:
            x = jnp.transpose(x)
        elif how == "flatten" and n >= 2:
            x = x.reshape(-1)
        elif how == "unsqueeze":
            x = x[None]
        elif how == "narrow" and n >= 1 and x.shape[0] >= 2:
            x = x[1:]
    return x


def to_array(x):
    return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------------------------------- single device


def edited_kwargs(kwargs, edits, ndim):
    """The sample's static keyword arguments with the case's edits applied (sample_edits.py). Only numbers are
    editable here: an index array's out-of-range behaviour is the op's mode (clip, fill, drop), and clipping
    can make two indices name one element, where which write wins is unspecified."""
    if not edits:
        return kwargs, []
    from ..sample_edits import apply, empty_lists

    kwargs, edits, list_notes = empty_lists(kwargs, edits, lambda x: False, sort_dicts=True)
    leaves, tree = jax.tree_util.tree_flatten(kwargs)
    leaves, notes = apply(leaves, edits, lambda x: False, ndim, None, None)
    return jax.tree_util.tree_unflatten(tree, leaves), list_notes + notes


def single_run(prep, run_dtype, inputs, cots=None):
    """The op on one device in `run_dtype` on `inputs` (and `cots`, the case's cotangents when None):
    {out/k, grad/j: float64 array}."""
    key = ("single", jnp.dtype(run_dtype).name, prep.grad) + prep.key
    fn = _COMPILED.get_or(key, lambda: jax.jit(make_step(_op_call(prep), prep.float_args, prep.grad)))
    args = [jnp.asarray(x, dtype=run_dtype) if f else x for x, f in zip(inputs, prep.floating)]
    outs, grads = fn(args, [np.asarray(c) for c in (prep.cots if cots is None else cots)])
    result = {f"out/{k}": to_array(o) for k, o in enumerate(outs)}
    for j, g in zip(prep.float_args, grads):
        result[f"grad/{j}"] = to_array(g)
    return result


def single_device_seconds(case):
    """Seconds the case's op (its sample, edits and views) takes on one device in float64, forward and backward,
    compilation included."""
    import time

    start = time.perf_counter()
    prep = Prepared(case["library_op"], int(case["data"]["seed"]), case["train"]["dtype"])
    single_run(prep, jnp.float64, prep.inputs)
    return time.perf_counter() - start


def single_device(prep, notes):
    """{prefix: tensors} of the reference, baseline and members; Unsupported when the op fails on one device
    in float64 or in the case dtype (the sharded run would fail alike: no finding)."""
    name = prep.dtype_name
    u = UNIT_ROUNDOFF[name]
    low = name != "f64"
    runs = [("reference", jnp.float64, False), ("member/perturbed", jnp.float64, True)]
    if low:
        runs += [("baseline", DTYPES[name], False), ("member/reordered", DTYPES[name], True)]
    out = {}
    moved, moved_cots = prep.perturbed(u), prep.perturbed_cots(u)
    for prefix, dt, perturb in runs:
        try:
            out[prefix] = single_run(prep, dt, moved if perturb else prep.inputs, moved_cots if perturb else None)
        except Exception as e:  # noqa: BLE001 - the op itself refuses this sample on one device
            if prefix in ("reference", "baseline"):
                raise Unsupported(f"the single-device op fails in {jnp.dtype(dt).name}: {type(e).__name__}: {str(e)[:200]}") from e
            notes.append(f"{prefix}: the single-device run failed ({type(e).__name__}: {str(e)[:120]}); left out")
    return out


# ---------------------------------------------------------------------------------------- placements


class Layout:
    """One argument's placements over the mesh: mesh axes per tensor dim, and partial-sum axes."""

    def __init__(self, places, ndim):
        self.places = places
        self.dims = [[] for _ in range(ndim)]
        self.partial = []
        for m, s in enumerate(places):
            if s == "P":
                self.partial.append(AXES[m])
            elif s.startswith("S("):
                self.dims[int(s[2:-1])].append(AXES[m])

    def entries(self):
        return [None if not a else (a[0] if len(a) == 1 else tuple(a)) for a in self.dims]

    def spec(self):
        """PartitionSpec of the argument as it enters: one leading dim per partial axis, then its dims."""
        from jax.sharding import PartitionSpec

        return PartitionSpec(*self.partial, *self.entries())

    def divides(self, shape, mesh_shape):
        return all(shape[d] % math.prod(mesh_shape[AXES.index(a)] for a in axes) == 0
                   for d, axes in enumerate(self.dims) if axes)


def layouts(prep, lib, notes):
    mesh_shape = tuple(int(d) for d in lib["mesh"])
    given = lib.get("placements") or []
    out = []
    for j, x in enumerate(prep.inputs):
        places = normalise_placements(given[j] if j < len(given) else [], np.ndim(x), len(mesh_shape), prep.floating[j])
        if any(s.startswith("P(") for s in places):
            notes.append(f"arg {j}: {places[[s.startswith('P') for s in places].index(True)]} has no JAX counterpart "
                         "(partial sums only): run as replicated")
            places = ["R" if s.startswith("P(") else s for s in places]
        out.append(Layout(places, np.ndim(x)))
    return out


def start_layouts(prep, lib, lays, notes):
    """Where each argument enters before a sharding constraint takes it to its layout (`library_op.sources`,
    gspmd): its own layout where no source is given; a partial start is a plain sum (`P`), and a mesh dim
    partial in the layout starts partial (as in torch-dtensor)."""
    sources = lib.get("sources") or []
    out = []
    for j, (x, lay) in enumerate(zip(prep.inputs, lays)):
        if j >= len(sources):
            out.append(lay)
            continue
        start = normalise_placements(sources[j], np.ndim(x), len(lay.places), prep.floating[j])
        if any(s.startswith("P(") for s in start):
            notes.append(f"source of arg {j}: a partial other than a sum has no JAX counterpart: starts replicated there")
        start = [t if t == "P" else ("R" if s.startswith("P(") else s) for s, t in zip(start, lay.places)]
        out.append(Layout(start, np.ndim(x)))
    return out


def entering(prep, lays, mesh_shape, values=None, name="arg"):
    """Each argument (or each of `values`, named `name`0, `name`1 …) as it enters the sharded program
    (float64 values): a Partial one as its summands (uneven, random, exact in the case dtype; the same split
    torch-dtensor makes of argument j)."""
    out = []
    for j, (x, lay) in enumerate(zip(prep.inputs if values is None else values, lays)):
        if lay.partial:
            sizes = [mesh_shape[AXES.index(a)] for a in lay.partial]
            x = partial_parts(x, sizes, prep.dtype_name, prep.seed, f"{name}{j}")
        out.append(x)
    return out


# ---------------------------------------------------------------------------------------- sharded runs


def _gspmd_call(prep, starts, lays, m, chain):
    from jax.sharding import NamedSharding, PartitionSpec

    def call(vals):
        fulls = []
        for v, start, lay in zip(vals, starts, lays):
            v = jax.lax.with_sharding_constraint(v, NamedSharding(m, start.spec()))
            if start.partial:
                v = v.sum(axis=tuple(range(len(start.partial))))
            if start.places != lay.places:
                v = jax.lax.with_sharding_constraint(v, NamedSharding(m, PartitionSpec(*lay.entries())))
            fulls.append(v)
        outs = _op_call(prep)(fulls)
        steps, replicate = chain_specs([np.shape(o) for o in outs], chain, tuple(m.devices.shape))
        for specs in steps:
            outs = [jax.lax.with_sharding_constraint(o, NamedSharding(m, PartitionSpec(*s))) for o, s in zip(outs, specs)]
        return [jax.lax.with_sharding_constraint(o, NamedSharding(m, PartitionSpec())) if r else o for o, r in zip(outs, replicate)]

    return call


def chain_layout(places, shape, mesh_shape):
    """The layout of an output of `shape` at one step of the output chain (Shard and Replicate only)."""
    return Layout(normalise_placements(places, len(shape), len(mesh_shape), False), len(shape))


def chain_specs(shapes, chain, mesh_shape):
    """The output chain for outputs of `shapes`: per step, per output, its PartitionSpec entries; and per
    output whether it is replicated after the last step. An output whose last constraint splits a dim
    unevenly leaves jit with a sharding JAX cannot name (IndivisibleError in parse_flatten_op_sharding), so
    one more constraint replicates it."""
    layouts = [[chain_layout(places, s, mesh_shape) for s in shapes] for places in chain]
    steps = [[list(lay.spec()) for lay in step] for step in layouts]
    replicate = [not lay.divides(s, mesh_shape) for lay, s in zip(layouts[-1], shapes)] if chain else [False] * len(shapes)
    return steps, replicate


def shardmap_chain(prep, chain, mesh_shape, notes):
    """Per output, the layouts the output chain takes it through under shard_map, from replicated: a step
    whose splits an output's shape does not divide is left out for that output (shard_map splits evenly)."""
    out = []
    for k, (shape, _) in enumerate(prep.outs):
        steps = [Layout(["R"] * len(mesh_shape), len(shape))]
        for i, places in enumerate(chain):
            lay = chain_layout(places, shape, mesh_shape)
            if lay.divides(shape, mesh_shape):
                steps.append(lay)
            else:
                notes.append(f"redistribute step {i}: out/{k} {list(shape)} does not divide over the mesh: not applied to it")
        out.append(steps)
    return out


def even_start(x, start, lay, mesh_shape, j, notes):
    """shard_map splits its arguments evenly only: a source where it or the placement cannot be split evenly
    enters at the placement instead (which shard_map then refuses when it is the uneven one)."""
    if start.places == lay.places or (start.divides(np.shape(x), mesh_shape) and lay.divides(np.shape(x), mesh_shape)):
        return start
    notes.append(f"source of arg {j}: {'/'.join(start.places)} does not divide {list(np.shape(x))}: enters at its placement")
    return lay


def _shardmap_call(prep, starts, lays, m, chains):
    """The op inside shard_map: each argument brought from its start to its layout and gathered to its full
    value on every device, the op, then each output's chain; outputs leave split as their last layout."""
    from jax.sharding import PartitionSpec

    sizes = dict(zip(AXES, m.devices.shape))

    def body(*vals):
        fulls = []
        for v, start, lay in zip(vals, starts, lays):
            v = smap_redistribute.entered(v, start, lay, sizes)
            for d, axes in enumerate(lay.dims):
                if axes:
                    v = jax_release.all_gather_invarying(v, tuple(axes), d)
            fulls.append(v)
        outs = _op_call(prep)(fulls)
        for k, steps in enumerate(chains):
            for cur, tgt in zip(steps, steps[1:]):
                outs[k] = smap_redistribute.redistribute(outs[k], cur.dims, tgt.dims, sizes)
        return tuple(outs)

    # (A partial axis scattered into a split only adds what a slice would: the gathers are those from the start.)
    ring = any(smap_redistribute.uses_ring([s.dims for s in steps]) for steps in chains) or any(
        smap_redistribute.uses_ring([s.dims, lay.dims]) for s, lay in zip(starts, lays))
    smap = jax_release.shard_map(body, mesh=m, in_specs=tuple(s.spec() for s in starts),
                                 out_specs=tuple(PartitionSpec(*steps[-1].entries()) for steps in chains), check=not ring)
    return lambda vals: list(smap(*vals))


def cotangent_layouts(prep, lib, notes):
    """Where each float output's cotangent enters (`library_op.cotangent`), or None: replicated, as before."""
    places = lib.get("cotangent") or []
    if not places or not prep.grad:
        return None
    mesh_ndim = len(lib["mesh"])
    out = []
    for k in prep.float_outs:
        shape = prep.outs[k][0]
        lay = normalise_placements(places, len(shape), mesh_ndim, True)
        if any(s.startswith("P(") for s in lay):
            notes.append("cotangent: a partial other than a sum has no JAX counterpart: enters replicated there")
            lay = ["R" if s.startswith("P(") else s for s in lay]
        out.append(Layout(lay, len(shape)))
    return out


def entering_cotangents(prep, cot_lays, mesh_shape):
    """The cotangents as they enter (float64 values): a partial one as its uneven random summands."""
    return entering(prep, cot_lays, mesh_shape, prep.cots, "cot") if cot_lays else list(prep.cots)


def cotangent_in(cot_lays, m):
    """`make_step`'s `cot_in` for cotangents entering at `cot_lays`: constrained to their layout inside the
    program, partial summands added."""
    from jax.sharding import NamedSharding

    def cot_in(k, c):
        lay = cot_lays[k]
        c = jax.lax.with_sharding_constraint(c, NamedSharding(m, lay.spec()))
        return c.sum(axis=tuple(range(len(lay.partial)))) if lay.partial else c

    return cot_in if cot_lays else None


def sharded_args(prep, parts, lays, m, mesh_shape, cot_lays=None, cots_in_dtype=False):
    from jax.sharding import NamedSharding, PartitionSpec

    dt = DTYPES[prep.dtype_name]
    repl = NamedSharding(m, PartitionSpec())

    def placed(x, lay, arr):
        shape = np.shape(x)[len(lay.partial):]
        # Uneven: in replicated, the constraint inside jit (gspmd) or shard_map's own check does the rest.
        return jax.device_put(arr, NamedSharding(m, lay.spec()) if lay.divides(shape, mesh_shape) else repl)

    args = [placed(x, lay, jnp.asarray(x, dtype=dt) if f else jnp.asarray(x)) for x, f, lay in zip(parts, prep.floating, lays)]
    cots = []
    for k, c in enumerate(entering_cotangents(prep, cot_lays, mesh_shape)):
        arr = jnp.asarray(c, dtype=dt) if cots_in_dtype else np.asarray(c)
        cots.append(placed(c, cot_lays[k], arr) if cot_lays else jax.device_put(arr, repl))
    return args, cots


def run_sharded(prep, lib, target_kind, notes):
    mesh_shape = tuple(int(d) for d in lib["mesh"])
    m = mesh_of(mesh_shape)
    lays = layouts(prep, lib, notes)
    starts = start_layouts(prep, lib, lays, notes)
    if target_kind == "shardmap":
        starts = [even_start(prep.inputs[j], s, lay, mesh_shape, j, notes) for j, (s, lay) in enumerate(zip(starts, lays))]
    parts = entering(prep, starts, mesh_shape)
    cot_lays = cotangent_layouts(prep, lib, notes)
    in_dtype = bool(lib.get("cotangent_in_dtype")) and prep.grad
    args, cots = sharded_args(prep, parts, starts, m, mesh_shape, cot_lays, in_dtype)
    # Output redistributions: sharding constraints on each output under gspmd, explicit collectives under shard_map.
    chain = tuple(tuple(p) for p in lib.get("redistribute") or [])
    chains = shardmap_chain(prep, chain, mesh_shape, notes) if target_kind == "shardmap" else None
    key = (target_kind, prep.dtype_name, prep.grad, mesh_shape, tuple(tuple(lay.places) for lay in lays),
           tuple(tuple(s.places) for s in starts), chain, tuple(tuple(c.places) for c in cot_lays or []), in_dtype) + prep.key

    def build():
        call = _gspmd_call(prep, starts, lays, m, chain) if target_kind == "gspmd" else _shardmap_call(prep, starts, lays, m, chains)
        compiled = jax.jit(make_step(call, prep.float_args, prep.grad, cotangent_in(cot_lays, m))).lower(args, cots).compile()
        try:
            feats = hlo_features(compiled.as_text())
        except Exception:  # noqa: BLE001 - features are a nicety
            feats = []
        return compiled, feats

    compiled, feats = _COMPILED.get_or(key, build)
    outs, grads = compiled(args, cots)
    # (Gradients come back as the arguments entered: in their start layouts.)
    return {"outs": list(outs), "grads": dict(zip(prep.float_args, grads)), "layouts": starts, "targets": lays,
            "mesh": mesh_shape, "hlo": feats, "cotangents": cot_lays or [], "cots_in_dtype": in_dtype}


def _copies(arr, shape, k):
    """Full copies of one jax Array per replica (device groups), a summands array's `k` leading dims
    split into one copy per summand: [(label, float64 array of `shape`)]."""
    reps = []
    for r, c in device_copies(arr):
        if k:
            flat = c.reshape((-1,) + tuple(shape))
            reps += [(r * flat.shape[0] + i, flat[i]) for i in range(flat.shape[0])]
        else:
            reps.append((r, c.reshape(shape)))
    return reps


# ---------------------------------------------------------------------------------------- the reply


def run(case, target_kind):
    assert target_kind in TARGET_KINDS, target_kind
    lib, seed, dtype_name = case["library_op"], int(case["data"]["seed"]), case["train"]["dtype"]
    notes = []
    try:
        prep = Prepared(lib, seed, dtype_name)
        notes += prep.edit_notes
        single = single_device(prep, notes)
    except Unsupported as e:
        return {"status": "unsupported", "reason": str(e)}
    notes += warm_up(lib, seed, dtype_name, target_kind)
    sharded = run_sharded(prep, lib, target_kind, notes)
    return combine(case, prep, single, sharded, notes, target_kind)


def warm_up(lib, seed, dtype_name, target_kind):
    """The case's warm-up call (`library_op.warmup`): the sharded computation once with the warm-up's edits in
    place of the case's own, its results discarded, before the case's call. Returns a note (none without one)."""
    from .. import sample_edits

    def run():
        warm = Prepared({**lib, "edits": lib["warmup"]}, seed, dtype_name)
        run_sharded(warm, lib, target_kind, [])
        return warm.edit_notes

    return sample_edits.warm_up(lib.get("warmup"), run)


def combine(case, prep, single, sharded, notes, target_kind):
    tensors, replicas = {}, {}
    low = case["train"]["dtype"] != "f64"
    for k, o in enumerate(sharded["outs"]):
        name = f"out/{k}"
        tensors[name] = to_array(o)
        reps = _copies(o, np.shape(o), 0)
        if len(reps) > 1:
            replicas[name] = reps
    for j, g in sharded["grads"].items():
        name = f"grad/{j}"
        lay = sharded["layouts"][j]
        shape = np.shape(prep.inputs[j])
        k = len(lay.partial)
        full = to_array(g)
        tensors[name] = full.reshape((-1,) + shape)[0] if k else full
        reps = _copies(g, shape, k)
        if len(reps) > 1:
            replicas[name] = reps
    reference = single["reference"]
    for name, ref in reference.items():
        if name not in tensors:
            notes.append(f"{name}: the sharded run produced no such tensor")
            tensors[name] = np.full(np.shape(ref), np.nan)
    # Integer outputs are compared wherever the case dtype's single-device run agrees with float64 (as
    # torch-dtensor does): comparisons stay exact, an argmax the rounding decides does not.
    baseline = single.get("baseline", {})
    dropped = {n for n in prep.integer_outputs
               if low and n in reference and not np.array_equal(baseline.get(n), reference[n])}
    for name in sorted(dropped):
        notes.append(f"{name}: an integer output the case dtype's rounding decides: not compared")
    if not set(reference) - dropped:
        return {"status": "unsupported", "reason": "only integer outputs, decided by the case dtype's rounding: nothing to compare"}
    for prefix, got in single.items():
        for name, t in got.items():
            if name not in dropped:
                tensors[f"{prefix}/{name}"] = t
    return {"tensors": tensors, "replicas": replicas, "features": features(case, prep, sharded, target_kind), "notes": notes}


def features(case, prep, sharded, target_kind):
    mesh = sharded["mesh"]
    out = [f"lib:op:{prep.op.name}", f"lib:family:{prep.op.family}", f"lib:mesh:{len(mesh)}d",
           f"lib:args:{len(prep.inputs)}", f"lib:outs:{len(prep.outs)}", f"lib:world:{math.prod(mesh)}",
           f"lib:jax:{target_kind}", f"dtype:{prep.dtype_name}"]
    for start, lay in zip(sharded["layouts"], sharded["targets"]):
        out += [f"lib:from:{'S' if a.startswith('S(') else a}>{'S' if b.startswith('S(') else b}"
                for a, b in zip(start.places, lay.places) if a != b]
    for j, lay in enumerate(sharded["targets"]):
        out.append(f"lib:place:{j}:{'/'.join(lay.places)}")
        shape = np.shape(prep.inputs[j])
        for m, s in enumerate(lay.places):
            if s.startswith("S("):
                n = shape[int(s[2:-1])]
                out.append("lib:shard:empty" if n < mesh[m] else ("lib:shard:uneven" if n % mesh[m] else "lib:shard:even"))
            elif s.startswith("P"):
                out.append(f"lib:partial:{s}")
    if prep.grad:
        out.append("lib:backward")
    for places in case["library_op"].get("redistribute") or []:
        out.append(f"lib:redistribute:{'/'.join(places)}")
    out += [f"lib:view:{v}" for v in prep.views]
    if case["library_op"].get("warmup"):
        out.append("lib:warmup")
    for lay in sharded.get("cotangents") or []:
        out.append(f"lib:cotangent:{'/'.join('S' if s.startswith('S(') else s for s in lay.places)}")
    if sharded.get("cots_in_dtype"):
        out.append("lib:cotangent-in-dtype")
    out += sharded["hlo"]
    return sorted(set(out))
