"""DeepSpeed 0.19.8: without ZeRO in fp32, gradient clipping beside MoE expert parallelism clips by the average of the
ranks' norms, not by the global gradient norm.

The engine clips fp32 gradients without ZeRO through deepspeed.runtime.utils.clip_grad_norm_ (engine.py:3503), which,
"to consider MoE params when calculating norm as they will result in different norms across different ranks"
(utils.py:358-360), computes each rank's local 2-norm over its parameters (the shared ones and the experts it holds)
and then averages the *norms* over the data-parallel group (utils.py:413-419): mean_r sqrt(S + E_r), where S is the
shared gradients' squared norm and E_r rank r's experts'. The norm of the whole gradient is sqrt(S + E_0 + E_1 + ...)
(each expert counted once), which is what ZeRO-1/2 clip by for the same model. The clipping coefficient, and every
parameter's update, differ whenever the clip is active.

Found by shardfuzz (deepspeed-zero target, campaign 255): four dp2 ep2 ZeRO-0 f32 MoE cases with gradient clipping
diverged after their first step (loss/step1 237x its noise, parameters up to 8x); step-0 gradients (before clipping)
matched; each passes without clipping, with ep 1, or with the fix below.

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-moe-fp32-clip-norm-averages-rank-norms.py [--fixed]
(CPU, gloo; one expert per rank; `--fixed` clips by the global norm). Prints the clipping coefficient DeepSpeed applied
and the global norm's, then MISMATCH or OK on rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer  # noqa: E402
from deepspeed.utils import groups  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
MAX_NORM = 0.01


def global_norm(engine):
    """The whole gradient's 2-norm: shared gradients once, each expert's squares summed over the data-parallel ranks
    and divided by its replica count."""
    grads = [(p, p.grad) for p in engine.module.parameters() if p.grad is not None]
    shared = sum((g.float().norm() ** 2 for p, g in grads if not is_moe_param(p)), torch.zeros(()))
    experts = sum((g.float().norm() ** 2 / groups._get_expert_data_parallel_world_size(p.group_name)
                   for p, g in grads if is_moe_param(p)), torch.zeros(()))
    dist.all_reduce(experts, group=groups._get_data_parallel_group())
    return (shared + experts).sqrt()


if "--fixed" in sys.argv:
    from deepspeed.runtime.engine import DeepSpeedEngine

    def clip_fp32_gradients(self):
        coef = torch.clamp(self.gradient_clipping() / (global_norm(self) + 1e-6), max=1.0)
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.data.mul_(coef)

    DeepSpeedEngine.clip_fp32_gradients = clip_fp32_gradients


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = torch.nn.Linear(4, 4)
        self.moe = MoE(hidden_size=4, expert=torch.nn.Linear(4, 4), num_experts=WORLD, ep_size=WORLD, k=1,
                       use_rts=False, drop_tokens=False)

    def forward(self, x):
        return self.moe(self.shared(x))[0]


torch.manual_seed(0)
model = Model()
params = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "all"})
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": WORLD,
       "gradient_clipping": MAX_NORM, "zero_optimization": {"stage": 0}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(params, lr=0.1), config=cfg)
torch.manual_seed(1 + RANK)
engine.backward(engine(torch.randn(1, 8, 4)).pow(2).sum())
shared = engine.module.shared.weight
before = shared.grad.detach().clone()  # the reduced (data-parallel averaged) gradient of a shared weight
expected = min(1.0, MAX_NORM / (float(global_norm(engine)) + 1e-6))
engine.clip_fp32_gradients()
applied = float(shared.grad.norm() / before.norm())
if RANK == 0:
    print(f"clipping coefficient applied {applied:.6f}, by the global gradient norm {expected:.6f}")
    print("MISMATCH" if abs(applied - expected) > 1e-5 * expected else "OK")
