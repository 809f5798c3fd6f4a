# ---------------------------------------------------- sharded run and reference


def resolve_op():
    """The op: a public torch function, or PyTorch's OpInfo entry (torch.testing internals need expecttest)."""
    if OP_PATH:
        import importlib

        module, name = OP_PATH.rsplit(".", 1)
        return getattr(importlib.import_module(module), name)
    from torch.testing._internal.common_methods_invocations import op_db

    return next(o for o in op_db if o.name == OPINFO[0] and o.variant_test_name == OPINFO[1])


def placement(s):
    if s == "R":
        return Replicate()
    if s.startswith("S("):
        return Shard(int(s[2:-1]))
    return Partial("sum" if s == "P" else s[2:-1])


def dtype_of(j):
    return getattr(torch, ARG_DTYPES[j].replace("torch.", ""))


def call(op, tensors, structure=None):
    """The op on `tensors` with the case's non-tensor leaves and spec, or a warm-up's (`structure`)."""
    leaves = list(LEAVES if structure is None else structure["leaves"])
    for j, pos in enumerate(POSITIONS):
        leaves[pos] = tensors[j]
    args, kwargs = pytree.tree_unflatten(leaves, pytree.treespec_loads(SPEC if structure is None else structure["spec"]))
    return op(*args, **kwargs)


def redistributed(out):
    """A DTensor output through the case's redistributions (S(d) taken modulo its dimensions)."""
    for places in REDISTRIBUTE:
        places = [f"S({int(s[2:-1]) % out.ndim})" if s.startswith("S(") and out.ndim else ("R" if s.startswith("S(") else s)
                  for s in places]
        out = out.redistribute(out.device_mesh, [placement(s) for s in places])
    return out


def from_piece(local, mesh, places, shape):
    """A DTensor of global `shape` at `places` from this rank's piece of it."""
    return DTensor.from_local(local, mesh, [placement(s) for s in places], run_check=False,
                              shape=torch.Size(shape), stride=torch.empty(shape).stride())


def entering_cotangent(end, k, local):
    """Output k's cotangent as a DTensor at COTANGENT[k] from this rank's piece of it (library_op.cotangent)."""
    return from_piece(local.to(DTYPE), end.device_mesh, COTANGENT[k], tuple(end.shape)).to(end.dtype)


def forward_backward(op, tensors, leaves, gouts, structure=None, cot_locals=None):
    """Outputs (float64 arrays, after the redistributions and a gather on each) and the gradients of `leaves`
    from the upstream gradients: at the gathered outputs, or, for the outputs in `cot_locals` (this rank's
    pieces of their cotangents), entering at the outputs themselves at COTANGENT's placements."""
    cot_locals = cot_locals or {}
    outs = [viewed(o, VIEWS) for o in pytree.tree_leaves(call(op, tensors, structure)) if isinstance(o, torch.Tensor)]
    ends = [redistributed(o) if isinstance(o, DTensor) else o for o in outs]
    gathered = [e.full_tensor() if isinstance(e, DTensor) else e for e in ends]
    pairs = []
    for k, (e, f) in enumerate(zip(ends, gathered)):
        if k not in gouts or not f.requires_grad:
            continue
        entered = isinstance(e, DTensor) and k in cot_locals
        pairs.append((e, entering_cotangent(e, k, cot_locals[k])) if entered else (f, gouts[k]))
    grads = [None] * len(leaves)
    if pairs and leaves:
        grads = torch.autograd.grad([f for f, _ in pairs], leaves, [g.to(f.dtype) for f, g in pairs], allow_unused=True)
    return [to_numpy(f) for f in gathered], grads


def run_sharded(data, rank, op):
    mesh = init_device_mesh("cpu", MESH)
    tensors, leaves = [], []
    for j in range(len(POSITIONS)):
        full = data[f"arg{j}"]
        local = torch.tensor(data[f"arg{j}@rank{rank}"]).to(dtype_of(j))
        if j in GRAD_ARGS:
            local.requires_grad_(True)
            leaves.append(local)
        t = from_piece(local, mesh, STARTS[j], full.shape)
        if STARTS[j] != PLACEMENTS[j]:
            t = t.redistribute(mesh, [placement(s) for s in PLACEMENTS[j]])
        tensors.append(t)
    if WARMUP is not None:
        # The warm-up call, results discarded: the framework's caches then hold its entries.
        warm_gouts = {int(n[5:]): torch.tensor(data[n]).to(DTYPE) for n in data if n.startswith("wgout")}
        try:
            forward_backward(op, tensors, leaves, warm_gouts, WARMUP)
        except Exception as e:  # noqa: BLE001 - the warm-up's own outcome is not the case's
            print(f"rank {rank}: the warm-up call raised {type(e).__name__}: {str(e)[:200]}", flush=True)
    gouts = {int(n[4:]): torch.tensor(data[n]).to(DTYPE) for n in data if n.startswith("gout")}
    cot_locals = {int(n[4:].split("@")[0]): torch.tensor(data[n]) for n in data if n.startswith("cout") and n.endswith(f"@rank{rank}")}
    outs, grads = forward_backward(op, tensors, leaves, gouts, cot_locals=cot_locals)
    return outs, [None if g is None else to_numpy(g) for g in grads]


def grad_copies(data, j, pieces):
    """Argument j's gradient from the ranks' local pieces, one full copy per coordinate of its replicated and
    partial mesh dims (the ranks sharing it hold one copy between them, each piece where its shards put it):
    [(first rank of the copy, array)] in rank order. The fuzzer takes the first and holds the others to it."""
    places = STARTS[j]
    copies = {}
    for rank, piece in enumerate(pieces):
        coord = np.unravel_index(rank, MESH)
        key = tuple(int(coord[m]) for m, s in enumerate(places) if not s.startswith("S("))
        _, full = copies.setdefault(key, (rank, np.zeros(data[f"arg{j}"].shape)))
        ranges = [(0, n) for n in full.shape]
        for m, s in enumerate(places):
            if s.startswith("S("):
                d = int(s[2:-1])
                a, b = ranges[d]
                c = -(-(b - a) // MESH[m])
                lo = min(coord[m] * c, b - a)
                ranges[d] = (a + lo, a + min(lo + c, b - a))
        if np.shape(piece) != tuple(b - a for a, b in ranges):
            raise SystemExit(f"grad/{j}: rank {rank}'s local gradient has shape {np.shape(piece)}, its placements give {ranges}")
        full[tuple(slice(a, b) for a, b in ranges)] = piece
    return sorted(copies.values(), key=lambda c: c[0])


def run_reference(data, op):
    """The same op on one device in float64 on the same (rounded) values."""
    tensors, leaves = [], []
    for j in range(len(POSITIONS)):
        t = torch.tensor(data[f"arg{j}"]).to(torch.float64 if dtype_of(j).is_floating_point else dtype_of(j))
        if j in GRAD_ARGS:
            t.requires_grad_(True)
            leaves.append(t)
        tensors.append(t)
    gouts = {int(n[4:]): torch.tensor(data[n]) for n in data if n.startswith("gout")}
    outs, grads = forward_backward(op, tensors, leaves, gouts)
    result = {f"out/{k}": o for k, o in enumerate(outs)}
    result.update({f"grad/{j}": to_numpy(g) for j, g in zip(GRAD_ARGS, grads) if g is not None})
    return result


def run_refused(rank, data, op):
    """Single-device torch refuses the call (REFUSAL): MISMATCH when every rank's sharded op returns a result.
    A rank whose sharded op raises (or whose peers did) has seen the refusal: it says so and exits at once,
    since its peers may be waiting in a collective it will never join."""
    try:
        run_sharded(data, rank, op)
        dist.gather_object(None, [None] * WORLD if rank == 0 else None, dst=0)
    except Exception as e:  # noqa: BLE001 - a refusal is the expected outcome
        print(f"OK: the sharded op refuses it too (rank {rank}: {type(e).__name__}: {str(e)[:200]})", flush=True)
        os._exit(0)
    if rank != 0:
        return None
    try:
        run_reference(data, op)
    except Exception as e:  # noqa: BLE001
        print(f"single-device torch: {type(e).__name__}: {str(e)[:300]}")
    else:
        print("OK: single-device torch runs this call here (the refusal the fuzzer saw did not show)", flush=True)
        return 0
    print("MISMATCH: the sharded op returned a result on every rank where single-device torch refuses the call", flush=True)
    return 1


def run(rank):
    data = load_blob()
    op = resolve_op()
    if REFUSAL is not None:
        return run_refused(rank, data, op)
    outs, grads = run_sharded(data, rank, op)
    gathered = [None] * WORLD if rank == 0 else None
    dist.gather_object((outs, grads), gathered, dst=0)
    if rank != 0:
        return None
    # Every rank gathers each output in full (a copy per rank); a gradient has a copy per coordinate of its
    # replicated and partial mesh dims. The first copy is compared with the reference, the others with it.
    replicas = {f"out/{k}": [(r, g[0][k]) for r, g in enumerate(gathered)] for k in range(len(outs))}
    for i, j in enumerate(GRAD_ARGS):
        pieces = [g[1][i] for g in gathered]
        if all(p is not None for p in pieces):
            replicas[f"grad/{j}"] = grad_copies(data, j, pieces)
    sharded = {name: copies[0][1] for name, copies in replicas.items()}
    reference = run_reference(data, op)
    dump(sharded, reference)
    scale_of = compare_replicas(replicas, sharded, reference)
    bounds = {n: b for n, b in BOUNDS.items() if n in sharded and n in reference}
    return report(sharded, reference, bounds, scale_of)
