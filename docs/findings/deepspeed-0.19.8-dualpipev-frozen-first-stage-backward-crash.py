"""DeepSpeed 0.19.8: DualPipeV crashes in its first backward when the first stage's layers are all frozen (a frozen
embedding, or frozen bottom layers, as fine-tuning keeps them).

Under DualPipeV (`DualPipeVModule` / `DualPipeVEngine`) rank 0 holds two stages: the first (phase 0) and the last
(phase 1). With a frozen first stage rank 0 still trains the last one, so it has an optimizer and runs the schedule,
whose backward pass for phase 0 calls the parent engine's `_exec_backward_pass`: `outputs.backward(gradient=...)`
(pipe/engine.py) on the first stage's output, which here needs no gradient (integer token ids through frozen
layers): "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn". Nothing needs that
backward (no trainable parameter or input behind it): skipping it (`--fixed`) trains the rest as a single device does.
(Under the 1F1B TrainSchedule such a stage is a rank of its own with nothing to train, which DeepSpeed cannot run
anyway: torch refuses an optimizer over no parameters.)

Found by shardfuzz (deepspeed-pp target, campaign 248: pp2 dp2 DualPipeV, tied embeddings, `train.frozen: [embed,
layers.0]`).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-dualpipev-frozen-first-stage-backward-crash.py [--fixed]
(CPU, gloo). Prints CRASH (on the failing rank), MISMATCH or OK.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.runtime.pipe.dualpipev import DualPipeVEngine, DualPipeVModule  # noqa: E402

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # (a JIT extension for inference only)
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
LR = 0.1

if "--fixed" in sys.argv:
    from deepspeed.runtime.pipe import schedule

    original = DualPipeVEngine._INSTRUCTION_MAP[schedule.BackwardPass]

    def backward_pass(self, buffer_id, phase):
        outputs = self.pipe_buffers["outputs"][buffer_id]
        first = outputs if torch.is_tensor(outputs) else outputs[0]
        if phase == 0 and self.stage_id == 0 and first is not None and not first.requires_grad:
            self.pipe_buffers["outputs"][buffer_id] = None  # nothing behind it needs a gradient
            self.pipe_buffers["inputs"][buffer_id] = None
            return None
        return original(self, buffer_id, phase)

    DualPipeVEngine._INSTRUCTION_MAP[schedule.BackwardPass] = backward_pass  # (how the engine dispatches it)


def layers():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(7, 4)
    embed.weight.requires_grad_(False)
    return [embed, torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]


IDS = torch.tensor([[1, 2], [3, 4], [5, 6], [0, 1]])
G = torch.Generator().manual_seed(1)
Y = torch.randn(4, 2, 4, generator=G)


def loss_fn(out, y):
    return ((out - y) ** 2).sum()


module = DualPipeVModule(layers=layers(), num_stages=2, loss_fn=loss_fn, partition_method="uniform")
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "train_batch_size": 4,
       "gradient_clipping": 0.0, "zero_optimization": {"stage": 0}, "steps_per_print": 1 << 30}
opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=LR)
engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=cfg)
try:
    engine.train_batch(iter([(IDS[i:i + 1], Y[i:i + 1]) for i in range(4)]))
except RuntimeError as e:
    print(f"CRASH on rank {dist.get_rank()}: {type(e).__name__}: {e}", flush=True)
    os._exit(1)  # (its peer is left waiting in the schedule; torchrun stops it)
mine = {name: p.detach().clone() for name, p in module.named_parameters()}
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, mine)

reference = torch.nn.Sequential(*layers())
ref_opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=LR)
(loss_fn(reference(IDS), Y) / 4).backward()  # (the engine averages over its 4 micro-batches)
ref_opt.step()
if dist.get_rank() == 0:
    expected = dict(reference.named_parameters())
    worst = max((v - expected[k]).abs().max().item() for stage in gathered for k, v in stage.items())
    print(f"largest parameter difference after one step: {worst:.3e}")
    print("OK" if worst < 1e-5 else "MISMATCH")
