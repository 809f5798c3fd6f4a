"""megatron-core 0.19.2: GPTModel(parallel_output=False) given labels returns the loss plus log(tp).

GPTModel builds its output layer with `gather_output=not self.parallel_output` (gpt_model.py:280), and given
`labels` its forward returns `self.compute_language_model_loss(labels, logits)` (gpt_model.py:794). That method
(LanguageModule, language_module.py:194, the unfused path) always calls `tensor_parallel.vocab_parallel_cross_entropy`,
which takes the last dimension for this rank's vocabulary shard. With `parallel_output=False` under tensor
parallelism the logits are the whole vocabulary on every rank: the all-reduced sum of exponentials counts the
vocabulary tp times and only rank 0 finds the target in "its" range, so the loss is the right one plus log(tp) and
the target's gradient term is lost. Upstream: finding 2 of NVIDIA/Megatron-LM#7452 (open), no fix released.

Found by shardfuzz's megatron-tp target once its loss became Megatron's own language-model loss (2026-11-30): its
`vocab_loss: "gathered"` cases (the output layer's `gather_output=True`, as GPTModel's `parallel_output=False`)
diverge at tp 2 by log 2 on every token's loss, and pass at tp 1, with the vocabulary-sharded loss, and with the fix
(`--fixed`: gathered logits take the whole-vocabulary loss).

This script runs LanguageModule.compute_language_model_loss itself on what GPTModel hands it: the logits of a
ColumnParallelLinear with gather_output=True, and the model's tensor-parallel group (the method reads only
`config.cross_entropy_loss_fusion`, False, and `tp_group` of its model).

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-gpt-gathered-logits-loss-plus-log-tp.py [--fixed]
(CPU, gloo). Prints MISMATCH (exit 1) or OK.
"""

import math
import os
import sys
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.models.common.language_module.language_module import LanguageModule

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29550")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.group.WORLD  # the tensor-parallel group: every rank

if "--fixed" in sys.argv:
    released = LanguageModule.compute_language_model_loss

    def compute_language_model_loss(self, labels, logits):
        if self.parallel_output:
            return released(self, labels, logits)
        s, b, v = logits.shape
        loss = F.cross_entropy(logits.float().reshape(-1, v), labels.t().reshape(-1), reduction="none")
        return loss.view(s, b).t().contiguous()

    LanguageModule.compute_language_model_loss = compute_language_model_loss

# What GPTModel(parallel_output=False) holds: an unfused loss, its tp group, and its choice of gathered logits.
model = types.SimpleNamespace(config=types.SimpleNamespace(cross_entropy_loss_fusion=False),
                              tp_group=group, parallel_output=False)
seq, batch, vocab = 4, 2, 8
torch.manual_seed(0)
full = torch.randn(seq, batch, vocab)
labels = torch.randint(0, vocab, (batch, seq))
shard = vocab // world
local = full[..., rank * shard:(rank + 1) * shard].clone().requires_grad_(True)


class Gather(torch.autograd.Function):
    """megatron's _GatherFromModelParallelRegion (ColumnParallelLinear's gather_output=True) without its CUDA
    allocation: forward, the shards gathered along the vocabulary; backward, this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(world, dim=-1)[rank].contiguous()


logits = Gather.apply(local)
loss = LanguageModule.compute_language_model_loss(model, labels, logits)  # [batch, seq]
loss.sum().backward()

whole = full.clone().double().requires_grad_(True)
expected = F.cross_entropy(whole.reshape(-1, vocab), labels.t().reshape(-1), reduction="none").view(seq, batch).t()
expected.sum().backward()
loss_err = (loss.double() - expected).abs().max().item()
grad_err = (local.grad.double() - whole.grad[..., rank * shard:(rank + 1) * shard]).abs().max().item()
bad = loss_err > 1e-5 or grad_err > 1e-5
print(f"rank {rank}/{world}: loss max |error| {loss_err:.4f} (log tp = {math.log(world):.4f}), gradient max |error| "
      f"{grad_err:.3e} ({'fixed' if '--fixed' in sys.argv else 'released'}): {'MISMATCH' if bad else 'OK'}", flush=True)
dist.destroy_process_group()
sys.exit(1 if bad else 0)
