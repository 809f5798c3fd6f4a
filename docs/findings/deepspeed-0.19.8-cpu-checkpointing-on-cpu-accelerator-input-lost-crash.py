"""DeepSpeed 0.19.8: `cpu_checkpointing` on the CPU accelerator loses every checkpointed input; the backward's
recomputation runs on an empty tensor and crashes.

`deepspeed.checkpointing.checkpoint` with `cpu_checkpointing` (and no partitioning) keeps each input for the
backward as a host copy: the forward takes `inputs = copy_to_device(args, cpu)`, then
`get_cpu_activations_for_backward(args, inputs)` frees the device tensor (`arg.data = torch.empty([])`) and only
then saves the copy (`arg.saved_data = inp.data`). On the CPU accelerator (`is_synchronized_device()`: no async
offload engine) the "copy" is the input itself (`Tensor.to("cpu")` of a CPU tensor returns it), so the storage it
saves is the empty one it just put there. The recomputation in the backward then runs the checkpointed function on
a 0-d tensor: "Given normalized_shape=[8], expected input with shape [*, 8], but got input of size[]" here, or
whatever the function does with a scalar. Saving the input's storage before emptying it (`--fixed`) gives torch's
gradients.

Found by shardfuzz (deepspeed-zero target, `parallel.framework_checkpoint: cpu`).

Run: python deepspeed-0.19.8-cpu-checkpointing-on-cpu-accelerator-input-lost-crash.py [--fixed]
(one process, CPU accelerator, gloo). Prints CRASH, MISMATCH or OK.
"""

import importlib
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29562", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(k, v)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import deepspeed  # noqa: E402
from deepspeed.runtime.activation_checkpointing import checkpointing as ck  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.lin = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.lin(self.norm(x)))


def fix():
    def keep(args, inputs):
        kept = [inp.data if torch.is_tensor(inp) else None for inp in inputs]  # before anything is emptied
        new_args = []
        for arg, data in zip(args, kept):
            if ck.is_activation_to_checkpoint(arg):
                arg.data = torch.empty([], device=arg.device).data
                arg.saved_data = data
            new_args.append(arg)
        return new_args

    ck.get_cpu_activations_for_backward = keep


def gradients(blocks, x0, checkpointed):
    for p in blocks.parameters():
        p.grad = None
    x = x0.clone().requires_grad_(True) * 1.0
    for b in blocks:
        x = ck.checkpoint(b, x) if checkpointed else b(x)
    x.pow(2).mean().backward()
    return [p.grad.clone() for p in blocks.parameters()]


def main():
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    if "--fixed" in sys.argv:
        fix()
    ck.configure(None, checkpoint_in_cpu=True)
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(2))
    x0 = torch.randn(2, 4, 8)
    expected = gradients(blocks, x0, checkpointed=False)
    try:
        got = gradients(blocks, x0, checkpointed=True)
    except RuntimeError as e:
        print(f"CRASH: {e}")
        return 1
    if all(torch.allclose(a, b) for a, b in zip(expected, got)):
        print("OK")
        return 0
    print("MISMATCH")
    return 1


if __name__ == "__main__":
    sys.exit(main())
