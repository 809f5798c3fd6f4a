# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model trained by a DeepSpeed engine (DS_CONFIG) over the dp ranks, as the fuzzer's deepspeed-zero
    ranks run it; this rank trains on its rows of the batch. The engine owns backward (scale_wrt_gas=False:
    train() already scales each micro-batch loss to its share of the global token mean), gradient reduction,
    clipping and the optimizer step (engine.step() after every micro-batch; DeepSpeed steps the optimizer at
    the accumulation boundary only). Step-0 gradients: safe_get_full_grad between backward and step; final
    parameters: DeepSpeed's master copy (safe_get_full_fp32_param) rounded to DTYPE. With context parallelism (CP > 1)
    each rank also holds one part of every sequence, its attention under DeepSpeed-Ulysses."""
    # The shared-memory allreduce is a JIT-built C++ extension that serves inference only: plain gloo instead.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    # The case's parallel.framework_checkpoint: DeepSpeed's own activation checkpoint instead of torch's.
    block_checkpoint = deepspeed_block_checkpoint(CASE)

    def fresh_engine(config=DS_CONFIG):
        model = Model(M, M.get("sparse_embedding", False)).to(DTYPE)
        if block_checkpoint is not None:
            model.block_checkpoint = block_checkpoint
        load_case_params(model, data, DTYPE)
        freeze(model, CASE)
        # The case's ulysses_mpu: the sequence-parallel groups from DeepSpeed's own unit, not DS_CONFIG's mesh.
        unit = sequence_parallel_unit(CP) if CP > 1 and CASE["parallel"].get("ulysses_mpu") else {}
        engine = deepspeed.initialize(model=model, optimizer=make_optimizer(CASE, list(model.parameters())),
                                      config=config, **unit)[0]
        if CP > 1:  # the case's context parallelism: DeepSpeed-Ulysses over the engine's sequence-parallel group
            attend_through_ulysses(engine)
        return engine

    now = {"engine": fresh_engine()}  # replaced when the run resumes from its checkpoint
    names = [n for n, _ in now["engine"].module.named_parameters()]

    def trained():
        now["params"] = dict(now["engine"].module.named_parameters())
        return [(n, now["params"][n]) for n in names]

    def resume(_opt):
        # The case's resume_after: DeepSpeed's own checkpoint (converted by ds_to_universal where the case's
        # train.checkpoint_layout is universal) loaded into a fresh engine of RESUMED_DS_CONFIG (its
        # train.resume_parallel, where it has one).
        with shared_tempdir() as path:
            tag = save(now["engine"], path, CASE)
            old, now["engine"] = now["engine"], fresh_engine(RESUMED_DS_CONFIG)
            now["engine"].load_checkpoint(path, tag=tag)
            old.destroy()
        return trained(), None

    named = trained()
    state = {"micro": 0, "stepped": False}

    def backward(loss):
        now["engine"].backward(loss, scale_wrt_gas=False)
        state["micro"] += 1
        if state["micro"] % DS_CONFIG["gradient_accumulation_steps"]:
            now["engine"].step()  # not a boundary: DeepSpeed only counts the micro-step

    def step():
        state["stepped"] = True
        now["engine"].step()

    def view(name, t):
        p = now["params"][name]
        if state["stepped"]:
            master = safe_get_full_fp32_param(p)
            t = (gathered(p) if master is None else master).detach().to(DTYPE)  # a frozen one has no master
        shape = tuple(getattr(p, "ds_shape", p.shape))
        return to_case_layout(name, t.detach().to(torch.float64, copy=True).reshape(shape)).numpy()

    # Rank = dp index x CP + sp index; an sp rank holds its part of every sequence.
    seq = SequencePart(rank % CP, CP, now["engine"].seq_parallel_group) if CP > 1 else None
    out = train(CASE, data, now["engine"], [p for _, p in named], rank // CP, DP, backward=backward, step=step,
                clip=lambda: None, named=named, view=view, grad=lambda name, p: safe_get_full_grad(p),
                forward=lambda ids: now["engine"](ids), resume=resume, seq=seq)
    now["engine"].destroy()
    return out
