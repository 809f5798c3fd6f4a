"""torch-dtensor: op-level cases on a 2-D DeviceMesh [dp, tp] with Shard / Replicate / Partial inputs.

Every rank builds its local piece of each input from the full tensor the fuzzer generated (uneven
shards as torch.chunk makes them; a Partial dimension holds the value on coordinate 0 and zeros
elsewhere), wraps it with `DTensor.from_local`, runs the op, and calls `full_tensor()` on the result.
The gradient of each input is the gradient of its local piece; the fuzzer gets them assembled, with
the copies on replicated / partial coordinates as replicas that must agree.
"""

import numpy as np

from .base import assemble, chunk_range, dtype_name, parallel
from .torch_common import TorchTarget, mesh, to_numpy, torch_dtype

LN_EPS = 1e-5


def _placements(case, name):
    return case["op"].get("placements", {}).get(name, ["R", "R"])


def _local_ranges(shape, places, coord, mesh_shape):
    ranges = [(0, n) for n in shape]
    for mdim, pl in enumerate(places):
        if pl.startswith("S("):
            d = int(pl[2:-1])
            a, b = ranges[d]
            lo, hi = chunk_range(b - a, mesh_shape[mdim], coord[mdim])
            ranges[d] = (a + lo, a + hi)
    return ranges


def _is_partial_zero(places, coord):
    return any(pl == "P" and coord[m] != 0 for m, pl in enumerate(places))


class TorchDTensor(TorchTarget):
    name = "torch-dtensor"
    rejection_types = ("NotImplementedError",)

    def unsupported(self, case):
        if "op" not in case:
            return "torch-dtensor runs op-level cases only"
        p = parallel(case)
        if p["pp"] > 1 or p["cp"] > 1 or p["ep"] > 1:
            return "op cases shard over the [dp, tp] mesh only"
        if case["op"]["kind"] == "max" and case["data"].get("distribution") == "integers":
            return "the gradient of max with tied maxima is implementation-defined"
        return None

    def run_rank(self, rank, world, case, inputs):
        import torch
        import torch.nn.functional as F
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
            ranges = _local_ranges(full.shape, places, coord, mshape)
            local = full[tuple(slice(a, b) for a, b in ranges)].copy()
            if _is_partial_zero(places, coord):
                local[...] = 0.0
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

        dim = op.get("dim", 1)
        x = lambda n: dtensor(n, inputs[n])  # noqa: E731
        if kind == "matmul":
            out = x("a") @ x("b")
        elif kind == "linear":
            out = x("x") @ x("w") + x("bias")
        elif kind == "sum":
            out = x("x").sum(dim=dim, keepdim=True)
        elif kind == "max":
            out = x("x").max(dim=dim, keepdim=True).values
        elif kind == "softmax":
            out = F.softmax(x("x"), dim=dim)
        elif kind == "layernorm":
            xx = x("x")
            out = F.layer_norm(xx, (xx.shape[-1],), x("w"), x("bias"), eps=LN_EPS)
        elif kind == "embedding":
            out = F.embedding(ids(inputs["tokens"]), x("table"))
        elif kind == "cross_entropy":
            out = F.cross_entropy(x("logits"), ids(inputs["targets"]), reduction="none").unsqueeze(1)
        elif kind == "reshape":
            out = x("x").reshape(tuple(op["new_shape"]))
        elif kind == "transpose":
            out = x("x").t()
        else:
            raise NotImplementedError(f"op {kind}")
        full = out.full_tensor()
        full.backward(torch.tensor(inputs["grad_out"], dtype=dt).reshape(full.shape))
        grads = {}
        for name, leaf in leaves.items():
            g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            grads[name] = (pieces[name], to_numpy(g))
        features = [f"op:{kind}"] + [f"place:{n}:{'/'.join(_placements(case, n))}" for n in leaves]
        return {"out": to_numpy(full) if rank == 0 else None, "grads": grads, "coord": coord, "features": features}

    def combine(self, case, outs):
        tensors = {"out": outs[0]["out"]}
        replicas = {}
        for name in outs[0]["grads"]:
            shape = _full_shape(case, name)
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
        return {"tensors": tensors, "replicas": replicas, "features": outs[0]["features"]}


def _full_shape(case, name):
    op = case["op"]
    shape = [int(s) for s in op["shape"]]
    s = lambda i: shape[i] if i < len(shape) else 1  # noqa: E731
    kind = op["kind"]
    table = {
        "matmul": {"a": (s(0), s(1)), "b": (s(1), s(2))},
        "linear": {"x": (s(0), s(1)), "w": (s(1), s(2)), "bias": (s(2),)},
        "layernorm": {"x": (s(0), s(1)), "w": (s(1),), "bias": (s(1),)},
        "embedding": {"table": (s(1), s(2))},
        "cross_entropy": {"logits": (s(0), s(1))},
    }
    return table.get(kind, {"x": (s(0), s(1))})[name]


TARGET = TorchDTensor()
