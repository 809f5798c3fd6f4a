# -------------------------------------------------------------- the sharded run


def run_sharded(data, rank):
    """The model (held in MASTER_DTYPE) with fully_shard on every block and on the root over the dp ranks
    (LAYOUT's mesh: HSDP on two dims; gradients reduced in REDUCE_DTYPE; with CP > 1 over the dp x cp ranks, each cp rank
    holding the part of every sequence torch's context_parallel gives it), as the fuzzer's torch-fsdp2 ranks run it;
    this rank trains on its rows of the batch.
    Parameters and gradients are DTensors: train() reports them gathered (full_tensor)."""
    seq = None
    if CP > 1:  # FSDP2 over the dp x cp ranks together (LAYOUT's mesh, torchtitan's dp_shard_cp); CP over the cp ones
        seq = TorchSequenceSplit(init_device_mesh("cpu", (DP, CP), mesh_dim_names=("dp", "cp"))["cp"], ROTATE)
    now = {}  # the sharded model, replaced when the run resumes from its checkpoint
    if COMPILED:
        torch._dynamo.reset()

    def sharded(layout=LAYOUT):
        # (`layout`: LAYOUT, or RESUMED_LAYOUT, the one the run resumes into)
        mesh_shape, mesh_names = layout["MESH_SHAPE"], layout["MESH_NAMES"]
        if TP == 1:
            mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=mesh_names)
        else:  # one mesh whose last dimension is tp (torchtitan's 2-D layout): FSDP2 over the others
            whole = init_device_mesh("cpu", (*mesh_shape, TP), mesh_dim_names=(*mesh_names, "tp"))
            mesh, tp_mesh = whole[mesh_names], whole["tp"]
        model = Model(M).to(MASTER_DTYPE)
        load_case_params(model, data, MASTER_DTYPE)
        freeze(model, CASE)
        names = [n for n, _ in model.named_parameters()]
        if TP > 1:
            tensor_parallel(model, tp_mesh)
        if CP > 1:
            install(model)  # every attention core through torch's ring attention
        if COMPILED:  # each block compiled before fully_shard, as torchtitan does
            for i, layer in enumerate(model.layers):
                model.layers[i] = torch.compile(layer, backend="aot_eager")
        mp = MixedPrecisionPolicy(param_dtype=DTYPE if MASTER_DTYPE != DTYPE else None, reduce_dtype=REDUCE_DTYPE)
        kw = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": layout["RESHARD_AFTER_FORWARD"]}
        if layout["SHARD_DIM"]:  # over the ranks a parameter is sharded over
            kw["shard_placement_fn"] = shard_placement(layout["SHARD_DIM"], mesh_shape[-1])
        if layout["CPU_OFFLOAD"]:
            from torch.distributed.fsdp import CPUOffloadPolicy

            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        for layer in model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        set_gradient_reduction([*model.layers, model], layout["SUM_COLLECTIVES"], layout["DIVIDE_FACTOR"])
        now["model"] = model
        params = {n.replace("._orig_mod.", "."): q for n, q in model.named_parameters()}  # (a compiled block's names)
        return [(n, params[n]) for n in names]

    def resume(opt):
        # The case's resume_after: model and optimizer saved with torch.distributed.checkpoint, loaded into fresh ones
        # (checkpoint_layout gathered: full state dicts through rank 0), in RESUMED_LAYOUT where the case has one.
        gathered = CASE["train"].get("checkpoint_layout") == "gathered"
        with shared_tempdir() as path:
            save_checkpoint(now["model"], opt, path, gathered)
            named = sharded(RESUMED_LAYOUT or LAYOUT)
            opt = make_optimizer(CASE, [p for _, p in named])
            load_checkpoint(now["model"], opt, path, gathered)
        return named, opt

    named = sharded()
    torch.manual_seed(0)
    no_sync = None if SYNC_EVERY_MICROBATCH else lambda: without_gradient_sync(now["model"])
    two_d = {}
    if TP > 1:  # the loss summed over this rank's data-parallel peers; replicated tensors reported per rank
        dp_group = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp")).get_group("dp")
        two_d = {"loss_ctx": loss_parallel if VOCAB_SHARDED_LOSS else None, "view": replicas_per_rank, "group": dp_group}
    return train(CASE, data, now["model"], [p for _, p in named], rank // (TP * CP), DP, named=named, no_sync=no_sync,
                 forward=lambda ids: now["model"](ids), resume=resume, seq=seq, **two_d)


def tensor_parallel(model, mesh):
    """torch-tp's plan (tp_plan) over the tensor-parallel mesh; without sequence parallelism the norms keep
    Replicate parameters and are fed local tensors."""
    parallelize_module(model, mesh, tp_plan())
    if not SEQUENCE_PARALLEL:
        replicated_norms(model, mesh)
