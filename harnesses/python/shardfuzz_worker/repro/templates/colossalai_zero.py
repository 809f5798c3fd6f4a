# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model trained through Colossal-AI's Booster with LowLevelZeroPlugin(**PLUGIN) over the dp ranks, as
    the fuzzer's colossalai-zero ranks run it (the worker's CPU shims installed after the gloo process group);
    this rank trains on its rows of the batch. The ZeRO optimizer owns backward (booster.backward), the gradient
    reduction, clipping (max_norm), its fp16 loss scaler and the step (plugin_step() below); micro-batches accumulate in its gradient
    partitions. Step-0 gradients: its reduced gradients before the step (get_param_grad, the loss scale divided out); final parameters: the
    working parameters after the last step (its fp32 masters rounded to DTYPE)."""
    install_shims()
    model = Model(M).to(DTYPE)
    load_case_params(model, data, DTYPE)
    names = [n for n, _ in model.named_parameters()]
    opt = make_optimizer(CASE, list(model.parameters()))
    booster = Booster(plugin=LowLevelZeroPlugin(**PLUGIN))
    boosted, zero_opt, *_ = booster.boost(model, opt)
    params = dict(boosted.unwrap().named_parameters())
    named = [(n, params[n]) for n in names]

    def view(name, t):
        boosted._force_wait_all_gather()  # with overlap_allgather: the gathers after the last step, as checkpointing waits
        return to_case_layout(name, t.detach().to(torch.float64, copy=True).reshape(params[name].shape)).numpy()

    return train(CASE, data, boosted, [p for _, p in named], rank, WORLD,
                 backward=lambda loss: booster.backward(loss, zero_opt), step=lambda: plugin_step(zero_opt),
                 clip=lambda: None, named=named, view=view, grad=lambda name, p: unscaled(zero_opt, zero_opt.get_param_grad(p)))
