"""Repro of a deepspeed-zero model case: the case's model trained by a DeepSpeed engine (the case's ZeRO stage)
over the data-parallel ranks on DeepSpeed's CPU accelerator with gloo, each rank training on its rows of the
batch, under torchrun."""

from ..targets import deepspeed_checkpoint
from ..targets.base import parallel, resumed_case
from .common import ReproError, literal, worker_source
from .torch_dp import generate_dp
from .torch_model import IMPORTS as TORCH_IMPORTS, check_model_case
from .torch_dp import producible  # noqa: F401 - the generator's interface

TARGET = "deepspeed-zero"

IMPORTS = TORCH_IMPORTS.replace("import io\n", "import argparse\nimport importlib\nimport io\n") + """
os.environ["DS_ACCELERATOR"] = "cpu"  # as the fuzzer's deepspeed-zero ranks (before deepspeed is imported)

import deepspeed  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad  # noqa: E402
"""


def check(case):
    from ..targets.deepspeed_zero import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")
    if "moe" in case["model"].get("layers", ()):
        # (The script trains the plain torch model; DeepSpeed's MoE layer and its expert groups are not carried.)
        raise ReproError(f"{TARGET}: no standalone script for a case with MoE blocks (DeepSpeed's MoE layer is not "
                         "carried into the script)")
    if parallel(case)["tp"] > 1 or parallel(resumed_case(case))["tp"] > 1:
        # (AutoTP's sharding, its groups and the gathers over tp are not in the script; docs/findings/ has
        # standalone scripts for the AutoTP bugs found.)
        raise ReproError(f"{TARGET}: no standalone script for a tensor-parallel case (DeepSpeed's AutoTP is not carried "
                         "into the script)")


def generate(case, inputs, bounds, dropped):
    from ..targets.deepspeed_zero import TARGET as WORKER

    p = parallel(case)
    config = WORKER.config(case, p["dp"])
    what = (f"DeepSpeed ZeRO stage {p['zero_stage']} (deepspeed.initialize, CPU accelerator, gloo) over"
            f" dp={p['dp']} ranks" + (f" x cp={p['cp']} DeepSpeed-Ulysses sequence-parallel ranks" if p["cp"] > 1 else ""))
    resumed = deepspeed_checkpoint.load_config(WORKER.config(resumed_case(case), p["dp"]), case)
    settings = ["# The engine's configuration, as the worker's DeepSpeedZero.config() writes it for this case.",
                literal("DS_CONFIG", config),
                "# The configuration of the engine the case's resume_after loads its checkpoint into (its resume_parallel;"
                " a universal checkpoint loads with checkpoint.load_universal).",
                literal("RESUMED_DS_CONFIG", resumed)]
    sources = (worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("targets/deepspeed_zero.py", "gathered", "deepspeed_block_checkpoint",
                                         "checkpointed_blocks", "configure_deepspeed_checkpointing")
               + "\n\n" + worker_source("targets/deepspeed_ulysses.py", "attend_through_ulysses", "sequence_parallel_unit",
                                                "release")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs")
               + "\n\n" + worker_source("targets/base.py", "checkpoint_layout")
               + "\n\n" + worker_source("targets/deepspeed_checkpoint.py", "TAG", "universal", "save",
                                         "convert_to_universal"))
    return generate_dp(TARGET, case, inputs, bounds, dropped, what, settings, IMPORTS, sources)
