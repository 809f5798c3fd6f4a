#!/usr/bin/env python3
"""torch 2.5.1 (CPU): `torch.nn.functional.rms_norm` on a float16 input squares it in float16, so a row with any element
above 256 in magnitude has an infinite mean square and normalises to all zeros; in float32 the same row normalises to
O(1) values. torch 2.15 accumulates in float32 and gives the right float16 result. Reported upstream as
pytorch/pytorch#133085 and #134106 (2024-08, for nn.RMSNorm in fp16).

Found by shardfuzz: the test suite's 60-s colossalai-zero campaign (`.venv-colossalai`, torch 2.5.1) flagged a float16
case with large activations (`data.distribution: large`) whose logits diverged from the reference; the same case
diverges on torch-ddp at one rank under torch 2.5.1 and passes under torch 2.15: a single-device bug of the norm, not
of the sharding.

Run: python torch-2.5.1-rms-norm-float16-overflow.py   (BUG, exit 1, under torch 2.5.1; OK under torch 2.15)
"""

import sys

import torch
import torch.nn.functional as F

x = torch.tensor([[300.0, 400.0, 10.0, 5.0]])
w = torch.ones(4)
half = F.rms_norm(x.half(), (4,), w.half(), 1e-6).float()
full = F.rms_norm(x, (4,), w, 1e-6)
print(f"torch {torch.__version__}: float16 {half.tolist()}, float32 {full.tolist()}")
if not torch.allclose(half, full, rtol=1e-2, atol=1e-2):
    print("BUG: float16 rms_norm overflows where float32 gives O(1) values")
    sys.exit(1)
print("OK")
