# ------------------------------------------------------- the stages, judged


def judge_stages(rank, mine, data):
    """Rank 0 gathers every rank's results as the fuzzer does (loss and logits from the loss stage, each parameter
    and gradient from the first rank holding it, the others' copies as replicas) and compares them with the
    single-device reference; the other ranks return None."""
    outs = [None] * WORLD if rank == 0 else None
    dist.gather_object(mine, outs, dst=0)
    if rank != 0:
        return None
    combined = combine_stages(CASE, outs, [])
    if "tensors" not in combined:
        return disagreement(combined["reason"])
    sharded = combined["tensors"]
    reference = run_reference(data)
    dump(sharded, reference)
    scale_of = compare_replicas(combined["replicas"], sharded, reference)
    return report(sharded, reference, BOUNDS, scale_of)
