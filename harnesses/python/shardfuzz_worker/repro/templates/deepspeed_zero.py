# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model trained by a DeepSpeed engine (DS_CONFIG) over the dp ranks, as the fuzzer's deepspeed-zero
    ranks run it; this rank trains on its rows of the batch. The engine owns backward (scale_wrt_gas=False:
    train() already scales each micro-batch loss to its share of the global token mean), gradient reduction,
    clipping and the optimizer step (engine.step() after every micro-batch; DeepSpeed steps the optimizer at
    the accumulation boundary only). Step-0 gradients: safe_get_full_grad between backward and step; final
    parameters: DeepSpeed's master copy (safe_get_full_fp32_param) rounded to DTYPE."""
    # The shared-memory allreduce is a JIT-built C++ extension that serves inference only: plain gloo instead.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    model = Model(M, M.get("sparse_embedding", False)).to(DTYPE)
    load_case_params(model, data, DTYPE)
    names = [n for n, _ in model.named_parameters()]
    opt = make_optimizer(CASE, list(model.parameters()))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=DS_CONFIG)
    params = dict(engine.module.named_parameters())
    named = [(n, params[n]) for n in names]
    state = {"micro": 0, "stepped": False}

    def backward(loss):
        engine.backward(loss, scale_wrt_gas=False)
        state["micro"] += 1
        if state["micro"] % DS_CONFIG["gradient_accumulation_steps"]:
            engine.step()  # not a boundary: DeepSpeed only counts the micro-step

    def step():
        state["stepped"] = True
        engine.step()

    def view(name, t):
        p = params[name]
        if state["stepped"]:
            master = safe_get_full_fp32_param(p)
            t = (p if master is None else master).detach().to(DTYPE)
        shape = tuple(getattr(p, "ds_shape", p.shape))
        return to_case_layout(name, t.detach().to(torch.float64, copy=True).reshape(shape)).numpy()

    out = train(CASE, data, engine, [p for _, p in named], rank, WORLD, backward=backward, step=step,
                clip=lambda: None, named=named, view=view, grad=lambda name, p: safe_get_full_grad(p))
    engine.destroy()
    return out
