"""A library-op case end to end for torch-dtensor: the OpInfo sample, the single-device computations the
oracle judges with, the sharded run, and the tensors the fuzzer compares.

Tensors sent back: `out/k` (the k-th tensor output, rank 0's gathered copy; the other ranks' copies as
replicas) and `grad/j` (the gradient of the j-th tensor argument, assembled from the ranks' pieces; the
copies held on replicated / partial coordinates as replicas), under the same names `reference/…` (float64
on the rounded inputs), `baseline/…` (the case dtype) and `member/perturbed/…`, `member/reordered/…` (the
noise ensemble: float64 on inputs moved by ±u, and the case dtype on inputs moved by ±u). Integer outputs
(indices, masks) are compared in float64 cases only: in low precision a tie the rounding creates may break
either way in a correct implementation.
"""

import contextlib
import math

import numpy as np

from .base import assemble, normalise_placements, shard_ranges
from .torch_local_dtensor import run_on_rank, run_sharded, starting_placements
from .torch_opinfo import Prepared, UnsupportedSample, dtype_supported, find, torch_dtype, unit_roundoff
from .torch_release import refuses_kept_partials

class Unsupported(Exception):
    pass


class Refused(Unsupported):
    """The single-device op refuses the sample in float64 (an edit made it invalid, or the sample is)."""


def unsupported(case):
    lib = case["library_op"]
    try:
        op = find(lib)
    except KeyError as e:
        return str(e)
    if not dtype_supported(op, case["train"]["dtype"], bool(lib.get("backward", True)) and op.supports_autograd):
        return f"{op.name} has no {case['train']['dtype']} CPU kernel (or backward) in this torch"
    try:
        # Decided here, before any rank runs: the sample itself (drawn once, cached).
        prep = Prepared(op, lib, int(case["data"]["seed"]), case["train"]["dtype"])
    except UnsupportedSample as e:
        return str(e)
    if partial_redistributed(prep, lib) and refuses_kept_partials():
        return ("this torch's DTensor.redistribute refuses placements holding a Partial (torch 2.4.1 and 2.5.1: \"for internal "
                "use only\"): an argument that starts at its sources and holds a Partial cannot be set up")
    return None


def partial_redistributed(prep, lib):
    """Whether an argument is redistributed from its sources to placements holding a Partial."""
    given, mesh_ndim = lib.get("placements") or [], len(lib["mesh"])
    for j, i in enumerate(prep.positions):
        full = prep.leaves[i]
        places = normalise_placements(given[j] if j < len(given) else [], full.ndim, mesh_ndim, full.is_floating_point())
        if any(p.startswith("P") for p in places) and starting_placements(lib, j, places, full, mesh_ndim) != places:
            return True
    return False


def single_device(prep, dtype_name, notes):
    """Reference, baseline and members: {prefix: tensors}; Unsupported when the plain op fails on the sample
    (a baseline or member that fails is left out, with a note)."""
    import torch

    u = unit_roundoff(dtype_name)
    runs = {"reference": (torch.float64, None), "member/perturbed": (torch.float64, u)}
    if dtype_name != "f64":
        runs["baseline"] = (torch_dtype(dtype_name), None)
        runs["member/reordered"] = (torch_dtype(dtype_name), u)
    out = {}
    for prefix, (dt, perturb) in runs.items():
        try:
            out[prefix] = prep.run(dt, perturb)
        except Exception as e:  # noqa: BLE001 - the op itself refuses this sample on one device
            if prefix in ("reference", "baseline"):
                # (A sharded run cannot be asked to do what the op refuses on one device.)
                raise (Refused if prefix == "reference" else Unsupported)(f"the single-device op fails on this sample in {'float64' if prefix == 'reference' else dtype_name}: "
                                  f"{type(e).__name__}: {str(e)[:200]}") from e
            notes.append(f"{prefix}: the single-device run failed ({type(e).__name__}: {str(e)[:120]}); left out")
    if not out["reference"]:
        raise Unsupported("the op returns no tensor (a Python number or an empty structure): nothing to compare")
    # (Per sample and edits too: an edit can turn a deterministic call random, rrelu's `training` flag.)
    key = (prep.op.name, prep.op.variant_test_name, prep.index, prep.edits_key)
    if key not in _DETERMINISTIC:
        with seeds_free():
            first, again = prep.run(torch.float64, rng_seed=0), prep.run(torch.float64, rng_seed=1)
        _DETERMINISTIC[key] = all(np.array_equal(again.get(n), t, equal_nan=True) for n, t in first.items())
    if not _DETERMINISTIC[key]:
        raise Unsupported("the op's result is random: two float64 runs on the same inputs under different seeds differ")
    return out


@contextlib.contextmanager
def seeds_free():
    """OpInfo calls its random ops through `wrapper_set_seed` (the seed fixed at 42), which hides their
    randomness from the check (and a sharded run draws its own numbers): a plain call while the check runs."""
    from torch.testing._internal import common_methods_invocations as cmi

    saved = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
    try:
        yield
    finally:
        cmi.wrapper_set_seed = saved


#: Per op, sample and edits: whether two float64 runs under different seeds agreed.
_DETERMINISTIC = {}


def run(case):
    lib, seed, dtype_name = case["library_op"], int(case["data"]["seed"]), case["train"]["dtype"]
    notes = []
    try:
        prep = Prepared(find(lib), lib, seed, dtype_name)
        notes += prep.edit_notes
        single = single_device(prep, dtype_name, notes)
    except Refused as e:
        return refused_both_ways(e, lambda: run_sharded(prep, lib, seed))
    except (Unsupported, UnsupportedSample) as e:
        return {"status": "unsupported", "reason": str(e)}
    # A failure is classified like any rank's (validation.py); the fuzzer confirms a crash on real ranks
    # before it reports it (an op the simulation cannot run per rank is told apart there).
    sharded = run_sharded(prep, lib, seed)
    return combine(case, prep, single, sharded, notes)


def single_device_refusal(case):
    """Why the single-device float64 op refuses the case's sample, or None (see Target.single_device_refusal)."""
    import torch

    lib = case["library_op"]
    try:
        prep = Prepared(find(lib), lib, int(case["data"]["seed"]), case["train"]["dtype"])
    except (KeyError, UnsupportedSample):
        return None
    try:
        prep.run(torch.float64, None)
    except Exception as e:  # noqa: BLE001 - the op itself refuses this sample on one device
        return f"the single-device op fails on this sample in float64: {type(e).__name__}: {str(e)[:200]}"
    return None


def single_device_seconds(case):
    """Seconds the case's op (its sample, edits and views) takes on one device in float64, forward and backward,
    drawing the sample included (as the JAX targets count it)."""
    import time

    import torch

    lib = case["library_op"]
    start = time.perf_counter()
    prep = Prepared(find(lib), lib, int(case["data"]["seed"]), case["train"]["dtype"])
    prep.run(torch.float64, None)
    return time.perf_counter() - start


def run_rank(rank, case):
    """This rank's part of the case on a real process group (confirming what the simulation found)."""
    lib, seed = case["library_op"], int(case["data"]["seed"])
    prep = Prepared(find(lib), lib, seed, case["train"]["dtype"])
    return run_on_rank(prep, lib, seed, rank)


def combine_ranks(case, outs):
    """The ranks' results of `run_rank` joined with the single-device computations, as `run` sends them."""
    lib, seed, dtype_name = case["library_op"], int(case["data"]["seed"]), case["train"]["dtype"]
    prep = Prepared(find(lib), lib, seed, dtype_name)
    notes = ["ran on real process-group ranks (gloo), one process per rank"] + prep.edit_notes
    try:
        single = single_device(prep, dtype_name, notes)
    except Refused as e:
        # Every rank completed (a failed rank is classified before this): the sharded op accepted it.
        return refused_both_ways(e, lambda: None)
    except Unsupported as e:
        return {"status": "unsupported", "reason": str(e)}
    sharded = {
        "outs": [{r: o["outs"][k] for r, o in enumerate(outs)} for k in range(len(outs[0]["outs"]))],
        "grads": {j: (places, {r: o["grads"][j][1] for r, o in enumerate(outs)}) for j, (places, _) in outs[0]["grads"].items()},
        "places": outs[0]["places"],
        "mesh": tuple(int(d) for d in lib["mesh"]),
        "notes": outs[0].get("notes") or [],
    }
    return combine(case, prep, single, sharded, notes)


def refused_both_ways(refusal, run_sharded_op):
    """A sample the single-device op refuses must be refused sharded too (an out-of-range dim or index, a
    negative size): `rejected` when it is, `divergent` when the sharded op returns a result instead. An
    exception from our own code stays a harness error."""
    from ..validation import classify, describe

    try:
        run_sharded_op()
    except Exception as e:  # noqa: BLE001 - classified below
        kind, _ = classify("torch-dtensor", describe(e))
        if kind == "harness_error":
            raise
        return {"status": "rejected", "reason": f"{refusal}; sharded too: {type(e).__name__}: {str(e)[:200]}"}
    return {"status": "divergent", "reason": f"the sharded op returned a result where {refusal}"}


def combine(case, prep, single, sharded, notes):
    tensors, replicas = {}, {}
    notes = notes + list(sharded.get("notes") or [])
    reference = single["reference"]
    low = case["train"]["dtype"] != "f64"
    for k, copies in enumerate(sharded["outs"]):
        name = f"out/{k}"
        ranks = sorted(copies)
        tensors[name] = copies[ranks[0]]
        if len(ranks) > 1:
            replicas[name] = [(r, copies[r]) for r in ranks]
    for j, (places, pieces) in sharded["grads"].items():
        shape = np.shape(reference.get(f"grad/{j}", next(iter(pieces.values()))))
        wrong = misshapen(shape, places, pieces, sharded["mesh"])
        if wrong:
            # Sent as it came: the oracle reports the shape against the reference's.
            notes.append(f"grad/{j}: {wrong}")
            tensors[f"grad/{j}"] = pieces[min(pieces)]
            continue
        copies = grad_copies(shape, places, pieces, sharded["mesh"])
        tensors[f"grad/{j}"] = copies[0][1]
        if len(copies) > 1:
            replicas[f"grad/{j}"] = copies
    for name, ref in reference.items():
        if name not in tensors:
            notes.append(f"{name}: DTensor produced no such tensor")
            tensors[name] = np.full(np.shape(ref), np.nan)
    for name in uncomparable_integer_outputs(prep, single, low):
        notes.append(f"{name}: an integer output the case dtype's rounding decides (the single-device run in the "
                     f"case dtype differs from float64): not compared")
        for run in single.values():
            run.pop(name, None)
    if not single["reference"]:
        return {"status": "unsupported", "reason": "only integer outputs, decided by the case dtype's rounding: nothing to compare"}
    for prefix, run in single.items():
        for name, t in run.items():
            tensors[f"{prefix}/{name}"] = t
    return {"tensors": tensors, "replicas": replicas, "features": features(case, prep, sharded), "notes": notes}


def uncomparable_integer_outputs(prep, single, low):
    """Integer outputs (indices, masks) whose value the case dtype's rounding decides: in low precision, those
    where the single-device run in the case dtype disagrees with float64 (a tie or an order that rounding
    creates may break either way in a correct implementation). Outputs of comparisons alone stay exact."""
    if not low:
        return []
    baseline = single.get("baseline", {})
    return [n for n in sorted(prep.integer_outputs)
            if n in single["reference"] and not np.array_equal(baseline.get(n), single["reference"][n])]


def misshapen(shape, places, pieces, mesh_shape):
    """Why a rank's gradient piece cannot be the piece its placements give it, or None."""
    for rank in sorted(pieces):
        ranges = shard_ranges(shape, places, np.unravel_index(rank, mesh_shape), mesh_shape)
        want = tuple(b - a for a, b in ranges)
        if np.shape(pieces[rank]) != want:
            return f"rank {rank}'s local gradient has shape {list(np.shape(pieces[rank]))}, its placements {places} give {list(want)}"
    return None


def grad_copies(shape, places, pieces, mesh_shape):
    """Full copies of one argument's gradient: ranks that share their coordinates on every replicated or
    partial mesh dim hold one copy between them (in rank order)."""
    free = [m for m, s in enumerate(places) if not s.startswith("S(")]
    groups = {}
    for rank in sorted(pieces):
        coord = np.unravel_index(rank, mesh_shape)
        ranges = shard_ranges(shape, places, coord, mesh_shape)
        groups.setdefault(tuple(int(coord[m]) for m in free), []).append((rank, (ranges, pieces[rank])))
    copies = [(members[0][0], assemble(shape, [p for _, p in members])) for members in groups.values()]
    return sorted(copies, key=lambda c: c[0])


def kind(placement):
    """A placement's kind for features: `S` (any dim), `R`, `P`, `P(avg)` …."""
    return "S" if placement.startswith("S(") else placement


def features(case, prep, sharded):
    lib = case["library_op"]
    mesh = sharded["mesh"]
    out = [f"lib:op:{prep.op.name}", f"lib:family:{type(prep.op).__name__}", f"lib:mesh:{len(mesh)}d",
           f"lib:args:{len(prep.positions)}", f"lib:outs:{len(sharded['outs'])}"]
    for j, places in enumerate(sharded["places"]):
        full = prep.leaves[prep.positions[j]]
        out.append(f"lib:place:{j}:{'/'.join(places)}")
        for m, s in enumerate(places):
            if s.startswith("S("):
                n = full.shape[int(s[2:-1])]
                out.append("lib:shard:empty" if n < mesh[m] else ("lib:shard:uneven" if n % mesh[m] else "lib:shard:even"))
            elif s.startswith("P"):
                out.append(f"lib:partial:{s}")
    if lib.get("backward", True) and prep.grad_args:
        out.append("lib:backward")
    for places in lib.get("redistribute") or []:
        out.append(f"lib:redistribute:{'/'.join(places)}")
    out += [f"lib:view:{v}" for v in lib.get("views") or []]
    if lib.get("warmup"):
        out.append("lib:warmup")
    if lib.get("cotangent") and lib.get("backward", True) and prep.grad_args:
        out.append(f"lib:cotangent:{'/'.join(kind(s) for s in lib['cotangent'])}")
    for j, places in enumerate(sharded["places"]):
        start = starting_placements(lib, j, places, prep.leaves[prep.positions[j]], len(mesh))
        out += [f"lib:from:{kind(a)}>{kind(b)}" for a, b in zip(start, places) if a != b]
    out.append(f"lib:world:{math.prod(mesh)}")
    return sorted(set(out))
