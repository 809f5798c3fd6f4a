"""DeepSpeed 0.19.8: `partition_activations` without model parallelism crashes the backward when a checkpointed
function's input is a leaf tensor (a frozen embedding's output made to require a gradient, as PEFT / LoRA
training does with `enable_input_require_grads`).

`deepspeed.checkpointing.checkpoint` with `partition_activations` replaces each input's storage with a flat
partition in the forward (`partition_activations`, `get_partitioned_activations_for_backward`). In the backward,
`gather_partitioned_activations` gathers the partitions and gives the tensor its shape back
(`item.data = input_tensor.data`), except when there is no model-parallel group (`mp_group is None or
mp_size == 1`): that branch returns a reshaped *view* (`item = item.view(size)`) and leaves the caller's tensor
flat. The recomputation runs on the view and is right, but the input tensor itself stays flat after the
checkpoint's backward: a leaf's AccumulateGrad then adds a gradient of the right shape to a flat tensor,
"RuntimeError: The size of tensor a (64) must match the size of tensor b (8)". Without partitioning, or with the
shape given back in that branch too (`--fixed`), the gradients equal torch's checkpoint's.

Found by shardfuzz (deepspeed-zero target, `parallel.framework_checkpoint: partition`, frozen embedding).

Run: python deepspeed-0.19.8-partition-activations-without-model-parallelism-leaf-input-crash.py [--fixed]
(one process, CPU accelerator, gloo). Prints CRASH, MISMATCH or OK.
"""

import importlib
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
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
    original = ck.gather_partitioned_activations

    def gather(tensors, device=None):
        if ck.mp_group is not None and ck.mp_size != 1:
            return original(tensors, device)
        inputs = []
        for item, size in zip(tensors[0::2], tensors[1::2]):
            if ck.is_activation_to_checkpoint(item):
                item.data = item.data.view(list(size.numpy()))  # the caller's tensor gets its shape back
                if device is not None:
                    item.data = item.data.to(device)
            inputs.append(item)
        return tuple(inputs)

    ck.gather_partitioned_activations = gather


def gradients(blocks, embed, ids, checkpointed):
    for p in blocks.parameters():
        p.grad = None
    x = embed(ids).requires_grad_(True)  # a frozen embedding's output: a leaf, as enable_input_require_grads makes
    for b in blocks:
        x = ck.checkpoint(b, x) if checkpointed else b(x)
    x.pow(2).mean().backward()
    return [p.grad.clone() for p in blocks.parameters()]


def main():
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    if "--fixed" in sys.argv:
        fix()
    ck.configure(None, partition_activations=True)  # no model-parallel unit: mp_size 1
    torch.manual_seed(0)
    embed = nn.Embedding(16, 8).requires_grad_(False)
    blocks = nn.ModuleList(Block() for _ in range(2))
    ids = torch.randint(0, 16, (2, 4))
    expected = gradients(blocks, embed, ids, checkpointed=False)
    try:
        got = gradients(blocks, embed, ids, checkpointed=True)
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
