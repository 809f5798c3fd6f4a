"""DeepSpeed 0.19.8: bf16 pipeline training crashes at the first step when a tied layer's weight is frozen (a frozen
embedding shared with the LM head, as fine-tuning keeps it).

A `TiedLayerSpec` weight sits on several stages; after the backward the engine all-reduces its gradient over them
(`PipelineEngine._exec_reduce_tied_grads`, pipe/engine.py:283): `grad = weight._hp_grad if
self.using_bf16_optimizer else weight.grad`. The BF16_Optimizer (bf16 without ZeRO, or ZeRO-1 with fp32 gradient
accumulation) gives `_hp_grad` only to the parameters it trains, so a frozen tied weight has none: "AttributeError:
'Parameter' object has no attribute '_hp_grad'". In fp32 the same model trains (`weight.grad` is None and skipped), as
it does in bf16 once the frozen weight is skipped (`--fixed`).

Found by shardfuzz (deepspeed-pp target, campaign 247: pp3 bf16, tied embeddings, `train.frozen: [embed]`).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-bf16-pipeline-frozen-tied-weight-hp-grad-crash.py [--fixed]
(CPU, gloo). Prints CRASH or OK on rank 0.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.pipe import PipelineModule, TiedLayerSpec  # noqa: E402

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # (a JIT extension for inference only)
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))

if "--fixed" in sys.argv:
    from deepspeed.runtime.pipe.engine import PipelineEngine

    original = PipelineEngine._exec_reduce_tied_grads

    def reduce_tied_grads(self):
        frozen = [w for w, _ in self.module.get_tied_weights_and_groups() if not w.requires_grad]
        for w in frozen:
            w._hp_grad = None  # nothing to reduce: the optimizer holds no gradient for it
        try:
            return original(self)
        finally:
            for w in frozen:
                del w._hp_grad

    from deepspeed.runtime.pipe import schedule

    PipelineEngine._INSTRUCTION_MAP[schedule.ReduceTiedGrads] = reduce_tied_grads  # (how the engine dispatches it)


class FrozenEmbedding(torch.nn.Embedding):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__(7, 4, dtype=torch.bfloat16)
        self.weight.requires_grad_(False)


def head(module, x):
    return x @ module.weight.t()


layers = [TiedLayerSpec("embed", FrozenEmbedding), torch.nn.Linear(4, 4, dtype=torch.bfloat16),
          torch.nn.Linear(4, 4, dtype=torch.bfloat16), TiedLayerSpec("embed", FrozenEmbedding, forward_fn=head, tied_weight_attr="weight")]
module = PipelineModule(layers=layers, num_stages=2, loss_fn=lambda out, y: out.float().pow(2).mean(),
                        partition_method="uniform")
cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 2,
       "bf16": {"enabled": True}, "gradient_clipping": 0.0, "steps_per_print": 1 << 30}
opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.1)
engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=cfg)
ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
try:
    engine.train_batch(iter([(ids, ids)]))
    failed = None
except AttributeError as e:
    failed = f"{type(e).__name__}: {e}"
status = [None] * dist.get_world_size()
dist.all_gather_object(status, failed)
if dist.get_rank() == 0:
    crashed = [f"rank {r}: {s}" for r, s in enumerate(status) if s]
    print("CRASH: " + "; ".join(crashed) if crashed else "OK")
