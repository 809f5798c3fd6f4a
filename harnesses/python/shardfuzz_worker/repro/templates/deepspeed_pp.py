# -------------------------------------------------------------- the sharded run


def build(case, inputs, dtype=None):
    """The case's model in `dtype` (a dtype name) with its initial parameters and frozen parameters, as the worker
    builds it."""
    dt = torch_dtype(dtype or case["train"]["dtype"])
    model = Model(M).to(dt)
    load_case_params(model, inputs, dt)
    return freeze(model, case), dt


class Config:
    """What the worker's PipelineRun asks its target for: the engine's configuration for the case as laid out (DS_CONFIG,
    or RESUMED_DS_CONFIG for the layout the run resumes into; a fresh copy)."""

    def config(self, case, world):
        resumed = RESUMED_DS_CONFIG is not None and case["parallel"] != CASE["parallel"]
        return copy.deepcopy(RESUMED_DS_CONFIG if resumed else DS_CONFIG)


def run(rank):
    """Every rank runs its stages of the pipeline (the worker's PipelineRun) on its data-parallel rows; rank 0 gathers
    the results as the fuzzer does (loss and logits from the loss stage, each parameter and gradient from the first
    rank holding it, the others' copies as replicas) and compares."""
    # The shared-memory allreduce is a JIT-built C++ extension that serves inference only: plain gloo instead.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    os.environ.setdefault("LOCAL_RANK", str(rank))  # (PipelineModule reads it; torchrun sets it)
    data = load_blob()
    torch.manual_seed(0)
    mine = PipelineRun(Config(), CASE, data, WORLD).train()
    return judge_stages(rank, mine, data)
