"""DeepSpeed 0.19.8: a plain ZeRO-3 run cannot resume under AutoTP from its universal checkpoint: ZeRO-3's loader
partitions each tensor-parallel layer's whole weight instead of the rank's shard and overruns its flat partition.

The universal checkpoint exists to resume under another parallel layout (ds_to_universal writes every parameter whole,
`checkpoint.load_universal` cuts out what the new layout holds). ds_to_universal writes the two ZeRO-3 cases
differently: without tensor parallelism `merge_zero3_slices` saves each state as a bare tensor (`slices[0]`), with
AutoTP `merge_tp_slices` saves `{"param": tensor}` dicts. ZeRO-3's `load_hp_checkpoint_state` (stage3.py) resolves a
parameter's AutoTP shard (`_resolve_autotp_partition`) only from a dict:

    if param is not None and isinstance(ckpt_dict, dict):
        ... tp_shard = _resolve_autotp_partition(param, ckpt_dict, loaded_checkpoint_state, tp_rank, tp_world_size)

so from a checkpoint written without tensor parallelism every column- or row-parallel weight is partitioned whole
over the data-parallel ranks, larger than the rank's shard: `load_hp_checkpoint_state_from_checkpoint_dir_stage3`
fails copying it into the rank's flat partition ("RuntimeError: start (...) + length (...) exceeds dimension size
(...)"). Resuming a ZeRO-1/2 run under AutoTP the same way works (their loader takes both forms), as does a ZeRO-3
run saved under AutoTP and resumed with or without it.

Found by shardfuzz (deepspeed-zero target) through `train.resume_parallel` with other degrees: dp 4 ZeRO-3, resumed
from its universal checkpoint as dp 2 x AutoTP 2: CRASH; the same at ZeRO-1, dp 2 x tp 2 into dp 4, or with the fix:
PASS against the float64 reference.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero3-universal-checkpoint-into-autotp-whole-weights.py [--fixed]
(CPU, gloo). A two-layer model trains one step under plain ZeRO-3 over 2 ranks, is saved and converted by
ds_to_universal, and a ZeRO-3 engine with AutoTP over the same 2 ranks loads it. Released: that RuntimeError.
`--fixed` resolves the shard for a bare tensor as for a dict; the loaded shards, gathered, equal the saved weights: OK.
"""

import argparse
import importlib
import inspect
import os
import sys
import tempfile
import textwrap
import types

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.checkpoint import ds_to_universal  # noqa: E402
from deepspeed.utils import groups, safe_get_full_fp32_param  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()

if "--fixed" in sys.argv:
    from deepspeed.runtime.zero import stage3

    cls = stage3.DeepSpeedZeroOptimizer_Stage3
    source = textwrap.dedent(inspect.getsource(cls.load_hp_checkpoint_state)).replace(
        "if param is not None and isinstance(ckpt_dict, dict):",
        "if param is not None and (isinstance(ckpt_dict, dict) or torch.is_tensor(ckpt_dict)):")
    namespace = {}
    exec(compile(source, stage3.__file__, "exec"), stage3.__dict__, namespace)
    cls.load_hp_checkpoint_state = namespace["load_hp_checkpoint_state"]


class Block(torch.nn.Module):
    """An attention block's projections, as AutoTP meets them in a transformers model: q column-, o row-parallel."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(num_attention_heads=2, num_key_value_heads=2, hidden_size=8)
        self.q = torch.nn.Linear(8, 8, bias=False)
        self.o = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return self.o(torch.tanh(self.q(x)))


#: How AutoTP shards each weight: (dimension, partition type).
SHARDED = {"q.weight": 0, "o.weight": 1}
X = torch.randn(WORLD, 3, 8, generator=torch.Generator().manual_seed(1))


def engine(autotp):
    torch.manual_seed(0)
    model = Block()
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
           "zero_allow_untested_optimizer": True}
    if autotp:
        cfg["tensor_parallel"] = {"autotp_size": WORLD, "partition_config": {"use_default_specs": False, "layer_specs": [
            {"patterns": [r"q\.weight$"], "partition_type": "column"},
            {"patterns": [r"o\.weight$"], "partition_type": "row"}]}}
        cfg["checkpoint"] = {"load_universal": True}
    else:
        cfg["train_batch_size"] = WORLD
    return deepspeed.initialize(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), config=cfg)[0]


def whole(name, p, autotp=False):
    """The parameter's fp32 master value, its AutoTP shards gathered over the tensor-parallel ranks."""
    v = safe_get_full_fp32_param(p).detach().clone()
    if not autotp or name not in SHARDED:
        return v
    parts = [torch.empty_like(v) for _ in range(WORLD)]
    dist.all_gather(parts, v.contiguous(), group=groups.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=SHARDED[name])


def main():
    path = [tempfile.mkdtemp() if RANK == 0 else None]
    dist.broadcast_object_list(path)
    path = path[0]
    saved = engine(autotp=False)  # plain ZeRO-3 over the 2 ranks
    saved.backward(saved(X[RANK]).pow(2).mean())
    saved.step()
    want = {n: whole(n, p) for n, p in saved.module.named_parameters()}
    saved.save_checkpoint(path, tag="step1")
    if RANK == 0:
        ds_to_universal.main(argparse.Namespace(input_folder=os.path.join(path, "step1"),
                                                output_folder=os.path.join(path, "step1_universal"),
                                                num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                                strict=True, inject_missing_state=True))
    dist.barrier()
    saved.destroy()
    # (What a fresh process has: DeepSpeed keeps the parallel groups of an engine in module globals.)
    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP"):
        setattr(groups, name, None)

    resumed = engine(autotp=True)  # ZeRO-3 with AutoTP 2 over the same 2 ranks
    resumed.load_checkpoint(path, tag="step1_universal")  # released: the RuntimeError
    off = max(float((whole(n, p, autotp=True) - want[n]).abs().max()) for n, p in resumed.module.named_parameters())
    if RANK == 0:
        print(f"loaded parameters, gathered over tp, differ from the saved ones by up to {off:.3e}")
        print("MISMATCH" if off > 1e-6 else "OK")


main()
