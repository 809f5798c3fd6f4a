#!/usr/bin/env python3
"""Colossal-AI 0.5.0: shardformer's Mixtral pipeline forward makes the causal-LM loss a mean of per-micro-batch means,
and NaN where a micro-batch's labels are all ignored.

Under pipeline parallelism MixtralForCausalLMPolicy replaces MixtralForCausalLM's forward
(shardformer/policies/mixtral.py:413-419) with `MixtralPipelineForwards.mixtral_for_causal_lm_forward`
(shardformer/modeling/mixtral.py:443-), whose last stage
computes the loss with a plain `CrossEntropyLoss()` (mixtral.py:529-541): the mean over the micro-batch's own labels
that are not -100. The schedule then averages the micro-batches' losses (pipeline/schedule/one_f_one_b.py:272 divides
each by num_microbatches; interleaved_pp.py:318 likewise). With ignored labels (padding, masked prompts) the
micro-batches hold different counts, so the loss and every gradient are a mean of means: they change with the
micro-batching, and differ from the same model and batch on one device (transformers' loss: the whole batch's summed
token loss over the whole batch's count). A micro-batch whose labels are all -100 gives 0/0: the step's loss and every
gradient are NaN. The class of docs/findings/colossalai-0.5.0-dist-cross-entropy-mean-per-microbatch.py (Llama's
forward, through dist_cross_entropy), at a different place: Mixtral's forward does not call dist_cross_entropy.

Found by shardfuzz's colossalai-moe target (campaign 317: a NaN loss on a 2-stage interleaved pipeline with padded
labels). Here: a 2-layer Mixtral (hidden 8, 4 experts, top-2, no auxiliary loss), MoeHybridParallelPlugin(tp 1, pp 2
1F1B, 2 micro-batches, ep 1, ZeRO 0, fp32), the model's own loss (labels with padding -100), against the same model on
one device (`model(input_ids, labels=labels).loss` over the whole batch): first a batch whose micro-batches hold 7 and 3
counted labels (execute_pipeline's loss, and the update of one SGD step, lr 1), then one whose second micro-batch's
labels are all -100 (the loss). Run:

    python -m torch.distributed.run --nproc_per_node 2 colossalai-0.5.0-mixtral-pipeline-loss-mean-per-microbatch.py [--fixed]

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai). On the CPU it installs
the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found beside this file in the shardfuzz checkout;
none changes what Colossal-AI computes). Prints the losses, each stage's update against the reference's, and MISMATCH
(exit status 1):

    Mixtral, pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32, padded labels:
      micro-batches counting 7 and 3 labels: pipeline loss 2.758624, one device 2.754156
      a micro-batch counting none: pipeline loss nan, one device 2.747453
      stage 0: its parameters' SGD update off the one-device one by 4.053e-01 (relative)
      stage 1: its parameters' SGD update off the one-device one by 4.071e-01 (relative)
    MISMATCH

With `--fixed` (the last stage's loss: the micro-batch's summed token loss over the whole batch's count, times the
micro-batch count the schedule divides by; so the schedule's average is the whole batch's mean, and a micro-batch
with nothing counted adds zero) every loss and update matches: OK (exit status 0):

    Mixtral, pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32, padded labels:
      micro-batches counting 7 and 3 labels: pipeline loss 2.754156, one device 2.754156
      a micro-batch counting none: pipeline loss 2.747453, one device 2.747453
      stage 0: its parameters' SGD update off the one-device one by 1.272e-08 (relative)
      stage 1: its parameters' SGD update off the one-device one by 5.415e-08 (relative)
    OK
"""
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))

IGNORE = -100
MICRO = 2
RTOL = 1e-5
IDS = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(1))


def padded(counts):
    """Labels = IDS with each row's tail -100, so that row r counts counts[r] shifted labels (of 5)."""
    labels = IDS.clone()
    for row, count in enumerate(counts):
        labels[row, 1 + count:] = IGNORE
    return labels


UNEVEN = padded([5, 2, 3, 0])  # micro-batch 0 (rows 0-1) counts 7 labels, micro-batch 1 (rows 2-3) 3
EMPTY = padded([5, 2, 0, 0])  # micro-batch 1 counts none
BATCH_COUNT = {}  # the whole batch's count of the labels the loss counts, for --fixed (set per batch)


def fix():
    """The last stage's loss: summed over the micro-batch, over the whole batch's count, times MICRO."""
    from colossalai.shardformer.modeling import mixtral

    class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
        def __init__(self):
            super().__init__(reduction="sum")

        def forward(self, logits, labels):
            return super().forward(logits, labels) * (MICRO / BATCH_COUNT["count"])  # (0 where nothing counted)

    mixtral.CrossEntropyLoss = CrossEntropyLoss


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           output_router_logits=False, router_aux_loss_coef=0.0, tie_word_embeddings=False,
                           _attn_implementation="eager")
    torch.manual_seed(0)
    return MixtralForCausalLM(config).float()


def pipeline_loss(booster, boosted, opt, labels):
    """execute_pipeline's loss on the batch (IDS, labels): on the last stage, else None."""
    BATCH_COUNT["count"] = int((labels[:, 1:] != IGNORE).sum())
    batch = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": labels}
    out = booster.execute_pipeline(iter([batch]), boosted, lambda outputs, _: outputs.loss, opt, return_loss=True)
    return None if out["loss"] is None else float(out["loss"])


def compare(rank, initial, trained, reference, losses):
    """Prints the comparison (rank 0); returns whether anything differs."""
    want = dict(reference.named_parameters())
    got_update = torch.cat([(p.detach() - initial[n]).flatten() for n, p in trained])
    want_update = torch.cat([(want[n].detach() - initial[n]).flatten() for n, _ in trained])
    error = float((got_update - want_update).norm() / want_update.norm())
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (rank, error, losses))
    wrong = any(e > RTOL for _, e, _ in rows)
    for _, _, stage_losses in rows:
        for what, got, expected in stage_losses or []:
            wrong |= not abs(got - expected) <= RTOL * abs(expected)  # (NaN: wrong)
    if rank == 0:
        print(f"Mixtral, pp 2 (1F1B, {MICRO} micro-batches), ZeRO 0, fp32, padded labels:")
        for _, _, stage_losses in rows:
            for what, got, expected in stage_losses or []:
                print(f"  {what}: pipeline loss {got:.6f}, one device {expected:.6f}")
        for stage, e, _ in rows:
            print(f"  stage {stage}: its parameters' SGD update off the one-device one by {e:.3e} (relative)")
        print("MISMATCH" if wrong else "OK")
    return wrong


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    if "--fixed" in sys.argv:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin

    rank = dist.get_rank()
    reference = mixtral()
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=2, ep_size=1, zero_stage=0, precision="fp32",
                                     num_microbatches=MICRO, pp_style="1f1b", max_norm=0.0,
                                     enable_metadata_cache=False, overlap_p2p=False)
    booster = Booster(plugin=plugin)
    model = copy.deepcopy(reference)
    boosted, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=1.0))

    # A micro-batch with no counted label: the loss only (no step).
    empty = pipeline_loss(booster, boosted, opt, EMPTY)
    opt.zero_grad()
    with torch.no_grad():
        empty_expected = float(reference(input_ids=IDS, labels=EMPTY).loss)
    # Micro-batches counting 7 and 3 labels: the loss and one SGD step.
    uneven = pipeline_loss(booster, boosted, opt, UNEVEN)
    opt.step()
    reference_loss = reference(input_ids=IDS, labels=UNEVEN).loss
    reference_loss.backward()
    torch.optim.SGD(reference.parameters(), lr=1.0).step()

    losses = None if uneven is None else [("micro-batches counting 7 and 3 labels", uneven, float(reference_loss)),
                                          ("a micro-batch counting none", empty, empty_expected)]
    wrong = compare(rank, initial, list(boosted.unwrap().named_parameters()), reference, losses)
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
