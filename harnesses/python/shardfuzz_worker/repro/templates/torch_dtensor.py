# ---------------------------------------------------- sharded run and reference


def run_sharded(data, rank):
    """The op on DTensors, as the fuzzer's torch-dtensor ranks run it: every rank wraps its local piece of
    each input (its Partial summand where a placement is P) with DTensor.from_local, runs the op, gathers the
    output with full_tensor() and backpropagates grad_out. Returns the output and this rank's local gradients."""
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    coord = (rank // TP, rank % TP)
    leaves, ranges = {}, {}

    def placement(s):
        return Replicate() if s == "R" else Partial() if s == "P" else Shard(int(s[2:-1]))

    def dtensor(name):
        full, places = data[name], PLACEMENTS[name]
        ranges[name] = shard_ranges(full.shape, places, coord, (DP, TP))
        pdims = [m for m, pl in enumerate(places) if pl == "P"]
        summand = data[f"{name}@summands"][tuple(coord[m] for m in pdims)] if pdims else full
        local = summand[tuple(slice(a, b) for a, b in ranges[name])].copy()
        leaves[name] = torch.tensor(local, dtype=DTYPE, requires_grad=True)
        return DTensor.from_local(leaves[name], mesh, [placement(s) for s in places], run_check=False,
                                  shape=torch.Size(full.shape), stride=torch.empty(full.shape).stride())

    def ids(name):
        return DTensor.from_local(torch.tensor(data[name].astype(np.int64)), mesh, [Replicate(), Replicate()],
                                  run_check=False)

    out = apply_op(OP, dtensor, ids).full_tensor()
    out.backward(torch.tensor(data["grad_out"], dtype=DTYPE).reshape(out.shape))
    for name, leaf in leaves.items():
        if leaf.grad is None:
            raise RuntimeError(f"no gradient came back for {name}")
    return to_numpy(out), {name: (ranges[name], to_numpy(leaf.grad)) for name, leaf in leaves.items()}


def assemble_grads(data, pieces):
    """Each input's gradient from the ranks' pieces: the copy held by the ranks at coordinate 0 of every mesh
    dim the input is not sharded over (the fuzzer takes that copy; the others are its replicas)."""
    grads = {}
    for name, places in PLACEMENTS.items():
        free = [m for m, pl in enumerate(places) if not pl.startswith("S(")]
        full = np.zeros(data[name].shape)
        for rank, rank_pieces in enumerate(pieces):
            coord = (rank // TP, rank % TP)
            if all(coord[m] == 0 for m in free):
                rng, local = rank_pieces[name]
                full[tuple(slice(a, b) for a, b in rng)] = local
        grads[f"grad/{name}"] = full
    return grads


def run_reference(data):
    """The same op on plain float64 tensors in this one process: the single-device reference."""
    leaves = {}

    def x(name):
        leaves[name] = torch.tensor(data[name], dtype=torch.float64, requires_grad=True)
        return leaves[name]

    out = apply_op(OP, x, lambda n: torch.tensor(data[n].astype(np.int64)))
    out.backward(torch.tensor(data["grad_out"], dtype=torch.float64).reshape(out.shape))
    return {"out": to_numpy(out), **{f"grad/{n}": to_numpy(leaf.grad) for n, leaf in leaves.items()}}


def run(rank):
    data = load_blob()
    out, pieces = run_sharded(data, rank)
    gathered = [None] * WORLD if rank == 0 else None
    dist.gather_object(pieces, gathered, dst=0)
    if rank != 0:
        return None
    sharded = {"out": out, **assemble_grads(data, gathered)}
    reference = run_reference(data)
    dump(sharded, reference)
    return report(sharded, reference, BOUNDS)
