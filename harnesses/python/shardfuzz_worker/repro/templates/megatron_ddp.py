# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model in megatron-core's DistributedDataParallel (DDP_SETTINGS) trained by megatron's optimizer
    (OPTIMIZER_SETTINGS) under its parameter scheduler at a constant learning rate and weight decay, over the dp
    ranks, as the fuzzer's megatron-ddp ranks run it; this rank trains on its rows of the batch, under no_sync() on
    every micro-batch but the last, finalize_model_grads() after it. Step-0 gradients: megatron's reduced main_grad
    buffers (under the distributed optimizer each rank's reduced slice, all-gathered); megatron's CUDA-only calls run
    on the CPU (cuda_on_cpu)."""
    patch_cuda()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1,
        num_distributed_optimizer_instances=DDP_SETTINGS["num_distributed_optimizer_instances"])
    def fresh_model():
        model = Model(M, M.get("sparse_embedding", False)).to(DTYPE)
        load_case_params(model, data, DTYPE)
        return freeze(model, CASE)

    with cuda_on_cpu():
        return train_dp(CASE, data, fresh_model, rank, WORLD, DDP_SETTINGS, OPTIMIZER_SETTINGS, WEIGHT_DECAY_OVERRIDES,
                        resumed_layout())

