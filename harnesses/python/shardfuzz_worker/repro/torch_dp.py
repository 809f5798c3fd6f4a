"""What the generators of the data-parallel torch targets (torch-fsdp2, torch-fsdp1, torch-ddp, deepspeed-zero;
colossalai-zero takes its comparison) share: the script runs the worker's own training loop on each rank's rows of the batch under torchrun, gathers the ranks'
results as the worker does and compares them with the same loop in float64 on one rank."""

from ..targets.base import dtype_name, parallel, reduce_dtype_name
from .common import ReproError, assemble, embed, header, literal, rule, template, worker_source
from .torch_model import (TORCH_DTYPES, check_model_case, model_about, model_arrays, model_line, model_source,
                          training_source)
from .torch_model import producible as model_producible


def producible(case):
    """The model case's tensors, and the data-parallel ranks' copies of every gradient and parameter (`replicas/`:
    each rank's against the first's, as the fuzzer compares them)."""
    tensors = model_producible(case)
    return tensors | {f"replicas/{n}" for n in tensors if n.startswith(("grad/", "param/"))}


def check_reduced_model_case(case, target, worker):
    """check_model_case, and the case's gradient reduction dtype one torch has (FSDP's reduce_dtype)."""
    check_model_case(case, target, worker, "case.model / case.parallel / case.train")
    if reduce_dtype_name(case) not in TORCH_DTYPES:
        raise ReproError(f"{target}: case.train.reduce_dtype {reduce_dtype_name(case)!r} has no torch dtype")


def generate_dp(target, case, inputs, bounds, dropped, what, settings, imports, sources=""):
    """(script, command) of a dp target: `what` is the header's first line (without the dtype), `settings` the
    target's configuration lines, `imports` the script's imports, `sources` the worker code its template calls
    beyond the model and training loop; its template (named after the target) defines run_sharded(data, rank)."""
    arrays = model_arrays(case, inputs, target)
    p = parallel(case)
    dp, world = p["dp"], p["dp"] * p["tp"] * p["cp"]
    command = f"torchrun --nproc_per_node {world} repro.py"
    config = [
        rule("the case"),
        literal("CASE", case),
        f"DP = {dp}\nCP = {p['cp']}\nWORLD = {world}  # DP x TP x CP\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        *settings,
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        model_source(),
        training_source(),
        template(target.replace("-", "_")) + (f"\n\n{sources}" if sources else ""),
        template("torch_reference"),
        template("torch_dp"),
        template("torch_main"),
    ]
    about = [f"{what}, dtype {dtype_name(case)}.", *model_about(case)]
    head = header(f"{target}, model", about, command, dropped, case.get("name", ""))
    return assemble(head, imports, sections, embed(arrays)), command


def torch_context_parallel(case):
    """(setting line, sources) a torch target's script needs for the case's context parallelism as torch's own (the
    worker's torch_context_parallel helpers); ("", "") without cp."""
    from ..targets.torch_context_parallel import rotate_method

    if parallel(case)["cp"] == 1:
        return "", ""
    setting = f"ROTATE = {rotate_method(case)!r}  # ring attention's key/value rotation (context parallelism)"
    sources = (worker_source("targets/torch_context_parallel.py", "install_cpu_flash_kernels",
                             "scaled_dot_product_attention", "ring_attention", "query_heads", "TorchSequenceSplit",
                             "install")
               + "\n\n" + worker_source("targets/torch_release.py", "context_parallel_module", "cp_load_balances",
                                          "cp_rotate_methods", "cp_unshard"))
    return setting, sources
