# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model wrapped in DistributedDataParallel (BUCKET_CAP_MB per gradient bucket, the case's bucket views, static
    graph, search for unused parameters and compression hook) over the dp ranks, as the fuzzer's
    torch-ddp ranks run it; this rank trains on its rows of the batch, with no_sync() on every micro-batch
    but the last of a step (gradients are all-reduced once per step) unless SYNC_EVERY_MICROBATCH. With ZERO_STAGE 1
    the optimizer is torch's ZeroRedundancyOptimizer (partitions within groups of ZERO_SHARD_GROUP consecutive ranks,
    parameter buckets where PARAM_BUCKETS); RESUME_AFTER steps in, the run is saved by rank 0 and loaded by every rank
    into a fresh model, DDP wrapper and optimizer. COMPILED: the DDP module under torch.compile (backend aot_eager)."""
    now = {"ddp": None, "forward": None}  # replaced when the run resumes
    seq = None
    if CP > 1:  # DDP over the dp x cp ranks; torch's context parallelism over the cp ones
        seq = TorchSequenceSplit(init_device_mesh("cpu", (DP, CP), mesh_dim_names=("dp", "cp"))["cp"], ROTATE)
    group = shard_group(ZERO_SHARD_GROUP, WORLD, rank) if ZERO_STAGE == 1 else None

    def wrapped(state=None):
        model = Model(M, M.get("sparse_embedding", False)).to(DTYPE)
        load_case_params(model, data, DTYPE)
        freeze(model, CASE)
        if state is not None:
            model.load_state_dict(state)
        if CP > 1:
            install(model)
        now["ddp"] = DDP(model, bucket_cap_mb=BUCKET_CAP_MB, gradient_as_bucket_view=GRADIENT_AS_BUCKET_VIEW,
                         static_graph=STATIC_GRAPH, find_unused_parameters=FIND_UNUSED)
        if COMPRESS_HOOK is not None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            now["ddp"].register_comm_hook(state=None, hook=getattr(default_hooks, COMPRESS_HOOK))
        # (Compiled whole, once per wrapper: Dynamo's DDPOptimizer splits it at the buckets.)
        now["forward"] = torch.compile(now["ddp"], backend="aot_eager") if COMPILED else now["ddp"]
        return list(model.named_parameters())

    def optimizer(params):
        if ZERO_STAGE == 1:
            return zero_redundancy_optimizer(CASE, params, group, PARAM_BUCKETS)
        return make_optimizer(CASE, params)

    def resume(opt):
        saved = saved_and_loaded(now["ddp"].module, opt)
        named = wrapped(saved["model"])
        opt = optimizer([p for _, p in named])
        opt.load_state_dict(saved["optim"])
        return named, opt

    if COMPILED:
        torch._dynamo.reset()
    named = wrapped()
    no_sync = None if SYNC_EVERY_MICROBATCH else lambda: now["ddp"].no_sync()
    return train(CASE, data, now["ddp"], [p for _, p in named], rank // CP, DP, no_sync=no_sync, named=named, seq=seq,
                 forward=lambda ids: now["forward"](ids), resume=resume, optimizer=optimizer)
