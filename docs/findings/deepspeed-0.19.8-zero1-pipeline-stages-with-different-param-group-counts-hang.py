"""DeepSpeed 0.19.8: ZeRO-1 beside pipeline parallelism hangs at the first optimizer step when the pipeline stages'
optimizers have different numbers of parameter groups.

DeepSpeedZeroOptimizer.step computes the gradient norm per parameter group (`scaled_global_norm`:
`get_grad_norm_direct` for each of `bit16_groups`), and every call all-reduces its partial norm over the data-parallel
group and then over the model-parallel group (`_model_parallel_all_reduce`, stage_1_and_2.py:2646). A pipeline's
model-parallel group spans its stages (PipelineParallelGrid's `ds_model_proc_group`). Each stage builds its optimizer
over its own parameters, so the groups differ per stage whenever a group is empty on some stage and dropped there: the
usual "no weight decay for biases and norms" grouping on a stage that holds only an embedding (a frozen or bias-free
stack), or DeepSpeed's own MoE groups (`split_params_into_different_moe_groups_for_optimizer`) on a stage without
experts. A stage with two groups then makes two model-parallel all-reduces where its peer stage makes one, and waits in
the second forever (gloo: until the process group's timeout). The norm is one number: summing the groups' squares on
each rank before a single model-parallel all-reduce (`--fixed`) needs no agreement on the group count.

Found by shardfuzz (deepspeed-pp target, campaign 247b: pp2 dp2 ZeRO-1 f32, the blocks frozen, `no_decay_vectors`
grouping: the first stage holds only the embedding's matrix, the last stage the head's matrix and the final norm's
vectors).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero1-pipeline-stages-with-different-param-group-counts-hang.py
[--fixed] (CPU, gloo; a 30 s watchdog). Prints HANG, MISMATCH or OK on rank 0.
"""

import importlib
import os
import sys
import threading

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.pipe import PipelineModule  # noqa: E402

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # (a JIT extension for inference only)
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
LR = 0.1

if "--fixed" in sys.argv:
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    def scaled_global_norm(self, norm_type=2):
        # Every group's squared partial norm first, then one all-reduce over data- and model-parallel ranks.
        total = torch.zeros((), dtype=torch.float32)
        for i, _ in enumerate(self.bit16_groups):
            for g, p in zip(self.averaged_gradients[i], self.params_in_partition[i]):
                if not getattr(p, "ds_pipe_replicated", False) and (self.model_parallel_rank == 0 or
                                                                      getattr(p, "model_parallel", False)):
                    total += g.float().norm() ** 2
        dist.all_reduce(total, group=self.dp_process_group)
        if self.model_parallel_group is not None and dist.get_world_size(self.model_parallel_group) > 1:
            dist.all_reduce(total, group=self.model_parallel_group)
        return total.sqrt()

    DeepSpeedZeroOptimizer.scaled_global_norm = scaled_global_norm


def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4)]  # stage 0: a matrix; stage 1: a matrix, a vector


def groups(params):
    """The usual decay / no-decay grouping, empty groups left out."""
    params = list(params)
    out = [{"params": [p for p in params if p.dim() >= 2]}, {"params": [p for p in params if p.dim() < 2],
                                                               "weight_decay": 0.0}]
    return [g for g in out if g["params"]]


G = torch.Generator().manual_seed(1)
X, Y = torch.randn(2, 4, generator=G), torch.randn(2, 4, generator=G)


def loss_fn(out, y):
    return ((out - y) ** 2).sum()


module = PipelineModule(layers=layers(), num_stages=2, loss_fn=loss_fn, partition_method="uniform")
cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 2,
       "gradient_clipping": 0.0, "zero_optimization": {"stage": 1},
       "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30}
opt = torch.optim.SGD(groups(module.parameters()), lr=LR, weight_decay=0.0)
engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=cfg)
print(f"rank {dist.get_rank()}: {len(opt.param_groups)} parameter group(s)", flush=True)


def hung():
    if dist.get_rank() == 0:
        print("HANG: a stage waits in a model-parallel all-reduce its peer stage never makes", flush=True)
    os._exit(1)


watchdog = threading.Timer(30, hung)
watchdog.start()
engine.train_batch(iter([(X, Y)]))
watchdog.cancel()
mine = {name: p.detach().clone() for name, p in module.named_parameters()}
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, mine)

reference = torch.nn.Sequential(*layers())
ref_opt = torch.optim.SGD(groups(reference.parameters()), lr=LR, weight_decay=0.0)
loss_fn(reference(X), Y).backward()
ref_opt.step()
if dist.get_rank() == 0:
    expected = dict(reference.named_parameters())
    worst = max((v - expected[k]).abs().max().item() for stage in gathered for k, v in stage.items())
    print(f"largest parameter difference after one step: {worst:.3e}")
    print("OK" if worst < 1e-6 else "MISMATCH")
