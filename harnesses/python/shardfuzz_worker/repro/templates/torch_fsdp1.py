# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model (held in MASTER_DTYPE) with FSDP1's FullyShardedDataParallel (STRATEGY, use_orig_params=True) on every
    block and on the root over the dp ranks (MESH_SHAPE: hybrid sharding's (replicate, shard) mesh; MixedPrecision
    where MASTER_DTYPE or REDUCE_DTYPE differ from DTYPE), as the fuzzer's torch-fsdp1 ranks run it; this rank trains on
    its rows of the batch, clipping with FSDP1's own clip_grad_norm_. Gradients and parameters are read whole with
    summon_full_params (FullTensors: LostParameters where FSDP1 no longer registers some of them)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy

    full = FullTensors()
    mesh = None if MESH_SHAPE is None else init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=("replicate", "shard"))

    def sharded():
        model = Model(M).to(MASTER_DTYPE)
        load_case_params(model, data, MASTER_DTYPE)
        freeze(model, CASE)
        names = [n for n, _ in model.named_parameters()]
        for q in model.parameters():  # FSDP1 exposes them as 1-D views: the optimizer groups by these (make_optimizer)
            q.case_ndim = q.dim()
        mixed = MASTER_DTYPE != DTYPE or REDUCE_DTYPE != DTYPE
        kw = {"sharding_strategy": getattr(ShardingStrategy, STRATEGY), "device_id": torch.device("cpu"),
              "use_orig_params": not FLAT_PARAMS,
              "mixed_precision": MixedPrecision(param_dtype=DTYPE, reduce_dtype=REDUCE_DTYPE) if mixed else None}
        if mesh is not None:
            kw["device_mesh"] = mesh
        for i, layer in enumerate(model.layers):
            model.layers[i] = FSDP(layer, **kw)
        full.model, full.names = FSDP(model, **kw), names
        if full.flat:  # the optimizer steps the flat parameters; train() reads every tensor by name (FullTensors)
            full.optimized = list(full.model.parameters())
            return [(n, full.placeholder) for n in names]
        params = {clean(n): q for n, q in full.model.named_parameters()}
        named = [(n, params[n]) for n in names]
        full.optimized = [q for _, q in named]
        return named

    def resume(opt):
        # The case's resume_after: model and optimizer saved with torch.distributed.checkpoint, loaded into fresh ones.
        with shared_tempdir() as path:
            save_checkpoint(full.model, opt, path)
            named = sharded()
            opt = make_optimizer(CASE, full.optimized)
            load_checkpoint(full.model, opt, path)
        return named, opt

    full.flat = FLAT_PARAMS
    named = sharded()
    clip = CASE["train"].get("clip_grad_norm")
    return train(CASE, data, full.model, full.optimized, rank, DP, named=named,
                 forward=lambda ids: full.model(ids), resume=resume, grad=full.grad, view=full.view,
                 clip=None if clip is None else lambda: full.model.clip_grad_norm_(clip),
                 no_sync=None if SYNC_EVERY_MICROBATCH else lambda: full.model.no_sync(),
                 scaler=sharded_grad_scaler)
