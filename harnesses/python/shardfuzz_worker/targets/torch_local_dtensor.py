"""A library-op case through DTensor with every rank in this one process: PyTorch's LocalTensorMode over a
fake process group (what DTensor's own op tests use), so a case costs milliseconds instead of a gloo round
trip. Every collective DTensor issues runs on the per-rank values for real.

Each tensor argument is built per rank from the full (rounded) value and the case's placements: `S(d)` as
torch.chunk splits (uneven and empty shards included), nested in mesh-dimension order; over the partial
mesh dims of an argument the value is split into per-rank partial values whose reduction is the value
exactly (`P`: uneven random summands, partial.py; `P(avg)`: those summands times the group size;
`P(max)` / `P(min)`: one rank holds the value, the others strictly less / more). The outputs are gathered
with `full_tensor()` on every rank (rank 0's copy is the output; the others must agree), after the case's
chain of redistributions (`redistribute`: each output to Shard / Replicate placements in turn), and the
backward runs back through them, so the op's backward sharding rules run too.
"""

import math

import numpy as np

from ..partial import partial_parts, round_to, split_rng
from .base import normalise_placements, shard_ranges
from .torch_opinfo import Prepared, call, find, output_leaves, to_array, torch_dtype, viewed

_STATE = {"pg": False, "modes": {}, "meshes": {}}


def ensure_process_group():
    import logging

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not _STATE["pg"]:
        # Performance advice on every multi-dim redistribution: noise on stderr, at a cost per case.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        _STATE["pg"] = True


def mode_and_mesh(shape):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    ensure_process_group()
    world = math.prod(shape)
    mode = _STATE["modes"].setdefault(world, LocalTensorMode(frozenset(range(world))))
    key = tuple(shape)
    if key not in _STATE["meshes"]:
        with mode:
            _STATE["meshes"][key] = init_device_mesh("cpu", key)
    return mode, _STATE["meshes"][key]


def reduce_of(s):
    return "sum" if s == "P" else s[2:-1]


def placement_object(s):
    from torch.distributed.tensor import Partial, Replicate, Shard

    if s == "R":
        return Replicate()
    if s.startswith("S("):
        return Shard(int(s[2:-1]))
    return Partial(reduce_of(s))


def partial_values(full, places, mesh_shape, dtype_name, seed, name):
    """Per partial-group coordinate, the partial value a rank holds: array of shape group sizes + full."""
    pdims = [m for m, s in enumerate(places) if s.startswith("P")]
    sizes = [mesh_shape[m] for m in pdims]
    if not pdims:
        return pdims, full[None]
    k, how = int(np.prod(sizes)), reduce_of(places[pdims[0]])
    if how in ("sum", "avg"):
        parts = partial_parts(full, sizes, dtype_name, seed, name).reshape((k,) + full.shape)
        if how == "avg":
            parts = round_to(parts * k, dtype_name)
    else:
        rng = split_rng(seed, name)
        sign = -1.0 if how == "max" else 1.0
        moved = round_to(full + sign * (np.abs(full) + 1.0) * rng.uniform(0.25, 1.0, size=(k,) + full.shape), dtype_name)
        moved = np.minimum(moved, full) if how == "max" else np.maximum(moved, full)
        holder = rng.integers(0, k, size=full.shape)
        parts = np.where(np.arange(k).reshape((k,) + (1,) * full.ndim) == holder, full, moved)
    return pdims, parts.reshape(tuple(sizes) + full.shape)


class ArgumentLayout:
    """One tensor argument's placements and the per-rank pieces they give it."""

    def __init__(self, full, places, mesh_shape, dtype_name, seed, name):
        import torch

        self.full, self.places, self.mesh_shape = full, places, mesh_shape
        self.values = full.detach().to(torch.float64).numpy()
        self.pdims, self.parts = partial_values(self.values, places, mesh_shape, dtype_name, seed, name)
        self.dtype = torch_dtype(dtype_name) if full.is_floating_point() else full.dtype

    def local(self, rank):
        """The piece rank `rank` holds (its partial value, sliced to its shards), in the case dtype."""
        import torch

        coord = np.unravel_index(rank, self.mesh_shape)
        piece = self.parts[tuple(coord[m] for m in self.pdims)] if self.pdims else self.parts[0]
        idx = tuple(slice(a, b) for a, b in shard_ranges(self.values.shape, self.places, coord, self.mesh_shape))
        return torch.from_numpy(np.array(piece[idx], dtype=np.float64, copy=True, ndmin=0)).to(self.dtype)

    def dtensor(self, local, mesh):
        import torch
        from torch.distributed.tensor import DTensor

        shape = tuple(self.full.shape)
        return DTensor.from_local(local, mesh, [placement_object(s) for s in self.places], run_check=False,
                                  shape=torch.Size(shape), stride=torch.empty(shape).stride())


def run_op(prep, lib, seed, mesh, local_of):
    """The op on DTensors whose local pieces `local_of(layout)` makes (a LocalTensor of every rank's, or
    this rank's own): (gathered outputs, {j: (placements, gradient)}, placements per argument)."""
    import torch
    from torch.distributed.tensor import DTensor

    mesh_shape = tuple(int(d) for d in lib["mesh"])
    given, leaves, grads, places_used = lib.get("placements") or [], list(prep.leaves), {}, []
    for j, i in enumerate(prep.positions):
        full = prep.leaves[i]
        places = normalise_placements(given[j] if j < len(given) else [], full.ndim, len(mesh_shape), full.is_floating_point())
        start = starting_placements(lib, j, places, full, len(mesh_shape))
        places_used.append(places)
        layout = ArgumentLayout(full, start, mesh_shape, prep.dtype_name, seed, f"arg{j}")
        local = local_of(layout)
        if i in prep.grad_args:
            local.requires_grad_(True)
            grads[j] = (start, local)
        leaves[i] = layout.dtensor(local, mesh)
        if start != places:
            leaves[i] = leaves[i].redistribute(mesh, [placement_object(s) for s in places])
    outs = [viewed(o, prep.views) for o in output_leaves(call(prep.op, leaves, prep.spec))]
    ends = [redistributed(o, lib, mesh) if isinstance(o, DTensor) else o for o in outs]
    fulls = [e.full_tensor() if isinstance(e, DTensor) else e for e in ends]
    pairs = []
    for k, (e, f, g) in enumerate(zip(ends, fulls, prep.grad_outputs(outs))):
        if g is None or not f.requires_grad:
            continue
        entered = lib.get("cotangent") and isinstance(e, DTensor)
        pairs.append((e, entering_cotangent(e, g, lib, prep, seed, k, local_of)) if entered else (f, g))
    inputs = [leaf for _, leaf in grads.values()]
    got = [None] * len(inputs)
    if pairs and inputs:
        got = torch.autograd.grad([f for f, _ in pairs], inputs, [g.to(f.dtype) for f, g in pairs], allow_unused=True)
    return fulls, {j: (places, g) for (j, (places, _)), g in zip(grads.items(), got) if g is not None}, places_used


def entering_cotangent(end, g, lib, prep, seed, k, local_of):
    """The cotangent of DTensor output k (`end`, after its views and redistributions) as a DTensor at the case's
    placements (`library_op.cotangent`, S(d) modulo the output's dims; `P` / `P(avg)` as uneven random
    summands), entering the backward at the output itself instead of at its gathered copy."""
    mesh = end.device_mesh
    places = normalise_placements(lib["cotangent"], end.ndim, mesh.ndim, True)
    layout = ArgumentLayout(g, places, tuple(mesh.shape), prep.dtype_name, seed, f"cot{k}")
    return layout.dtensor(local_of(layout), mesh).to(end.dtype)


def fresh_propagation_cache():
    """DTensor's sharding propagation cache emptied: a case's verdict must not depend on the cases this process
    ran before it (torch 2.5.1 keys the cache without the op's scalar arguments, so an earlier case's call can
    answer a later one's); only the case's own warm-up call may fill it."""
    from torch.distributed.tensor import DTensor

    cached = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding
    cache = getattr(cached, "cache", None)
    if cache is not None:
        cache.cache_clear()


def warm_up(prep, lib, seed, mesh, local_of):
    """The case's warm-up call (`library_op.warmup`): the op once on the same sharded inputs with the warm-up's
    edits in place of the case's own, forward and backward, its results discarded, so that the framework's
    caches hold that call's entries when the case's own call runs. Returns a note (none without a warm-up)."""
    from .. import sample_edits

    def run():
        warm = Prepared(find(lib), {**lib, "edits": lib["warmup"]}, seed, prep.dtype_name)
        # (With the gathered output's cotangent: `library_op.cotangent` is the case's own call's.)
        run_op(warm, {**lib, "cotangent": []}, seed, mesh, local_of)
        return warm.edit_notes

    return sample_edits.warm_up(lib.get("warmup"), run)


def starting_placements(lib, j, places, full, mesh_ndim):
    """Where argument j starts before a redistribution to `places` (`library_op.sources`; its placements when
    not given). A mesh dim whose placement is Partial starts there (DTensor makes a Partial only from
    Replicate), and a start has one partial reduction, the placements' own when they have one (DTensor does
    not convert one partial reduction into another): a source partial of another reduction starts replicated."""
    sources = lib.get("sources") or []
    if j >= len(sources):
        return places
    start = normalise_placements(sources[j], full.ndim, mesh_ndim, full.is_floating_point())
    # (normalise_placements gives every partial dim of one list the same reduction.)
    reduce = next((p for p in places if p.startswith("P")), None) or next((s for s in start if s.startswith("P")), None)
    return [p if p.startswith("P") else (s if not s.startswith("P") or s == reduce else "R") for s, p in zip(start, places)]


def redistributed(out, lib, mesh):
    """A DTensor output through the case's chain of redistributions (forward; autograd runs back)."""
    for places in lib.get("redistribute") or []:
        places = normalise_placements(places, out.ndim, mesh.ndim, False)
        out = out.redistribute(mesh, [placement_object(s) for s in places])
    return out


def per_rank(t, world):
    """Rank → float64 array of a (Local)Tensor that every rank computed."""
    from torch.distributed._local_tensor import LocalTensor

    if isinstance(t, LocalTensor):
        return {r: to_array(v) for r, v in t._local_tensors.items()}
    arr = to_array(t)
    return {r: arr for r in range(world)}


def run_sharded(prep, lib, seed):
    """Forward (and backward) of the op over the case's mesh, every rank simulated in this process:
    {"outs": [rank → array], "grads": {j: (places, rank → local array)}, "places": [placements per
    tensor argument], "mesh": mesh shape}."""
    mesh_shape = tuple(int(d) for d in lib["mesh"])
    world = math.prod(mesh_shape)
    mode, mesh = mode_and_mesh(mesh_shape)
    with mode:
        fresh_propagation_cache()
        notes = warm_up(prep, lib, seed, mesh, lambda layout: mode.rank_map(layout.local))
        fulls, grads, places = run_op(prep, lib, seed, mesh, lambda layout: mode.rank_map(layout.local))
        outs = [per_rank(f, world) for f in fulls]
        grads = {j: (pl, per_rank(g, world)) for j, (pl, g) in grads.items()}
    return {"outs": outs, "grads": grads, "places": places, "mesh": mesh_shape, "notes": notes}


def run_on_rank(prep, lib, seed, rank):
    """The same on a real process group (this process is rank `rank`): this rank's arrays."""
    from .torch_common import mesh as cached_mesh

    mesh_shape = tuple(int(d) for d in lib["mesh"])
    mesh = cached_mesh(mesh_shape, tuple(f"d{m}" for m in range(len(mesh_shape))))
    fresh_propagation_cache()
    notes = warm_up(prep, lib, seed, mesh, lambda layout: layout.local(rank))
    fulls, grads, places = run_op(prep, lib, seed, mesh, lambda layout: layout.local(rank))
    return {"outs": [to_array(f) for f in fulls], "grads": {j: (pl, to_array(g)) for j, (pl, g) in grads.items()},
            "places": places, "notes": notes}
