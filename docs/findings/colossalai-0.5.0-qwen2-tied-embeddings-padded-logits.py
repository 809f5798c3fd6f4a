"""Colossal-AI 0.5.0: a Qwen2 with tied embeddings returns logits over the padded vocabulary.

With tied word embeddings Qwen2Policy (shardformer/policies/qwen2.py:72-76, 251-267) makes the embedding a
PaddingEmbedding (a VocabParallelEmbedding1D under tensor parallelism), padding the vocabulary to a multiple of
`make_vocab_size_divisible_by` (64 by default), but Qwen2ForCausalLMPolicy (:421-450) leaves the LM head that shares
the padded weight a plain Linear (a Linear1D_Col under tp): the logits carry every padding class, each a logit of 0
that the softmax counts. The loss and every gradient are wrong, transformers' own loss fails on the shape, and under a
pipeline (`--pp`: pp 2, 1F1B, 2 micro-batches) the tied weights' all-reduce pairs the first stage's padded embedding
with the last stage's unpadded head: gloo aborts. LlamaForCausalLMPolicy makes the head a PaddingLMHead (a
VocabParallelLMHead1D under tp), whose forward cuts the padding off; Mixtral's policy had the same flaw.
Found by shardfuzz's colossalai-hybrid target (Qwen2, tied embeddings: the loss 1.1 % off with dp 2; pp 2 killed).

    timeout 300 python colossalai-0.5.0-qwen2-tied-embeddings-padded-logits.py [--fixed] [--pp]

2 CPU ranks (gloo), a 2-layer Qwen2 (vocabulary 16, tied), HybridParallelPlugin (dp 2, tp 1, pp 1, ZeRO 0, fp32), the
same batch on both ranks, against the same model on one device. Measured (colossalai 0.5.0, torch 2.5.1, transformers
4.51.3): logits (2, 6, 64) against (2, 6, 16); the loss on them 4.175553 against 2.804213 (relative error 4.890e-01:
the logits are all near 0 here, so 48 padding classes weigh much); the embedding gradient off by 1.013e-01 (|one
device| max 4.422e-01); the model's own loss raises ValueError "Expected input batch_size (48) to match target
batch_size (12)": MISMATCH. `--pp`: gloo "op.preamble.length <= op.nbytes. 512 vs 128" (64 x 8 elements against
16 x 8), "process 1 terminated with signal SIGABRT": CRASH. `--fixed` (known fix colossalai-qwen2-tied-padded-logits:
the head a PaddingLMHead, VocabParallelLMHead1D under tp): logits (2, 6, 16), loss 2.804213, same gradient: OK; with
`--pp` the pipeline's loss 2.804213: OK.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

IDS = torch.tensor([[3, 7, 1, 4, 9, 2], [2, 9, 5, 8, 6, 11]])


def fix():
    """With tied embeddings the LM head a PaddingLMHead (VocabParallelLMHead1D under tp), as Llama's policy makes it."""
    from colossalai.shardformer.layer import Linear1D_Col, PaddingLMHead, VocabParallelLMHead1D
    from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, SubModuleReplacementDescription
    # (The policy's own key: the class's name, its import of transformers' Qwen2 classes fails on 4.51.)
    from colossalai.shardformer.policies.qwen2 import Qwen2ForCausalLM, Qwen2ForCausalLMPolicy

    original = Qwen2ForCausalLMPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        zbv = self.pipeline_stage_manager is not None and self.pipeline_stage_manager.use_zbv
        divisor = self.shard_config.make_vocab_size_divisible_by
        if self.tie_weight and self.shard_config.enable_tensor_parallelism:
            for d in policy[Qwen2ForCausalLM].sub_module_replacement:
                if d.suffix == "lm_head" and d.target_module is Linear1D_Col:
                    d.target_module = VocabParallelLMHead1D
                    d.kwargs = {**d.kwargs, "make_vocab_size_divisible_by": divisor,
                                "gather_output": not self.shard_config.parallel_output}
        elif self.tie_weight and not zbv:
            head = SubModuleReplacementDescription(suffix="lm_head", target_module=PaddingLMHead, kwargs={
                "make_vocab_size_divisible_by": divisor})
            policy.setdefault(Qwen2ForCausalLM, ModulePolicyDescription(sub_module_replacement=[]))
            policy[Qwen2ForCausalLM].sub_module_replacement = [*(policy[Qwen2ForCausalLM].sub_module_replacement
                                                                 or []), head]
        return policy

    Qwen2ForCausalLMPolicy.module_policy = module_policy


def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                        sliding_window=None, _attn_implementation="eager"))


def loss_on(logits):  # the user's criterion: next-token cross-entropy on the logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), IDS[:, 1:].flatten())


def run(rank, fixed, pp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29572", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
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

    # One device: the same model and batch, the cross-entropy on its logits and the embedding's gradient.
    reference = model()
    want_logits = reference(input_ids=IDS).logits
    (expected := loss_on(want_logits)).backward()
    want = reference.model.embed_tokens.weight.grad
    plugin = HybridParallelPlugin(tp_size=1, pp_size=2 if pp else 1, zero_stage=0, precision="fp32",
                                  num_microbatches=2 if pp else None, enable_metadata_cache=False)
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model(), torch.optim.SGD(reference.parameters(), lr=0.1))
    if pp:  # the model's own loss (dist_cross_entropy on the last stage), 1F1B over 2 micro-batches
        batch = iter([dict(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS)])
        out = booster.execute_pipeline(batch, boosted, lambda outputs, inputs: outputs.loss, optimizer)
        if rank == 1:  # the last stage
            print(f"rank 1: pipeline loss {float(out['loss']):.6f}, one device {float(expected):.6f}\n"
                  f"{'OK' if torch.allclose(out['loss'], expected, rtol=1e-5) else 'MISMATCH'}", flush=True)
        dist.destroy_process_group()
        return
    logits = boosted(input_ids=IDS).logits
    loss = loss_on(logits)
    booster.backward(loss, optimizer)  # the plugin averages the data-parallel ranks' gradients
    got = boosted.unwrap().model.embed_tokens.weight.grad[:16]
    error = abs(float(loss) - float(expected)) / float(expected)
    same = logits.shape[-1] == 16 and error < 1e-5 and torch.allclose(got, want, rtol=1e-4, atol=1e-6)
    try:
        own = f"{float(boosted(input_ids=IDS, labels=IDS).loss):.6f}"
    except Exception as e:
        own = f"raised {type(e).__name__}: {e}"
    if rank == 0:
        print(f"logits {tuple(logits.shape)} (one device {tuple(want_logits.shape)}); cross-entropy"
              f" on them {float(loss):.6f}, one device {float(expected):.6f} (relative error {error:.3e}); embedding"
              f" grad max |difference| {float((got - want).abs().max()):.3e} (|one device| max"
              f" {float(want.abs().max()):.3e}); the model's own loss {own}")
        print("OK" if same else "MISMATCH", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        mp.spawn(run, args=("--fixed" in sys.argv, "--pp" in sys.argv), nprocs=2)
    except mp.ProcessExitedException as e:  # gloo aborts a rank on the tied weights' all-reduce
        print(f"{e}\nCRASH")
        sys.exit(1)
