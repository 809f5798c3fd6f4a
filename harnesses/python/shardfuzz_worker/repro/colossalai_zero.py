"""Repro of a colossalai-zero model case: the case's model trained through Colossal-AI's Booster with
LowLevelZeroPlugin (the case's ZeRO stage) over the data-parallel ranks, with the worker's CPU start-up shims,
each rank training on its rows of the batch, under torchrun."""

from unittest import mock

from ..targets.base import dtype_name, parallel, resumed_case
from .colossalai_tp import SHIMS_ABOUT, shims_source
from .common import assemble, embed, header, literal, rule, template, worker_source
from .torch_model import IMPORTS as TORCH_IMPORTS
from .torch_model import TORCH_DTYPES, check_model_case, model_about, model_arrays, model_line, model_source
from .torch_dp import producible  # noqa: F401 - the generator's interface
from .torch_model import training_source

TARGET = "colossalai-zero"

IMPORTS = TORCH_IMPORTS + """
from colossalai.booster import Booster
from colossalai.booster.plugin import LowLevelZeroPlugin
"""


def check(case):
    from ..targets.colossalai_zero import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def plugin_arguments(case):
    """The keyword arguments the worker's ColossalZero.plugin() gives LowLevelZeroPlugin for the case (its own
    code run with the plugin class recording them)."""
    from ..targets.colossalai_zero import TARGET as WORKER

    with mock.patch("colossalai.booster.plugin.LowLevelZeroPlugin", lambda **kwargs: kwargs):
        return WORKER.plugin(case)


def generate(case, inputs, bounds, dropped):
    arrays = model_arrays(case, inputs, TARGET)
    p = parallel(case)
    command = f"torchrun --nproc_per_node {p['dp']} repro.py"
    plugin = plugin_arguments(case)
    resumed = resumed_case(case)
    config = [
        rule("the case"),
        literal("CASE", case),
        f"DP = WORLD = {p['dp']}\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        "# LowLevelZeroPlugin's arguments, as the worker's ColossalZero.plugin() passes them for this case.",
        literal("PLUGIN", plugin),
        "# ... and for the layout the run resumes into (case.train.resume_parallel; None: the run's own).",
        literal("RESUMED_PLUGIN", None if resumed is case else plugin_arguments(resumed)),
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        shims_source(),
        model_source(),
        training_source(),
        template("colossalai_zero") + "\n\n" + worker_source("targets/colossalai_common.py", "fp16_scaler", "plugin_step", "unscaled",
                                                                                "booster_resume")
        + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs"),
        template("torch_reference"),
        template("torch_dp"),
        template("torch_main"),
    ]
    offload = ", optimizer states on the host" if p["zero_offload"] else ""
    about = [f"Colossal-AI ZeRO stage {p['zero_stage']} (Booster + LowLevelZeroPlugin, precision"
             f" {plugin['precision']}{offload}, gloo) over dp={p['dp']} ranks, dtype {dtype_name(case)}.",
             SHIMS_ABOUT, *model_about(case)]
    head = header(f"{TARGET}, model", about, command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(arrays)), command
