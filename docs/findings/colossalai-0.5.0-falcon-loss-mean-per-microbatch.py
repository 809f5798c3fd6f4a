#!/usr/bin/env python3
"""Colossal-AI 0.5.0: shardformer's Falcon pipeline forward makes the causal-LM loss a mean of per-micro-batch means,
and NaN where a micro-batch's labels are all ignored.

Under pipeline parallelism FalconPolicy replaces FalconForCausalLM's forward (shardformer/policies/falcon.py:341-346)
with `FalconPipelineForwards.falcon_for_causal_lm_forward` (shardformer/modeling/falcon.py:352-), whose last stage
computes the loss itself (falcon.py:410-434): a plain `CrossEntropyLoss()`, or under tensor parallelism with
parallel_output `cross_entropy_1d` in its default mode "mean" -- each the mean over the micro-batch's own labels that
are not -100. Without a pipeline the tensor-parallel forward (`get_lm_forward_with_dist_cross_entropy`, :742-) does the
same per data-parallel rank. The schedule then averages the micro-batches' losses (pipeline/schedule/one_f_one_b.py
divides each by num_microbatches) and the plugin the data-parallel ranks'. With ignored labels (padding, masked
prompts) the micro-batches hold different counts, so the loss and every gradient are a mean of means: they change with
the micro-batching, and differ from the same model and batch on one device (transformers' loss: the whole batch's
summed token loss over the whole batch's count). A micro-batch whose labels are all -100 gives 0/0: the step's loss
and every gradient are NaN. The class of colossalai-0.5.0-dist-cross-entropy-mean-per-microbatch.py (Llama, through
dist_cross_entropy) and colossalai-0.5.0-mixtral-pipeline-loss-mean-per-microbatch.py (Mixtral's forward), at a third
place: Falcon's forwards call neither.

Found by shardfuzz's colossalai-hybrid target (a case built as a Falcon, `model.hf_model: falcon`, pp 2, 2
micro-batches, a quarter of the labels padding: `loss/step0` 47,721x its noise). Here: a 2-layer Falcon (hidden 8, 2
heads, rotary, untied), HybridParallelPlugin(tp 1, pp 2 1F1B, 2 micro-batches, ZeRO 0, fp32), the model's own loss (labels with
padding -100), against the same model on one device (`model(input_ids, labels=labels).loss` over the whole batch):
first a batch whose micro-batches hold 7 and 3 counted labels (execute_pipeline's loss, and the update of one SGD step,
lr 1), then one whose second micro-batch's labels are all -100 (the loss). Run:

    python -m torch.distributed.run --nproc_per_node 2 colossalai-0.5.0-falcon-loss-mean-per-microbatch.py [--fixed]

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai). On the CPU it installs
the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found beside this file in the shardfuzz checkout;
none changes what Colossal-AI computes). Prints the losses, each stage's update against the reference's, and MISMATCH
(exit status 1):

    Falcon, pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32, padded labels:
      micro-batches counting 7 and 3 labels: pipeline loss 2.786619, one device 2.779809
      a micro-batch counting none: pipeline loss nan, one device 2.769596
      stage 0: its parameters' SGD update off the one-device one by 4.246e-01 (relative)
      stage 1: its parameters' SGD update off the one-device one by 4.286e-01 (relative)
    MISMATCH

With `--fixed` (shardfuzz's known fix colossalai-falcon-loss-batch-mean; here the last stage's loss: the micro-batch's
summed token loss over the whole batch's count, times the micro-batch count the schedule divides by; so the schedule's
average is the whole batch's mean, and a micro-batch with nothing counted adds zero) every loss and update matches: OK
(exit status 0):

    Falcon, pp 2 (1F1B, 2 micro-batches), ZeRO 0, fp32, padded labels:
      micro-batches counting 7 and 3 labels: pipeline loss 2.779810, one device 2.779809
      a micro-batch counting none: pipeline loss 2.769596, one device 2.769596
      stage 0: its parameters' SGD update off the one-device one by 6.125e-08 (relative)
      stage 1: its parameters' SGD update off the one-device one by 6.185e-08 (relative)
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
    from colossalai.shardformer.modeling import falcon

    class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
        def __init__(self):
            super().__init__(reduction="sum")

        def forward(self, logits, labels):
            return super().forward(logits, labels) * (MICRO / BATCH_COUNT["count"])  # (0 where nothing counted)

    falcon.CrossEntropyLoss = CrossEntropyLoss


def falcon():
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_kv_heads=2,
                          ffn_hidden_size=12, alibi=False, new_decoder_architecture=False, multi_query=False,
                          parallel_attn=False, bias=True, hidden_dropout=0.0, attention_dropout=0.0,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                          _attn_implementation="eager")
    torch.manual_seed(0)
    return FalconForCausalLM(config).float()


def pipeline_loss(booster, boosted, opt, labels):
    """execute_pipeline's loss on the batch (IDS, labels): on the last stage, else None."""
    BATCH_COUNT["count"] = int((labels[:, 1:] != IGNORE).sum())
    batch = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": labels}
    out = booster.execute_pipeline(iter([batch]), boosted, lambda outputs, _: outputs.loss, opt, return_loss=True)
    return None if out["loss"] is None else float(out["loss"])


def compare(rank, initial, trained, reference, losses):
    """Prints the comparison (rank 0); returns whether anything differs."""
    want = dict(reference.named_parameters())
    # (the last stage's LM head is padded to a multiple of 64 rows: its first rows are the vocabulary's)
    got_update = torch.cat([(p.detach()[:initial[n].shape[0]] - initial[n]).flatten() for n, p in trained])
    want_update = torch.cat([(want[n].detach() - initial[n]).flatten() for n, _ in trained])
    error = float((got_update - want_update).norm() / want_update.norm())
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (rank, error, losses))
    wrong = any(e > RTOL for _, e, _ in rows)
    for _, _, stage_losses in rows:
        for what, got, expected in stage_losses or []:
            wrong |= not abs(got - expected) <= RTOL * abs(expected)  # (NaN: wrong)
    if rank == 0:
        print(f"Falcon, pp 2 (1F1B, {MICRO} micro-batches), ZeRO 0, fp32, padded labels:")
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
    from colossalai.booster.plugin import HybridParallelPlugin

    rank = dist.get_rank()
    reference = falcon()
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    plugin = HybridParallelPlugin(tp_size=1, pp_size=2, zero_stage=0, precision="fp32", num_microbatches=MICRO,
                                  pp_style="1f1b", max_norm=0.0, enable_metadata_cache=False, overlap_p2p=False)
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
