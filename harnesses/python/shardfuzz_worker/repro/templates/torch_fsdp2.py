# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model (held in MASTER_DTYPE) with fully_shard on every block and on the root over the dp ranks
    (MESH_SHAPE: HSDP on two dims; gradients reduced in REDUCE_DTYPE), as the fuzzer's torch-fsdp2 ranks run it; this rank trains on its rows of the batch.
    Parameters and gradients are DTensors: train() reports them gathered (full_tensor)."""
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=MESH_NAMES)
    now = {}  # the sharded model, replaced when the run resumes from its checkpoint

    def sharded():
        model = Model(M).to(MASTER_DTYPE)
        load_case_params(model, data, MASTER_DTYPE)
        freeze(model, CASE)
        names = [n for n, _ in model.named_parameters()]
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
        now["model"] = model
        params = dict(model.named_parameters())
        return [(n, params[n]) for n in names]

    def resume(opt):
        # The case's resume_after: model and optimizer saved with torch.distributed.checkpoint, loaded into fresh ones.
        with shared_tempdir() as path:
            save_checkpoint(now["model"], opt, path)
            named = sharded()
            opt = make_optimizer(CASE, [p for _, p in named])
            load_checkpoint(now["model"], opt, path)
        return named, opt

    named = sharded()
    torch.manual_seed(0)
    no_sync = None if SYNC_EVERY_MICROBATCH else lambda: without_gradient_sync(now["model"])
    return train(CASE, data, now["model"], [p for _, p in named], rank, WORLD, named=named, no_sync=no_sync,
                 forward=lambda ids: now["model"](ids), resume=resume)
