"""megatron-core 0.15.3 (and 0.13.1) without Transformer Engine: every MoE router forward raises a NameError.

moe_utils.py imports `te_general_gemm` (with the other fused kernels) inside `try: import transformer_engine ...`,
and its `except ImportError` sets only `HAVE_TE = False`. `RouterGatingLinearFunction.forward` (the router's
logits, `router_gating_linear`) then tests `if te_general_gemm is not None and ...`: without Transformer Engine the
name does not exist, so every MoE layer's forward fails with "NameError: name 'te_general_gemm' is not defined".
0.19.2's import fallback defines it.

Found by shardfuzz's megatron-tp target against megatron-core 0.15.3 (2026-12-01: every MoE test case crashed on
rank 0 at moe_utils.py `RouterGatingLinearFunction.forward`); the known fix `megatron-moe-router-gemm-without-te`
defines the name as None. Not reported from here.

This script calls `router_gating_linear` as the router does, on the CPU.

Run: python megatron-core-0.15.3-moe-router-te-general-gemm-undefined-without-te.py (one process, CPU). Prints
CRASH (exit 1) or OK.
"""

import sys

import torch
from megatron.core.transformer.moe.moe_utils import router_gating_linear

tokens, hidden, experts = 4, 8, 3
try:
    logits = router_gating_linear(torch.randn(tokens, hidden), torch.randn(experts, hidden), None, torch.float32)
except NameError as e:
    print(f"CRASH: {e}")
    sys.exit(1)
print(f"OK: logits {tuple(logits.shape)}")
