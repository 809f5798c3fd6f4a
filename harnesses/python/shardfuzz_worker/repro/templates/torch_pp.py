# -------------------------------------------------------------- the sharded run


def build(case, inputs, dtype=None):
    """The case's model in `dtype` (a dtype name) with its initial parameters and frozen parameters, as the worker
    builds it."""
    dt = torch_dtype(dtype or case["train"]["dtype"])
    model = Model(M).to(dt)
    load_case_params(model, inputs, dt)
    return freeze(model, case), dt


def run(rank):
    """Every rank runs its stages of the pipeline (the worker's Pipeline) on its data-parallel rows, checkpointed after
    the case's `resume_after` steps and resumed by a fresh pipeline (in the layout of `train.resume_parallel` where the
    case gives one) as the worker does; rank 0 gathers the results as the fuzzer does (each step's loss from the last
    stage that ran it, logits from the last stage of step 0, each parameter and gradient from the first rank holding it,
    the others' copies as replicas) and compares."""
    data = load_blob()
    mine = resumed_training(CASE, lambda layout: rank_pipeline(rank, layout, data))
    return judge_stages(rank, mine, data)


def rank_pipeline(rank, case, data):
    """This rank's part of the case's pipeline, in the case's layout (its own device mesh)."""
    from torch.distributed.device_mesh import init_device_mesh

    p = parallel(case)
    pp, tp = p["pp"], p["tp"]
    dp = WORLD // (pp * tp)
    if tp > 1:
        stage_mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    else:
        stage_mesh = init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "dp"))
    return Pipeline(case, data, rank // (dp * tp), rank // tp % dp, stage_mesh, DEFERRED_FINALIZE)
