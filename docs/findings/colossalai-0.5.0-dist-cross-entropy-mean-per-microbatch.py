# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin's causal-LM loss is a mean per
# micro-batch. Under pipeline parallelism shardformer's Llama forward computes the loss with dist_cross_entropy
# (shardformer/layer/loss.py:242-260), which divides each micro-batch's summed token loss by that micro-batch's
# own count of labels that are not -100; the 1F1B schedule then divides each micro-batch's loss by the
# micro-batch count (pipeline/schedule/one_f_one_b.py:272) and sums. With ignored labels (padding, masked
# prompts) the micro-batches hold different counts, so the loss and every gradient are a mean of means: they
# change with pp's micro-batching, and differ from the same model and batch on one device. A micro-batch whose
# labels are all -100 gives 0/0: the step's loss is NaN. (The data-parallel ranks are averaged the same way;
# sequence-parallel ranks are counted together, loss.py:253-258.) transformers fixed this class in its own
# trainer with `num_items_in_batch` (the whole batch's count), which shardformer's forward takes in **kwargs
# and drops. Fix (`--fixed`): each micro-batch's summed loss over the whole batch's count, times the micro-batch
# count the schedule divides by. Found by shardfuzz (target colossalai-hybrid, the model's own labels path, a
# 1F1B pp2 case with padded labels). Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IGNORE = -100
MICRO = 2
# Two sequences, one per micro-batch: the first predicts 1 token, the second 5 (the rest is padding).
IDS = torch.tensor([[3, 7, 1, 4, 4, 4], [2, 9, 5, 8, 6, 11]])
LABELS = torch.tensor([[3, 7, IGNORE, IGNORE, IGNORE, IGNORE], [2, 9, 5, 8, 6, 11]])


def fix():
    from colossalai.shardformer.modeling import llama

    original = llama.dist_cross_entropy
    batch_count = int((LABELS[:, 1:] != IGNORE).sum())

    def dist_cross_entropy(labels, logits, *args, **kwargs):
        count = (labels[..., 1:] != IGNORE).sum()
        if count == 0:
            return logits.sum() * 0.0
        return original(labels, logits, *args, **kwargs) * count * (MICRO / batch_count)

    llama.dist_cross_entropy = dist_cross_entropy


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, attn_implementation="eager")
    return LlamaForCausalLM(config)


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29567", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    dist.Backend.HCCL = getattr(dist.Backend, "HCCL", "hccl")  # p2p.py reads it; absent from CPU builds
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    # One device: the same model and batch, the same labels, transformers' own loss (the whole batch's mean).
    reference = model()
    expected = reference(input_ids=IDS, labels=LABELS).loss
    expected.backward()

    plugin = HybridParallelPlugin(tp_size=1, pp_size=2, num_microbatches=MICRO, precision="fp32")
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model(), torch.optim.SGD(reference.parameters(), lr=0.1))
    batch = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": LABELS}
    out = booster.execute_pipeline(iter([batch]), boosted, lambda outputs, _: outputs.loss, optimizer, return_loss=True)
    if plugin.stage_manager.is_last_stage():
        got = boosted.unwrap().lm_head.weight.grad[:16]  # (its rows padded to a multiple of 64)
        want = reference.lm_head.weight.grad
        loss_ok = torch.allclose(out["loss"], expected, rtol=1e-5, atol=1e-6)
        grad_ok = torch.allclose(got, want, rtol=1e-4, atol=1e-6)
        print(f"loss: pipeline {float(out['loss']):.6f}, one device {float(expected):.6f}"
              f" (mean of the micro-batch means: {mean_of_means(reference):.6f})")
        print(f"lm_head.weight grad: max |pipeline - one device| = {float((got - want).abs().max()):.3e},"
              f" |one device| max {float(want.abs().max()):.3e}")
        print("OK" if loss_ok and grad_ok else "MISMATCH")
    dist.destroy_process_group()


def mean_of_means(reference):
    with torch.no_grad():
        means = [reference(input_ids=IDS[i:i + 1], labels=LABELS[i:i + 1]).loss for i in range(MICRO)]
    return float(sum(means) / MICRO)


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
