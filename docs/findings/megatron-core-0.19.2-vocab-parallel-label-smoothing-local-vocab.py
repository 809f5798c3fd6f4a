"""megatron-core 0.19.2: vocab_parallel_cross_entropy's label smoothing uses the rank's vocabulary shard as the vocabulary.

`megatron.core.tensor_parallel.vocab_parallel_cross_entropy(logits, target, label_smoothing=α)` (cross_entropy.py,
`_VocabParallelCrossEntropy.forward`, lines 158-176, and `backward`, 191-200) smooths with

    vocab_size = exp_logits.size(-1)                      # the shard's width, not the vocabulary's
    smoothing = label_smoothing * vocab_size / (vocab_size - 1)
    mean_log_probs = log(exp_logits).mean(dim=-1)         # over the shard only, never all-reduced
    loss = (1 - smoothing) * loss - smoothing * mean_log_probs

so under tensor parallelism each rank's loss differs (the loss is meant to be the same on every rank), and the
backward subtracts α / (V_shard - 1) from every non-target logit's gradient where α / (V - 1) is right. With one
rank (tp 1) the result is right. Upstream: NVIDIA/Megatron-LM#737 (2024, open), #7464 and PR #7466 (open); this
script shows it on the released 0.19.2 wheel.

Found by shardfuzz's megatron-tp target once the case model had label smoothing (2026-11-30): a tp 2 f32 case
diverges on its loss (5,000x the round-off a correct run shows) and on every gradient, the same case at tp 1 and
with the LM head gathered into torch's loss passes, and it passes at tp 2 with the fix (`--fixed`: the vocabulary's
size and its log-probabilities' sum all-reduced over the group; the released backward given that size).

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-vocab-parallel-label-smoothing-local-vocab.py [--fixed]
(CPU, gloo). Compares every rank's loss and gradient with torch's F.cross_entropy(label_smoothing=ε) on the whole
vocabulary, ε = α V / (V - 1) (the same target distribution: 1 - α on the target, α / (V - 1) elsewhere).
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
os.environ.setdefault("MASTER_PORT", "29548")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.group.WORLD


def fix():
    """The vocabulary's size and its log-probabilities' sum over the whole tensor-parallel group."""
    released, vp = ce._VocabParallelCrossEntropy, ce.VocabParallelCrossEntropy

    class Fixed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0, tp_group=None):
            tp_group = tp_group or ce.get_tensor_model_parallel_group()
            logits, logits_max = vp.calculate_logits_max(vocab_parallel_logits)
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=tp_group)
            part, r, w = logits.size()[-1], ce.get_pg_rank(tp_group), ce.get_pg_size(tp_group)
            start, end = ce.VocabUtility.vocab_range_from_per_partition_vocab_size(part, r, w)
            mask, masked_target, predicted, sum_exp, exp_logits = vp.calculate_predicted_logits(
                logits, target, logits_max, start, end)
            dist.all_reduce(predicted, group=tp_group)
            dist.all_reduce(sum_exp, group=tp_group)
            exp_logits, loss = vp.calculate_cross_entropy_loss(exp_logits, predicted, sum_exp)
            vocab_size = part * w
            if label_smoothing > 0:
                smoothing = label_smoothing * vocab_size / (vocab_size - 1)
                log_prob_sum = torch.log(exp_logits).sum(dim=-1)
                dist.all_reduce(log_prob_sum, group=tp_group)
                loss = (1.0 - smoothing) * loss - smoothing * log_prob_sum / vocab_size
            ctx.label_smoothing, ctx.vocab_size = label_smoothing, vocab_size
            ctx.save_for_backward(exp_logits, mask, masked_target)
            return loss

        backward = released.backward

    ce._VocabParallelCrossEntropy = Fixed


if "--fixed" in sys.argv:
    fix()

seq, batch, vocab, alpha = 4, 3, 16, 0.1
torch.manual_seed(0)
logits = torch.randn(seq, batch, vocab) * 2
target = torch.randint(0, vocab, (seq, batch))
shard = vocab // world
local = logits[..., rank * shard:(rank + 1) * shard].clone().requires_grad_(True)
loss = vocab_parallel_cross_entropy(local, target, label_smoothing=alpha, tp_group=group)  # [seq, batch]
loss.sum().backward()

whole = logits.clone().double().requires_grad_(True)
eps = alpha * vocab / (vocab - 1)
expected = F.cross_entropy(whole.reshape(-1, vocab), target.reshape(-1), reduction="none", label_smoothing=eps)
expected.sum().backward()
expected_grad = whole.grad[..., rank * shard:(rank + 1) * shard]

loss_err = (loss.double().reshape(-1) - expected).abs().max().item()
grad_err = (local.grad.double() - expected_grad).abs().max().item()
bad = loss_err > 1e-5 or grad_err > 1e-5
print(f"rank {rank}/{world}: loss max |error| {loss_err:.3e}, gradient max |error| {grad_err:.3e} "
      f"({'fixed' if '--fixed' in sys.argv else 'released'}): {'MISMATCH' if bad else 'OK'}", flush=True)
dist.destroy_process_group()
sys.exit(1 if bad else 0)
