# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model trained through Colossal-AI's Booster with LowLevelZeroPlugin(**PLUGIN) over the dp ranks, as
    the fuzzer's colossalai-zero ranks run it (the worker's CPU shims installed after the gloo process group);
    this rank trains on its rows of the batch. The ZeRO optimizer owns backward (booster.backward), the gradient
    reduction, clipping (max_norm), its fp16 loss scaler and the step (plugin_step() below); micro-batches accumulate in its gradient
    partitions. Step-0 gradients: its reduced gradients before the step (get_param_grad, the loss scale divided out); final parameters: the
    working parameters after the last step (its fp32 masters rounded to DTYPE)."""
    install_shims()

    def fresh():
        model = Model(M).to(DTYPE)
        load_case_params(model, data, DTYPE)
        freeze(model, CASE)
        return model, make_optimizer(CASE, list(model.parameters()))

    model, opt = fresh()
    names = [n for n, _ in model.named_parameters()]
    booster = Booster(plugin=LowLevelZeroPlugin(**PLUGIN))
    boosted, zero_opt, *_ = booster.boost(model, opt)
    # (replaced when the run resumes from its checkpoint; the booster by one of RESUMED_PLUGIN where it has one)
    now = {"booster": booster, "boosted": boosted, "opt": zero_opt}

    def trained():
        now["params"] = dict(now["boosted"].unwrap().named_parameters())
        return [(n, now["params"][n]) for n in names]

    def resume(_opt):
        # The case's resume_after: the booster's checkpoints (sharded, or gathered with checkpoint_layout) saved and
        # loaded into a fresh model and optimizer (boosted by RESUMED_PLUGIN's booster where the case has one).
        gathered = CASE["train"].get("checkpoint_layout") == "gathered"
        into = now["booster"] if RESUMED_PLUGIN is None else Booster(plugin=LowLevelZeroPlugin(**RESUMED_PLUGIN))
        now["boosted"], now["opt"] = booster_resume(now["booster"], now["boosted"], now["opt"], fresh, gathered,
                                                    into=into)
        now["booster"] = into
        return trained(), None

    def view(name, t):
        now["boosted"]._force_wait_all_gather()  # with overlap_allgather: the gathers after the last step, as checkpointing waits
        shape = now["params"][name].shape
        return to_case_layout(name, t.detach().to(torch.float64, copy=True).reshape(shape)).numpy()

    named = trained()
    return train(CASE, data, boosted, [p for _, p in named], rank, WORLD, forward=lambda ids: now["boosted"](ids),
                 backward=lambda loss: now["booster"].backward(loss, now["opt"]), step=lambda: plugin_step(now["opt"]),
                 clip=lambda: None, named=named, view=view, resume=resume,
                 grad=lambda name, p: unscaled(now["opt"], now["opt"].get_param_grad(p)))
