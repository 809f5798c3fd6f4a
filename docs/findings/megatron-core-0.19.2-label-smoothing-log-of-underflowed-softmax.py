"""megatron-core 0.19.2: vocab_parallel_cross_entropy's label smoothing is infinite once a probability underflows.

`megatron.core.tensor_parallel.vocab_parallel_cross_entropy(logits, target, label_smoothing=α)` smooths with the
mean of `torch.log(exp_logits)` (cross_entropy.py:172-176), where `exp_logits` are the softmax probabilities in
fp32. A logit more than about 104 below its row's largest has a probability that underflows to 0, its log is
-inf, and the smoothed loss is +inf; the backward's gradient stays finite, so training goes on with an infinite
loss (and NaN once an optimizer or a loss scaler looks at it). torch's `F.cross_entropy(label_smoothing=ε)` takes
log-softmax values, finite for the same logits. Any tensor-parallel size, one rank included.

Found by shardfuzz's megatron-tp campaign 178 (2026-11-30, the first with label smoothing): cases at tp 1 with
`outliers` data diverged with a NaN loss where torch's loss, megatron-ddp's (torch's loss under megatron's DDP)
and the reference are finite. The unmerged upstream PRs NVIDIA/Megatron-LM#5522 and #7466 (for the local-vocabulary
bug, #737 / #7464) mention it in passing; no issue of its own was found. `--fixed` takes the log-probabilities'
sum from the logits, Σ x - V (max + log Σ exp).

Run: python megatron-core-0.19.2-label-smoothing-log-of-underflowed-softmax.py [--fixed] (one process, CPU, gloo).
Prints MISMATCH (exit 1) or OK.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.tensor_parallel import cross_entropy as ce
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29549")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
group = dist.group.WORLD


def fix():
    """Megatron's forward with the smoothing term from log-softmax values, not from the log of probabilities."""
    released, vp = ce._VocabParallelCrossEntropy, ce.VocabParallelCrossEntropy

    class Fixed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0, tp_group=None):
            logits, logits_max = vp.calculate_logits_max(vocab_parallel_logits)
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=tp_group)
            logit_sum = logits.sum(dim=-1)  # (before calculate_predicted_logits exponentiates in place)
            part = logits.size()[-1]
            start, end = ce.VocabUtility.vocab_range_from_per_partition_vocab_size(
                part, ce.get_pg_rank(tp_group), ce.get_pg_size(tp_group))
            mask, masked_target, predicted, sum_exp, exp_logits = vp.calculate_predicted_logits(
                logits, target, logits_max, start, end)
            dist.all_reduce(predicted, group=tp_group)
            dist.all_reduce(sum_exp, group=tp_group)
            exp_logits, loss = vp.calculate_cross_entropy_loss(exp_logits, predicted, sum_exp)
            if label_smoothing > 0:
                smoothing = label_smoothing * part / (part - 1)
                log_prob_sum = logit_sum - part * (logits_max + torch.log(sum_exp))
                loss = (1.0 - smoothing) * loss - smoothing * log_prob_sum / part
            ctx.label_smoothing, ctx.vocab_size = label_smoothing, part
            ctx.save_for_backward(exp_logits, mask, masked_target)
            return loss

        backward = released.backward

    ce._VocabParallelCrossEntropy = Fixed


if "--fixed" in sys.argv:
    fix()

vocab, alpha = 8, 0.1
logits = torch.tensor([[[0.0, 1.0, 2.0, -3.0, 0.5, 1.5, -1.0, -110.0]]])  # [seq 1, batch 1, vocab]: one logit far below
target = torch.tensor([[2]])
loss = vocab_parallel_cross_entropy(logits.clone(), target, label_smoothing=alpha, tp_group=group)
eps = alpha * vocab / (vocab - 1)  # torch's ε for megatron's α (the same target distribution)
expected = F.cross_entropy(logits.reshape(-1, vocab).double(), target.reshape(-1), label_smoothing=eps)
err = (loss.double().reshape(()) - expected).abs().item()
bad = not err < 1e-5
print(f"megatron loss {loss.item()}, torch's {expected.item():.6f} "
      f"({'fixed' if '--fixed' in sys.argv else 'released'}): {'MISMATCH' if bad else 'OK'}", flush=True)
dist.destroy_process_group()
sys.exit(1 if bad else 0)
