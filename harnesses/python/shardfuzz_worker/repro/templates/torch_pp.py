# -------------------------------------------------------------- the sharded run


def build(case, inputs, dtype=None):
    """The case's model in `dtype` (a dtype name) with its initial parameters and frozen parameters, as the worker
    builds it."""
    dt = torch_dtype(dtype or case["train"]["dtype"])
    model = Model(M).to(dt)
    load_case_params(model, inputs, dt)
    return freeze(model, case), dt


def run(rank):
    """Every rank runs its stages of the pipeline (the worker's Pipeline) on its data-parallel rows; rank 0 gathers
    the results as the fuzzer does (loss and logits from the last stage, each parameter and gradient from the first
    rank holding it, the others' copies as replicas) and compares."""
    from torch.distributed.device_mesh import init_device_mesh

    data = load_blob()
    if TP > 1:
        stage_mesh = init_device_mesh("cpu", (PP, DP, TP), mesh_dim_names=("pp", "dp", "tp"))
    else:
        stage_mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
    torch.manual_seed(0)
    mine = Pipeline(CASE, data, rank // (DP * TP), rank // TP % DP, stage_mesh, DEFERRED_FINALIZE).train()
    return judge_stages(rank, mine, data)
