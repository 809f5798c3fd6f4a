"""DeepSpeed 0.19.8 (found by shardfuzz, 2026-12-04): AutoTP training with ZeRO-3 crashes when tensor parallelism
exceeds the model's key-value head count.

With a model config that gives the key-value head count, AutoTP splits the attention projections by head group and
gives ranks beyond the count no shard at all (`tp_shard.get_shard_size`); `deepspeed.initialize` says so and goes on
("ranks beyond the head count hold no attention shard and attention throughput will not scale past that point": the
row-parallel all-reduce adds their empty contribution). At ZeRO stages 0-2 the result is right (shardfuzz: a tp 4
case with 2 key-value heads passes). Under ZeRO-3 the empty [0, hidden] weight becomes a ZeRO parameter of 0 elements,
and the rank holding it fails in the first forward: the parameter coordinator's fetch asserts that the parameter is
available ("AssertionError: {'id': 0, 'status': 'NOT_AVAILABLE', 'numel': 0, ..., 'ds_shape': (0, 8)}",
partitioned_param_coordinator.py:413).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-autotp-zero3-empty-head-shard-crash.py [--fixed]
(CPU, gloo; tp 2, one key-value head). Released: rank 1 fails with that AssertionError. `--fixed` is a control, not a
fix: the same split at ZeRO stage 1 trains, OK, the output equal to the same model on one process.
"""

import importlib
import os
import sys
import types

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()


class Attention(torch.nn.Module):
    """The shape of an attention block's projections: q splits by key-value head group, o by the same."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(num_attention_heads=1, num_key_value_heads=1, hidden_size=8)
        self.q = torch.nn.Linear(8, 4)
        self.o = torch.nn.Linear(4, 8)

    def forward(self, x):
        return self.o(torch.tanh(self.q(x)))


torch.manual_seed(0)
reference = Attention()
model = Attention()
model.load_state_dict(reference.state_dict())
x = torch.randn(3, 8)
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
       "zero_optimization": {"stage": 1 if "--fixed" in sys.argv else 3}, "zero_allow_untested_optimizer": True,
       "tensor_parallel": {"autotp_size": WORLD, "partition_config": {"use_default_specs": False, "layer_specs": [
           {"patterns": [r"q\.(weight|bias)$"], "partition_type": "column"},
           {"patterns": [r"o\.(weight|bias)$"], "partition_type": "row"}]}}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg)
print(f"rank {RANK}: q.weight shard {tuple(engine.module.q.weight.ds_shape if hasattr(engine.module.q.weight, 'ds_shape') else engine.module.q.weight.shape)}")
out = engine(x)  # the bug: under ZeRO-3 the rank without a head fails here
error = float((out.detach() - reference(x).detach()).abs().max())
errors = [torch.zeros(()) for _ in range(WORLD)]
dist.all_gather(errors, torch.tensor(error))
if RANK == 0:
    print("max |engine - one process| per rank:", ", ".join(f"{float(e):.3g}" for e in errors))
    print("OK" if max(float(e) for e in errors) < 1e-5 else "MISMATCH")
