"""megatron-core 0.19.2: GPTModel(parallel_output=False) in fp32 at tp 1 given labels crashes: an in-place op on a view.

With `parallel_output=False` GPTModel's output layer is a ColumnParallelLinear with `gather_output=True`
(gpt_model.py:280); at tensor-parallel size 1 its `gather_from_tensor_model_parallel_region` returns its input
unchanged from inside the custom autograd Function `_GatherFromModelParallelRegion` (mappings.py: "Bypass the
function if we are using only 1 GPU"). Given labels, the forward hands those logits to
`compute_language_model_loss` -> `vocab_parallel_cross_entropy`, whose `calculate_logits_max` takes `.float()` (no
copy for fp32 logits) and `calculate_predicted_logits` subtracts the maximum in place. Autograd forbids modifying
in place a view a custom Function returned as its input: "RuntimeError: Output 0 of _GatherFromModelParallelRegion
is a view and its base or another view of its base has been modified inplace". bf16 / fp16 logits are copied by
`.float()` and pass; tp > 1 gathers into a new tensor and passes (with the loss off by log(tp):
megatron-core-0.19.2-gpt-gathered-logits-loss-plus-log-tp.py).

Found by shardfuzz's megatron-tp target (2026-11-30, a 120-s campaign with Megatron's own language-model loss): a
dp 2 × tp 1 f32 case with `vocab_loss: "gathered"` crashed with this error on every rank. Known upstream (found by
search afterwards): NVIDIA/Megatron-LM#6656, fixed by PR #6657 (merged 2026-08: the gather bypasses its Function at
tp 1), after the 0.19.2 wheel. `--fixed`: the loss works on a copy of the logits.

This script runs what GPTModel runs after its decoder: the output layer's gather at tp 1 on fp32 logits from a
linear layer, and LanguageModule.compute_language_model_loss (reading `config.cross_entropy_loss_fusion`, False,
and `tp_group` of its model).

Run: python megatron-core-0.19.2-gpt-gathered-fp32-logits-tp1-inplace-loss-crash.py [--fixed] (one process, CPU,
gloo). Prints CRASH (exit 1) or OK.
"""

import os
import sys
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29551")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
group = dist.group.WORLD  # tensor-parallel size 1

model = types.SimpleNamespace(config=types.SimpleNamespace(cross_entropy_loss_fusion=False), tp_group=group)
seq, batch, hidden, vocab = 4, 2, 8, 16
torch.manual_seed(0)
hidden_states = torch.randn(seq, batch, hidden)
weight = torch.randn(vocab, hidden, requires_grad=True)
labels = torch.randint(0, vocab, (batch, seq))
output_parallel = F.linear(hidden_states, weight)  # the output layer's local logits, fp32
logits = gather_from_tensor_model_parallel_region(output_parallel, group)  # gather_output=True
if "--fixed" in sys.argv:
    logits = logits.clone()
try:
    loss = LanguageModule.compute_language_model_loss(model, labels, logits)
    loss.sum().backward()
    expected = F.cross_entropy(F.linear(hidden_states, weight).reshape(-1, vocab), labels.t().reshape(-1),
                               reduction="sum")
    ok = abs(loss.sum().item() - expected.item()) < 1e-4
    print(f"loss {loss.sum().item():.6f}, torch's {expected.item():.6f}: {'OK' if ok else 'MISMATCH'}")
    status = 0 if ok else 1
except RuntimeError as e:
    print(f"CRASH: {str(e).splitlines()[0][:200]}")
    status = 1
dist.destroy_process_group()
sys.exit(status)
