# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """Colossal-AI's shardformer model (ColossalModel above) over the tp ranks, as the fuzzer's colossalai-tp
    ranks run it: the worker's CPU shims installed after the gloo process group, then the worker's training loop
    (run_colossalai) on the whole batch. Returns this rank's slices."""
    install_shims()
    return run_colossalai(CASE, data, rank, WORLD)


def run(rank):
    """Rank 0 gathers the ranks' slices, assembles them as the fuzzer does (sharded tensors concatenated,
    replicated ones from rank 0) and compares."""
    data = load_blob()
    mine = run_sharded(data, rank)
    outs = [None] * WORLD if rank == 0 else None
    dist.gather_object(mine, outs, dst=0)
    if rank != 0:
        return None
    sharded = combine_dp(CASE, assemble_outputs(CASE, outs), [])["tensors"]
    reference = run_reference(data)
    dump(sharded, reference)
    return report(sharded, reference, BOUNDS)
