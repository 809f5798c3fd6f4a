# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model with fully_shard on every block and on the root over the dp ranks (gradients reduce-scattered
    in REDUCE_DTYPE), as the fuzzer's torch-fsdp2 ranks run it; this rank trains on its rows of the batch.
    Parameters and gradients are DTensors: train() reports them gathered (full_tensor)."""
    model = Model(M).to(DTYPE)
    load_case_params(model, data, DTYPE)
    names = [n for n, _ in model.named_parameters()]
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    mp = MixedPrecisionPolicy(reduce_dtype=REDUCE_DTYPE)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=RESHARD_AFTER_FORWARD)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=RESHARD_AFTER_FORWARD)
    params = dict(model.named_parameters())
    named = [(n, params[n]) for n in names]
    torch.manual_seed(0)
    return train(CASE, data, model, [p for _, p in named], rank, WORLD, named=named)
