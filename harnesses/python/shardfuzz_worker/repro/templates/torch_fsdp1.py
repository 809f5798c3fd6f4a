# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model (held in MASTER_DTYPE) with FSDP1's FullyShardedDataParallel (STRATEGY, use_orig_params=not
    FLAT_PARAMS) on every block and on the root over the dp ranks (MESH_SHAPE: hybrid sharding's (replicate, shard)
    mesh; MixedPrecision where MASTER_DTYPE or REDUCE_DTYPE differ from DTYPE), as the fuzzer's torch-fsdp1 ranks run it
    (Fsdp1Run: FSDP1's clipping and loss scaler, gradients and parameters read whole, LostParameters where FSDP1 no
    longer registers some of them); this rank trains on its rows of the batch."""
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

    compiled = CASE["train"].get("compiled")  # the wrapped model under torch.compile (aot_eager), as the worker runs it
    run = Fsdp1Run(FLAT_PARAMS, (lambda model: torch.compile(model, backend="aot_eager")) if compiled else None)

    def built(strategy, mesh_shape):
        model = Model(M).to(MASTER_DTYPE)
        load_case_params(model, data, MASTER_DTYPE)
        freeze(model, CASE)
        mixed = MASTER_DTYPE != DTYPE or REDUCE_DTYPE != DTYPE
        kw = {"sharding_strategy": getattr(ShardingStrategy, strategy), "device_id": torch.device("cpu"),
              "use_orig_params": not FLAT_PARAMS,
              "mixed_precision": MixedPrecision(param_dtype=DTYPE, reduce_dtype=REDUCE_DTYPE) if mixed else None}
        if mesh_shape is not None:
            kw["device_mesh"] = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
        return run.adopt(*wrap_units(model, **kw))

    named = built(STRATEGY, MESH_SHAPE)
    # (a resumed run's fresh model in the layout of case.train.resume_parallel: RESUMED_STRATEGY, RESUMED_MESH_SHAPE)
    return train(CASE, data, run.model, run.optimized, rank, DP, named=named,
                 **run.hooks(CASE, lambda: built(RESUMED_STRATEGY, RESUMED_MESH_SHAPE), SYNC_EVERY_MICROBATCH))
