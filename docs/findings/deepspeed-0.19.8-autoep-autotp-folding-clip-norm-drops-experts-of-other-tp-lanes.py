"""DeepSpeed 0.19.8 (found by shardfuzz, 2026-12-04): with AutoEP and AutoTP folded onto the same ranks
(`expert_parallel.autoep_size` and `tensor_parallel.autotp_size` both > 1), the global gradient norm that ZeRO-1/2 (and
the engine without ZeRO) clip by leaves out the routed experts held by every tensor-parallel rank but the first.

Under folding an expert-parallel group spans tensor-parallel lanes, so the tensor-parallel ranks hold different
experts. The ZeRO-1/2 norm (`DeepSpeedZeroOptimizer.get_grad_norm_direct`) counts a parameter on model-parallel rank 0
only unless it is marked model parallel, then sums over the model-parallel group; AutoEP's routed-expert parameters
are not marked, so the experts of tensor-parallel rank 1 and up never enter the norm (the fp32 path without ZeRO,
`runtime.utils.clip_grad_norm_`, filters the same way). Whenever clipping is active every parameter is scaled by the
wrong coefficient. No error is raised. (Megatron-LM fixed the same undercount with EP and TP in NVIDIA/Megatron-LM#5916;
DeepSpeed's #8475 is another AutoEP clipping bug, without ZeRO and without AutoTP.)

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-autoep-autotp-folding-clip-norm-drops-experts-of-other-tp-lanes.py
[--fixed] [--stage 0|1|2]  (CPU, gloo; tp 2, ep 2, ZeRO-1 by default, SGD with clipping). It prints DeepSpeed's
global norm and the true one (every expert counted once), and compares the parameters after the step with the clipped
SGD step computed from the engine's own gradients. Released: MISMATCH (norm 2.638 against 3.596). With `--fixed`
(routed-expert parameters counted on every tensor-parallel rank): OK.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad  # noqa: E402

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
STAGE = int(sys.argv[sys.argv.index("--stage") + 1]) if "--stage" in sys.argv else 1
HIDDEN, FFN, EXPERTS, TOP_K, CLIP, LR = 8, 8, 4, 2, 1e-3, 1.0

if "--fixed" in sys.argv:
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    def counted_on_every_tp_rank(original):
        """The routed experts marked tensor-model-parallel while the norm is computed (their lanes hold different
        experts), so every rank counts its own and the model-parallel all-reduce sums them."""

        def run(self, *args, **kwargs):
            experts = [p for p in self.module.parameters()] if isinstance(self, DeepSpeedEngine) else [
                p for group in self.bit16_groups for p in group]
            experts = [p for p in experts if is_moe_param(p) and not getattr(p, "tensor_model_parallel", False)]
            for p in experts:
                p.tensor_model_parallel = True
            try:
                return original(self, *args, **kwargs)
            finally:
                for p in experts:
                    del p.tensor_model_parallel

        return run

    DeepSpeedZeroOptimizer.scaled_global_norm = counted_on_every_tp_rank(DeepSpeedZeroOptimizer.scaled_global_norm)
    DeepSpeedEngine.clip_fp32_gradients = counted_on_every_tp_rank(DeepSpeedEngine.clip_fp32_gradients)


class Experts(nn.Module):
    """Every expert's projections stacked as transformers 5 stores them, where AutoEP finds them."""

    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.randn(EXPERTS, FFN, HIDDEN) * 0.3)
        self.up_proj = nn.Parameter(torch.randn(EXPERTS, FFN, HIDDEN) * 0.3)
        self.down_proj = nn.Parameter(torch.randn(EXPERTS, HIDDEN, FFN) * 0.3)
        self.act_fn = F.silu


class MoeBlock(nn.Module):

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = Experts()


class Model(nn.Module):

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Module()])
        self.layers[0].moe = MoeBlock()
        self.head = nn.Linear(HIDDEN, 3, bias=False)

    def forward(self, x):
        return self.head(self.layers[0].moe(x))


torch.manual_seed(0)
model = Model()
x = torch.randn(1, 5, HIDDEN)
config = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_clipping": CLIP,
    "zero_optimization": {"stage": STAGE},
    "zero_allow_untested_optimizer": True,
    # AutoTP over both ranks (no layer of this model is sharded: the dense part stays replicated) ...
    "tensor_parallel": {"autotp_size": WORLD, "partition_config": {
        "use_default_specs": False, "layer_specs": [{"patterns": [r".*\.none\.weight$"], "partition_type": "column"}]}},
    # ... and AutoEP folded onto the same ranks: expert-parallel group {0, 1}, two experts on each.
    "expert_parallel": {"enabled": True, "autoep_size": WORLD, "moe_layer_pattern": r"layers\.\d+\.moe",
                        "router_pattern": "router", "expert_pattern": "experts", "expert_w1": "gate_proj",
                        "expert_w3": "up_proj", "expert_w2": "down_proj", "top_k": TOP_K, "route_norm": True},
}
make_sgd = lambda params: torch.optim.SGD(  # noqa: E731 (the expert parameters in their own groups, as ZeRO needs)
    split_params_into_different_moe_groups_for_optimizer([{"params": list(params), "name": "all"}]), lr=LR)
engine = deepspeed.initialize(model=model, config=config, optimizer=make_sgd)[0]



def full(p):
    """A parameter's full fp32 value (ZeRO's master copy; without ZeRO the parameter itself)."""
    v = safe_get_full_fp32_param(p)
    return (p if v is None else v).detach().double().clone()


def grad(p):
    v = safe_get_full_grad(p)
    return (p.grad if v is None else v).detach().double().clone()


engine.backward(engine(x).square().sum())
before, grads, square = {}, {}, torch.zeros((), dtype=torch.float64)
for name, p in engine.module.named_parameters():
    before[name], grads[name] = full(p), grad(p)
    mine = grads[name].square().sum()
    if is_moe_param(p):  # this rank's own experts: the other rank holds the others
        dist.all_reduce(mine)
    square += mine
engine.step()

true_norm, theirs = square.sqrt().item(), engine.get_global_grad_norm()
if theirs is None:  # (the engine without ZeRO records none: the norm its step implies, from the head's update)
    p, n = engine.module.head.weight, "head.weight"
    step = (before[n] - full(p)) / LR
    theirs = CLIP * (grads[n].square().sum() / (step * grads[n]).sum()).item()
theirs = float(theirs)
coef = min(1.0, CLIP / (true_norm + 1e-6))
worst = max((full(p) - (before[n] - LR * coef * grads[n])).abs().max().item()
            for n, p in engine.module.named_parameters())
if RANK == 0:
    print(f"ZeRO-{STAGE}: DeepSpeed's global grad norm {theirs:.6f}, every expert counted once {true_norm:.6f}; "
          f"largest parameter error after the clipped step {worst:.3e}")
    print("OK" if abs(theirs - true_norm) < 1e-4 * true_norm and worst < 1e-7 else "MISMATCH")
