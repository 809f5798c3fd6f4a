# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model wrapped in DistributedDataParallel (BUCKET_CAP_MB per gradient bucket, the case's bucket views, static
    graph, search for unused parameters and compression hook) over the dp ranks, as the fuzzer's
    torch-ddp ranks run it; this rank trains on its rows of the batch, with no_sync() on every micro-batch
    but the last of a step (gradients are all-reduced once per step) unless SYNC_EVERY_MICROBATCH."""
    model = Model(M, M.get("sparse_embedding", False)).to(DTYPE)
    load_case_params(model, data, DTYPE)
    freeze(model, CASE)
    seq = None
    if CP > 1:  # DDP over the dp x cp ranks; torch's context parallelism over the cp ones
        install(model)
        seq = TorchSequenceSplit(init_device_mesh("cpu", (DP, CP), mesh_dim_names=("dp", "cp"))["cp"], ROTATE)
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB, gradient_as_bucket_view=GRADIENT_AS_BUCKET_VIEW, static_graph=STATIC_GRAPH,
              find_unused_parameters=FIND_UNUSED)
    if COMPRESS_HOOK is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(state=None, hook=getattr(default_hooks, COMPRESS_HOOK))
    named = list(model.named_parameters())
    no_sync = None if SYNC_EVERY_MICROBATCH else ddp.no_sync
    return train(CASE, data, ddp, [p for _, p in named], rank // CP, DP, no_sync=no_sync, named=named, seq=seq)
