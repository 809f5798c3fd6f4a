#!/usr/bin/env python3
"""DTensor: viewing a zero-size tensor as a shape with more than one zero dimension never returns.

Found by shardfuzz (torch-dtensor, OpInfo `unflatten` sample 9: a [4, 0] input unflattened into
[2, 0, 0, 0], mesh [3], bf16). Single-device torch returns at once; on a DTensor the sharding
propagation of the view, `torch.distributed.tensor._ops._view_ops.view_groups`, loops forever: once
the input dimensions are used up, the remaining target dimension 0 is neither 1 nor matched, the
"singleton" branch backtracks `to_idx` and the loop makes no progress. The placement does not matter
(Replicate here), nor does the world size; any view/reshape/unflatten to a shape with trailing zeros
after the input's dims are consumed (e.g. [0] -> [0, 0]) hangs every rank inside dispatch.

Run:  python3 torch-2.15-dtensor-view-zero-size-hang.py   (one gloo rank on loopback; no torchrun needed)
Prints HANG (exit 1) when the DTensor view does not return within 10 s, CRASH (exit 1) when it raises,
OK (exit 0) when it returns the single-device shape. torch 2.15.0: HANG for both views; torch 2.9.1:
CRASH (IndexError: tuple index out of range, inside the same sharding propagation).
"""

import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor


def main() -> int:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    cases = [((4, 0), (4, 2, 0, 0, 0)), ((0,), (0, 0))]
    status = 0
    for shape, to in cases:
        local = torch.empty(shape)
        print(f"torch {torch.__version__}: single device {tuple(local.shape)}.view{to} -> {tuple(local.view(to).shape)}")
        x = distribute_tensor(local, mesh, [Replicate()])

        def timeout(*_):
            raise TimeoutError

        signal.signal(signal.SIGALRM, timeout)
        signal.alarm(10)
        try:
            y = x.view(to)
            signal.alarm(0)
            print(f"OK: DTensor {tuple(shape)}.view{to} -> {tuple(y.shape)}")
        except Exception as e:  # DTensor re-raises the alarm as "Sharding propagation failed"
            signal.alarm(0)
            status = 1
            if not any(isinstance(x, TimeoutError) for x in (e, e.__cause__, e.__context__)):
                cause = e.__cause__ or e.__context__
                print(f"CRASH: DTensor {tuple(shape)}.view{to}: {type(cause or e).__name__}: {cause or e}".splitlines()[0])
                continue
            print(f"HANG: DTensor {tuple(shape)}.view{to} did not return within 10 s (sharding propagation loops in view_groups)")
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
