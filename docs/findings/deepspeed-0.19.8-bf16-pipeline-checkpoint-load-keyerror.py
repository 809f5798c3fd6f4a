"""DeepSpeed 0.19.8: a bf16 pipeline run without ZeRO cannot load its own checkpoint: `load_checkpoint` raises
"KeyError: 0" in BF16_Optimizer._load_legacy_checkpoint.

Beside a pipeline, bf16 at ZeRO stage 0 runs DeepSpeed's BF16_Optimizer (engine._do_optimizer_sanity_check: "bf16 and
pipeline_parallelism -> BFLOAT16"). Its state is partitioned over the data-parallel ranks; `save_checkpoint` writes it
per rank as ZeRO files (`save_zero_checkpoint`, since the optimizer has a `dp_process_group`) and also puts rank 0's
`state_dict()` into the model-states file. `load_checkpoint` takes the ZeRO path only when `self.zero_optimization()`
(PR #7586 dropped the `or self.bfloat16_enabled()` so that bf16 stage 0 without a pipeline skips it), so here it hands
the model-states file's single dict to `BF16_Optimizer.load_state_dict`, which expects one state dict per
data-parallel rank and indexes it by the rank: `state_dict_list[dp_rank]` -> KeyError: 0. Routing a BF16_Optimizer's
state through the per-rank ZeRO files again (`--fixed`) resumes the run exactly: the parameters after save, load and
one more step equal an uninterrupted run's.

Found by shardfuzz (deepspeed-pp target, `train.resume_after` on a pp2 dp2 bf16 case).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-bf16-pipeline-checkpoint-load-keyerror.py [--fixed]
(CPU, gloo). Prints CRASH, MISMATCH or OK on rank 0.
"""

import importlib
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.pipe import PipelineModule  # noqa: E402

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # (a JIT extension for inference only)
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))

if "--fixed" in sys.argv:
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.engine import DeepSpeedEngine

    load_state_dict, load_checkpoint = BF16_Optimizer.load_state_dict, DeepSpeedEngine.load_checkpoint

    def skip_single_dict(self, state_dict_list, *args, **kwargs):
        if isinstance(state_dict_list, dict):
            return None  # (the model-states file's copy: the per-rank ZeRO files are loaded below)
        return load_state_dict(self, state_dict_list, *args, **kwargs)

    def load_with_per_rank_state(self, load_dir, tag=None, **kwargs):
        out = load_checkpoint(self, load_dir, tag, **kwargs)
        if isinstance(self.optimizer, BF16_Optimizer) and not self.zero_optimization() and out[0] is not None:
            self._load_zero_checkpoint(load_dir, tag, load_optimizer_states=kwargs.get("load_optimizer_states", True))
        return out

    BF16_Optimizer.load_state_dict = skip_single_dict
    DeepSpeedEngine.load_checkpoint = load_with_per_rank_state


def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 4, dtype=torch.bfloat16) for _ in range(4)]


G = torch.Generator().manual_seed(1)
X, Y = torch.randn(2, 4, generator=G).bfloat16(), torch.randn(2, 4, generator=G)
CFG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 2,
       "bf16": {"enabled": True}, "gradient_clipping": 0.0, "steps_per_print": 1 << 30}


def engine():
    module = PipelineModule(layers=layers(), num_stages=2, loss_fn=lambda out, y: ((out.float() - y) ** 2).sum(),
                            partition_method="uniform")
    opt = torch.optim.AdamW(module.parameters(), lr=0.01)
    return deepspeed.initialize(model=module, optimizer=opt, config=CFG)[0]


def step(e):
    e.train_batch(iter([(X, Y)]))


def params(e):
    return {name: p.detach().float().clone() for name, p in e.module.named_parameters()}


straight = engine()
step(straight)
step(straight)
expected = params(straight)

path = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
dist.broadcast_object_list(path)
first = engine()
step(first)
first.save_checkpoint(path[0], tag="t")
resumed = engine()
try:
    resumed.load_checkpoint(path[0], tag="t")
except KeyError as e:
    print(f"CRASH on rank {dist.get_rank()}: KeyError: {e} (load_checkpoint)", flush=True)
    os._exit(1)
step(resumed)
worst = max((v - expected[k]).abs().max().item() for k, v in params(resumed).items())
worst = torch.tensor(worst)
dist.all_reduce(worst, op=dist.ReduceOp.MAX)
if dist.get_rank() == 0:
    shutil.rmtree(path[0], ignore_errors=True)
    print(f"largest parameter difference from the uninterrupted run: {worst.item():.3e}")
    print("OK" if worst.item() == 0 else "MISMATCH")
