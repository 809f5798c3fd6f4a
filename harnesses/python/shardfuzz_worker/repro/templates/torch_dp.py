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


def compare_replicas(replicas, sharded, reference):
    """For each bounded `replicas/NAME`: every rank's copy of a replicated tensor against the first holder's, as the
    fuzzer compares them. The copy that strays most goes in `sharded`, the first in `reference` (under the
    `replicas/` name); returns their error scales: the first copy's max |x|, or a tenth of the reference family's."""
    scale_of = {}
    for name, copies in replicas.items():
        key = f"replicas/{name}"
        if key not in BOUNDS or len(copies) < 2:
            continue
        family = name.split("/")[0]
        fam = max((max_abs(r) for n, r in reference.items() if n.split("/")[0] == family), default=0.0)
        first = np.asarray(copies[0][1])
        scale_of[key] = max(max_abs(first), 0.1 * fam)

        def badness(t):
            values = statistics(t, first, scale_of[key])
            return max(float("inf") if np.isnan(values[s]) or (b <= 0 < values[s]) else values[s] / b if b > 0 else 0.0
                       for s, b in BOUNDS[key].items())

        rank, worst = max(copies[1:], key=lambda c: badness(np.asarray(c[1])))
        print(f"{key}: rank {rank}'s copy against rank {copies[0][0]}'s (the one that strays most)")
        sharded[key], reference[key] = np.asarray(worst), first
    return scale_of
