# -------------------------------------------------------------- the sharded run


def run_sharded(data):
    """megatron-core's tensor-parallel model (MegatronModel above; with pipeline stages, this rank's stage of it)
    over the tp ranks of each data-parallel replica,
    as the fuzzer's megatron-tp ranks run it: megatron's parallel state over all ranks, torch.cuda pointed at the
    CPU, then the worker's megatron training loop (run_megatron: megatron's DDP, optimizer and clipping) on the
    replica's rows of the batch. Returns this rank's slices."""
    _patch_cuda()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP,
                                             virtual_pipeline_model_parallel_size=VS if VS > 1 else None,
                                             num_distributed_optimizer_instances=INSTANCES)
    return run_megatron(CASE, data, resumed_layout())


def run(rank):
    """Rank 0 gathers the ranks' slices, assembles them as the fuzzer does (sharded tensors concatenated
    per replica, replicated ones from rank 0) and compares."""
    data = load_blob()
    mine = run_sharded(data)
    outs = [None] * WORLD if rank == 0 else None
    dist.gather_object(mine, outs, dst=0)
    if rank != 0:
        return None
    sharded = combine_dp(CASE, assemble_outputs(CASE, outs), [])["tensors"]
    reference = run_reference(data)
    dump(sharded, reference)
    return report(sharded, reference, BOUNDS)
