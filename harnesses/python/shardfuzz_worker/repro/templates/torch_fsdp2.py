# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model (held in MASTER_DTYPE) with fully_shard on every block and on the root over the dp ranks
    (MESH_SHAPE: HSDP on two dims; gradients reduced in REDUCE_DTYPE), as the fuzzer's torch-fsdp2 ranks run it; this rank trains on its rows of the batch.
    Parameters and gradients are DTensors: train() reports them gathered (full_tensor)."""
    model = Model(M).to(MASTER_DTYPE)
    load_case_params(model, data, MASTER_DTYPE)
    names = [n for n, _ in model.named_parameters()]
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=MESH_NAMES)
    mp = MixedPrecisionPolicy(param_dtype=DTYPE if MASTER_DTYPE != DTYPE else None, reduce_dtype=REDUCE_DTYPE)
    kw = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": RESHARD_AFTER_FORWARD}
    if SHARD_DIM:
        kw["shard_placement_fn"] = shard_placement(SHARD_DIM, MESH_SHAPE[-1])  # over the ranks a parameter is sharded over
    if CPU_OFFLOAD:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    for layer in model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    params = dict(model.named_parameters())
    named = [(n, params[n]) for n in names]
    torch.manual_seed(0)
    no_sync = None if SYNC_EVERY_MICROBATCH else lambda: without_gradient_sync(model)
    return train(CASE, data, model, [p for _, p in named], rank, WORLD, named=named, no_sync=no_sync)
