# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model in megatron-core's DistributedDataParallel (DDP_SETTINGS) trained by megatron's optimizer
    (OPTIMIZER_SETTINGS) under its parameter scheduler at a constant learning rate and weight decay, over the dp
    ranks, as the fuzzer's megatron-ddp ranks run it; this rank trains on its rows of the batch, under no_sync() on
    every micro-batch but the last, finalize_model_grads() after it. Step-0 gradients: megatron's reduced main_grad
    buffers (under the distributed optimizer each rank's reduced slice, all-gathered); megatron's CUDA-only calls run
    on the CPU (cuda_on_cpu)."""
    patch_cuda()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    with cuda_on_cpu():
        model = Model(M, M.get("sparse_embedding", False)).to(DTYPE)
        load_case_params(model, data, DTYPE)
        freeze(model, CASE)
        ddp = DistributedDataParallel(transformer_config(DTYPE), DistributedDataParallelConfig(**DDP_SETTINGS), model)
        opt = get_megatron_optimizer(OptimizerConfig(**OPTIMIZER_SETTINGS, params_dtype=DTYPE), [ddp],
                                     config_overrides=WEIGHT_DECAY_OVERRIDES)
        schedule = constant_schedule(CASE, opt)
        named = list(model.named_parameters())
        ga = CASE["train"].get("grad_accumulation", 1)
        state = {"micro": 0, "grads": None}

        def backward(loss):
            if state["micro"] % ga == 0:
                ddp.zero_grad_buffer()
                opt.zero_grad()
            loss.backward()
            state["micro"] += 1
            if state["micro"] % ga == 0:
                finalize_model_grads([ddp])  # megatron's own step: finish_grad_sync and what follows it

        def grad(name, _p):
            if state["grads"] is None:
                state["grads"] = reduced_grads(ddp, DDP_SETTINGS["use_distributed_optimizer"], WORLD)
            return state["grads"][name]

        def step():
            opt.step()
            schedule.step(1)

        return train(CASE, data, ddp, [p for _, p in named], rank, WORLD, backward=backward, step=step,
                     clip=lambda: None, no_sync=ddp.no_sync, named=named, grad=grad, forward=lambda ids: ddp(ids))
