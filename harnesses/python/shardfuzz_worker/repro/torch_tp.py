"""Repro of a torch-tp model case: the case's model with parallelize_module (the torchtitan plan), its training
steps under loss_parallel (or, with the case's `vocab_loss` gathered, on a replicated LM-head output), on a 1-D tensor-parallel mesh under torchrun."""

from ..targets.base import dtype_name, parallel, vocab_sharded_loss
from .common import assemble, embed, header, literal, public_dtensor_source, rule, template, worker_source
from .torch_model import IMPORTS, TORCH_DTYPES, check_model_case, model_about, model_arrays, model_line, model_source
from .torch_model import producible  # noqa: F401 - the generator's interface

TARGET = "torch-tp"


def check(case):
    from ..targets.torch_tp import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def plan_source(case):
    """`tp_plan()`: the parallelize_module plan torch_tp.py builds for this model, written out."""
    from ..targets.torch_model import model_defaults

    m, sp = model_defaults(case), parallel(case)["sequence_parallel"]
    seq = "Shard(1)" if sp else "Replicate()"
    lines = [
        f'"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts={seq}),',
        f'"lm_head": ColwiseParallel(input_layouts={seq}, output_layouts=Shard(-1), use_local_output=False),'
        if vocab_sharded_loss(case, True) else f'"lm_head": ColwiseParallel(input_layouts={seq}, output_layouts=Replicate()),',
    ]
    if sp:
        lines.append('"final_norm": SequenceParallel(),')
    for i, kind in enumerate(m["layers"]):
        pre = f"layers.{i}"
        if sp:
            lines.append(f'"{pre}.norm": SequenceParallel(),')
        if kind == "attention":
            inner, cols, row = "attn", ("q", "k", "v"), "o"
        else:
            inner, cols, row = "mlp", ("up", "gate") if m["activation"] == "swiglu" else ("up",), "down"
        if sp:
            lines.append(f'"{pre}.{inner}": PrepareModuleInput(input_layouts=(Shard(1),), '
                         'desired_input_layouts=(Replicate(),)),')
        lines += [f'"{pre}.{inner}.{c}": ColwiseParallel(),' for c in cols]
        lines.append(f'"{pre}.{inner}.{row}": RowwiseParallel(output_layouts={seq}),')
    body = "\n".join(f"        {ln}" for ln in lines)
    return ("def tp_plan():\n"
            '    """The parallelize_module plan of torch_tp.py for this model (module name -> parallel style)."""\n'
            f"    return {{\n{body}\n    }}\n")


def imports(sp):
    return IMPORTS + public_dtensor_source() + "from torch.distributed.device_mesh import init_device_mesh\n" + tp_imports(sp)


def tp_imports(sp):
    """The imports of the tensor parallel plan and its loss (the torch-fsdp2 script takes them beside FSDP2's)."""
    extra = "PrepareModuleInput, RowwiseParallel, SequenceParallel" if sp else "RowwiseParallel"
    return f"""from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, {extra}, loss_parallel, parallelize_module
"""


def describe(case):
    p = parallel(case)
    return [
        f"torch tensor parallelism (parallelize_module) over tp={p['tp']} ranks"
        f"{', sequence parallel' if p['sequence_parallel'] else ''}"
        f"{'' if vocab_sharded_loss(case, True) else ', the LM head gathered before the loss'}"
        f"{', each block compiled (torch.compile, aot_eager)' if case['train'].get('compiled') else ''}, dtype {dtype_name(case)}.",
        *model_about(case),
    ]


def generate(case, inputs, bounds, dropped):
    arrays = model_arrays(case, inputs, TARGET)
    p = parallel(case)
    command = f"torchrun --nproc_per_node {p['tp']} repro.py"
    config = [
        rule("the case"),
        literal("CASE", case),
        f"TP = WORLD = {p['tp']}\nSEQUENCE_PARALLEL = {bool(p['sequence_parallel'])}",
        f"VOCAB_SHARDED_LOSS = {vocab_sharded_loss(case, True)}  # loss_parallel on the LM head's vocabulary shards",
        f"COMPILED = {bool(case['train'].get('compiled'))}  # each block under torch.compile (backend aot_eager)",
        f"DTYPE = {TORCH_DTYPES[dtype_name(case)]}\nGRAD_ACCUMULATION = {case['train'].get('grad_accumulation', 1)}",
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        model_source(),
        worker_source("targets/base.py", "is_frozen"),
        worker_source("targets/torch_training.py", "full", "_LowPrecisionGradScaler", "loss_scaler", "scaled_step"),
        plan_source(case),
        worker_source("targets/torch_tp.py", "replicated_norms"),
        template("torch_tp"),
        template("torch_main"),
    ]
    head = header(f"{TARGET}, model", describe(case), command, dropped, case.get("name", ""))
    return assemble(head, imports(p["sequence_parallel"]), sections, embed(arrays)), command
