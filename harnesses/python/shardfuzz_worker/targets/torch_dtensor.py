"""torch-dtensor: op-level cases on a 2-D DeviceMesh [dp, tp] with Shard / Replicate / Partial inputs.

Every rank builds its local piece of each input from the full tensor the fuzzer generated (uneven
shards as torch.chunk makes them; over Partial mesh dims the value is split into uneven random summands,
a different nonzero one per coordinate, that add up to it exactly: see partial.py), wraps it with
`DTensor.from_local`, runs the op, and calls `full_tensor()` on the result. The gradient of each input is
the gradient of its local piece (for a summand, the gradient of the full value); the fuzzer gets them
assembled, with the copies on replicated / partial coordinates as replicas that must agree.
"""

import math

import numpy as np

from ..partial import partial_parts
from .base import HarnessError, assemble, dtype_name, grad_or_fail, parallel, shard_ranges
from .torch_common import TorchTarget, mesh, to_numpy, torch_dtype

LN_EPS = 1e-5


def simulates_ranks():
    """Whether this torch can run every rank of a mesh in one process (torch.distributed._local_tensor)."""
    import importlib.util

    return importlib.util.find_spec("torch.distributed._local_tensor") is not None


def _placements(case, name):
    return case["op"].get("placements", {}).get(name, ["R", "R"])


def _summand(case, name, full, places, coord, mesh_shape):
    """This coordinate's summand of `full` over the Partial mesh dims of `places` (`full` itself if none)."""
    pdims = [m for m, pl in enumerate(places) if pl == "P"]
    if not pdims:
        return full
    parts = partial_parts(full, [mesh_shape[m] for m in pdims], dtype_name(case), case["data"]["seed"], name)
    return parts[tuple(coord[m] for m in pdims)]


class TorchDTensor(TorchTarget):
    name = "torch-dtensor"
    #: This coordinator runs autograd itself (library-op cases), and autograd's threads do not survive a
    #: fork: ranks come from a fork server, a clean process that has imported torch once. Nor does the
    #: simulation's fake process group reach them, so it is never torn down: destroying it left cached
    #: sharding decisions naming groups that no longer exist ("Could not resolve the process group").
    start_method = "forkserver"
    #: OpInfo's database too: importing it takes each fresh rank seconds (a confirmation starts ranks).
    preload = ("torch", "torch.distributed.tensor", "torch.testing._internal.common_methods_invocations",
               "shardfuzz_worker.targets.torch_dtensor")

    def __init__(self):
        super().__init__()
        import os

        import torch

        # DTensor's own code: sharding propagation, op strategies, redistribution.
        self.coverage_prefixes = (os.path.join(os.path.dirname(torch.__file__), "distributed", "tensor") + os.sep,)

    def vocabulary(self):
        from .torch_opinfo import vocabulary

        return vocabulary()

    def world(self, case):
        # Library ops run every rank in this process (LocalTensorMode, where this torch has it; on gloo
        # ranks where it does not); built-in op cases on gloo ranks.
        if "library_op" in case:
            return 0 if simulates_ranks() else self.process_world(case)
        return super().world(case)

    def versions(self):
        v = super().versions()
        v["library-op-ranks"] = "LocalTensorMode (one process)" if simulates_ranks() else "gloo processes"
        return v

    def run_local(self, case, inputs):
        from .torch_library_op import run

        return run(case)

    def single_device_seconds(self, case):
        if "library_op" not in case:
            return None
        from .torch_library_op import single_device_seconds

        return single_device_seconds(case)

    def single_device_refusal(self, case):
        if "library_op" not in case:
            return None
        from .torch_library_op import single_device_refusal

        return single_device_refusal(case)

    def process_world(self, case):
        """Ranks of a library-op case confirmed on real gloo ranks (one process each)."""
        if "library_op" in case:
            return math.prod(int(d) for d in case["library_op"]["mesh"])
        return super().world(case)

    def unsupported(self, case):
        if "library_op" in case:
            from .torch_library_op import unsupported

            return unsupported(case)
        if "op" not in case:
            return "torch-dtensor runs op-level cases only"
        p = parallel(case)
        if p["pp"] > 1 or p["cp"] > 1 or p["ep"] > 1:
            return "op cases shard over the [dp, tp] mesh only"
        if case["op"]["kind"] == "max" and case["data"].get("distribution") == "integers":
            return "the gradient of max with tied maxima is implementation-defined"
        return None

    def run_rank(self, rank, world, case, inputs):
        if "library_op" in case:
            from .torch_library_op import run_rank

            return run_rank(rank, case)
        import torch
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        p = parallel(case)
        mshape = (p["dp"], p["tp"])
        dm = mesh(mshape, ("dp", "tp"))
        coord = (rank // p["tp"], rank % p["tp"])
        dt = torch_dtype(dtype_name(case))
        op = case["op"]
        kind = op["kind"]

        def placement(s):
            if s == "R":
                return Replicate()
            if s == "P":
                return Partial()
            return Shard(int(s[2:-1]))

        leaves, pieces = {}, {}

        def dtensor(name, full):
            places = _placements(case, name)
            ranges = shard_ranges(full.shape, places, coord, mshape)
            summand = _summand(case, name, full, places, coord, mshape)
            local = summand[tuple(slice(a, b) for a, b in ranges)].copy()
            leaf = torch.tensor(local, dtype=dt, requires_grad=True)
            leaves[name] = leaf
            pieces[name] = ranges
            return DTensor.from_local(
                leaf,
                dm,
                [placement(s) for s in places],
                run_check=False,
                shape=torch.Size(full.shape),
                stride=torch.empty(full.shape).stride(),
            )

        def ids(arr):
            t = torch.tensor(arr.astype(np.int64))
            return DTensor.from_local(t, dm, [Replicate(), Replicate()], run_check=False)

        out = apply_op(op, lambda n: dtensor(n, inputs[n]), lambda n: ids(inputs[n]))
        full = out.full_tensor()
        seed_backward(full, torch.tensor(inputs["grad_out"], dtype=dt))
        grads = {}
        for name, leaf in leaves.items():
            grads[name] = (pieces[name], to_numpy(grad_or_fail(name, leaf.grad)))
        features = [f"op:{kind}"] + [f"place:{n}:{'/'.join(_placements(case, n))}" for n in leaves]
        baseline = single_device(case, inputs, dt) if rank == 0 else None
        shapes = {name: tuple(inputs[name].shape) for name in leaves}
        return {"out": to_numpy(full) if rank == 0 else None, "grads": grads, "shapes": shapes, "coord": coord,
                "features": features,
                "baseline": baseline}

    def combine(self, case, outs):
        if "library_op" in case:
            from .torch_library_op import combine_ranks

            return combine_ranks(case, outs)
        tensors = {"out": outs[0]["out"]}
        replicas = {}
        for name in outs[0]["grads"]:
            shape = outs[0]["shapes"][name]
            places = _placements(case, name)
            free = [m for m, pl in enumerate(places) if not pl.startswith("S(")]
            # Ranks that agree on the coordinates of every replicated / partial mesh dim hold one
            # complete copy between them; each copy must agree with the first.
            groups = {}
            for r, o in enumerate(outs):
                groups.setdefault(tuple(o["coord"][m] for m in free), []).append((r, o))
            copies = [(members[0][0], assemble(shape, [o["grads"][name] for _, o in members])) for members in groups.values()]
            copies.sort(key=lambda c: c[0])
            tensors[f"grad/{name}"] = copies[0][1]
            if len(copies) > 1:
                replicas[f"grad/{name}"] = copies
        for name, v in (outs[0]["baseline"] or {}).items():
            tensors[f"baseline/{name}"] = v
        return {"tensors": tensors, "replicas": replicas, "features": outs[0]["features"]}


def apply_op(op, x, ids):
    """The op on tensors `x(name)` (DTensors or plain tensors) and integer ids `ids(name)`."""
    import torch.nn.functional as F

    kind, dim = op["kind"], op.get("dim", 1)
    if kind == "matmul":
        return x("a") @ x("b")
    if kind == "linear":
        return x("x") @ x("w") + x("bias")
    if kind == "sum":
        return x("x").sum(dim=dim, keepdim=True)
    if kind == "max":
        return x("x").max(dim=dim, keepdim=True).values
    if kind == "softmax":
        return F.softmax(x("x"), dim=dim)
    if kind == "layernorm":
        xx = x("x")
        return F.layer_norm(xx, (xx.shape[-1],), x("w"), x("bias"), eps=LN_EPS)
    if kind == "embedding":
        return F.embedding(ids("tokens"), x("table"))
    if kind == "cross_entropy":
        return F.cross_entropy(x("logits"), ids("targets"), reduction="none").unsqueeze(1)
    if kind == "reshape":
        return x("x").reshape(tuple(op["new_shape"]))
    if kind == "transpose":
        return x("x").t()
    raise HarnessError(f"op {kind} is not implemented (unsupported_op should have refused it)")


def single_device(case, inputs, dt):
    """The op with plain tensors on one device in the case dtype: the framework's own rounding."""
    import torch

    leaves = {}

    def x(name):
        leaves[name] = torch.tensor(inputs[name], dtype=dt, requires_grad=True)
        return leaves[name]

    out = apply_op(case["op"], x, lambda n: torch.tensor(inputs[n].astype(np.int64)))
    out.backward(torch.tensor(inputs["grad_out"], dtype=dt).reshape(out.shape))
    tensors = {"out": to_numpy(out)}
    for name, leaf in leaves.items():
        tensors[f"grad/{name}"] = to_numpy(grad_or_fail(f"{name} (single device)", leaf.grad))
    return tensors


def seed_backward(full, cotangent):
    """The backward from the op's gathered output, seeded with the case's cotangent in the output's shape. An output
    the framework gathered to another size than the op's (DTensor of torch 2.4 with uneven shards) fails in torch's
    reshape, natively, under this function: the framework's failure (validation.NATIVE_CALLERS), not ours."""
    full.backward(cotangent.reshape(full.shape))


TARGET = TorchDTensor()
