# -------------------------------------------------------------- the sharded run


def make_plugin(arguments):
    kw = dict(arguments)
    if kw.get("communication_dtype"):
        kw["communication_dtype"] = getattr(torch, kw["communication_dtype"])
    return PLUGIN_CLASS(**kw)


def relayout():
    """The plugin of the layout the run resumes into (RESUMED_PLUGIN), and the case as laid out then."""
    return make_plugin(RESUMED_PLUGIN), {**CASE, "parallel": CASE["train"]["resume_parallel"]}


def run(rank):
    """Every rank trains through the plugin as the fuzzer's colossalai-hybrid ranks do (the worker's CPU shims
    installed after the gloo process group, then its `run`); rank 0 gathers the ranks' shards, assembles them
    as the fuzzer does (`combine`: tensor-parallel shards concatenated, data-parallel copies kept) and compares
    with the same model (Llama, GPT-2 or Mixtral) on one device in float64."""
    data = load_blob()
    install_shims()
    mine = run_hybrid(make_plugin(PLUGIN), CASE, data, DTYPE, relayout=None if RESUMED_PLUGIN is None else relayout)
    outs = [None] * WORLD if rank == 0 else None
    dist.gather_object(mine, outs, dst=0)
    if rank != 0:
        return None
    combined = combine(CASE, outs, [])
    if "tensors" not in combined:
        return disagreement(combined["reason"])
    sharded = combined["tensors"]
    reference = single_device(CASE, data, torch.float64)
    dump(sharded, reference)
    return report(sharded, reference, BOUNDS)
