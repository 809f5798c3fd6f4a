# ------------------------------------------------------ the data-parallel ranks


def run(rank):
    """Every rank trains on its rows of the batch (run_sharded); rank 0 gathers their results as the fuzzer
    does (logits rows stitched; losses, gradients and parameters from rank 0) and compares."""
    data = load_blob()
    mine = run_sharded(data, rank)
    outs = [None] * WORLD if rank == 0 else None
    dist.gather_object(mine, outs, dst=0)
    if rank != 0:
        return None
    combined = combine_dp(CASE, outs, [])
    if "tensors" not in combined:
        return disagreement(combined["reason"])
    sharded = combined["tensors"]
    reference = run_reference(data)
    dump(sharded, reference)
    scale_of = compare_replicas(combined["replicas"], sharded, reference)
    return report(sharded, reference, BOUNDS, scale_of)
