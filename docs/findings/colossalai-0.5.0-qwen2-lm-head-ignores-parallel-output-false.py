# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(tp_size=2, parallel_output=False)
# on Qwen2 returns each tensor-parallel rank's vocabulary shard as the logits, and the model's own loss is a plain
# cross-entropy over that shard. Qwen2ForCausalLMPolicy makes the LM head a Linear1D_Col without "gather_output"
# (policies/qwen2.py:421-433, so gather_output=False) whatever parallel_output says, and installs the forward with
# dist_cross_entropy (:432), which, told parallel_output=False, takes the logits as whole (layer/loss.py:220) and
# runs torch's cross-entropy on the 8 columns of a 16-token vocabulary: a label >= 8 raises "Target 12 is out of
# bounds", and with labels < 8 the loss is silently wrong (each rank scores the labels against its own shard's
# classes, with a softmax over 8 of the 16). The Llama policy passes "gather_output": not parallel_output
# (policies/llama.py:407); GPT-2's policy had the same flaw (colossalai-0.5.0-gpt2-lm-head-ignores-parallel-...).
# Fix (`--fixed`, shardfuzz's known fix colossalai-qwen2-lm-head-gather): the LM head's gather_output = not
# parallel_output.
# Found by shardfuzz (target colossalai-hybrid, Qwen2 with tp 2 and parallel_output=False).
# Run: timeout 120 python this.py [--fixed] [--crash]  (2 CPU ranks, gloo; --crash uses labels up to 15).
# Measured: rank r's logits (2, 6, 8) are one device's columns 8r..8r+7 of (2, 6, 16); the loss 2.102687 on rank 0
# and 2.085720 on rank 1 against 2.797831 on one device (relative error 0.25): MISMATCH. With --crash both ranks
# raise IndexError "Target 12 is out of bounds." (CRASH). --fixed: logits (2, 6, 16) equal to one device's and
# the loss 2.797831 on both ranks: OK (with --crash too).
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Token ids (and labels) below 8 = 16 / tp: the shard's cross-entropy runs, silently wrong; --crash adds larger ones.
IDS = torch.tensor([[3, 7, 1, 4, 5, 2], [2, 6, 0, 5, 1, 3]])
if "--crash" in sys.argv:
    IDS = torch.tensor([[3, 7, 12, 4, 15, 2], [2, 9, 0, 5, 1, 11]])


def fix():
    """The LM head gathers its output unless parallel_output, as LlamaForCausalLMPolicy has it."""
    from colossalai.shardformer.layer import Linear1D_Col
    # (The policy's own key: the class's name, its import of transformers' Qwen2 classes fails on 4.51.)
    from colossalai.shardformer.policies.qwen2 import Qwen2ForCausalLM, Qwen2ForCausalLMPolicy

    original = Qwen2ForCausalLMPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        description = policy.get(Qwen2ForCausalLM)
        for d in (description.sub_module_replacement or []) if description else []:
            if d.suffix == "lm_head" and d.target_module is Linear1D_Col:
                d.kwargs = {**(d.kwargs or {}), "gather_output": not self.shard_config.parallel_output}
        return policy

    Qwen2ForCausalLMPolicy.module_policy = module_policy


def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         sliding_window=None, _attn_implementation="eager")
    return Qwen2ForCausalLM(config)


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    # One device: the same model and batch, transformers' own loss with the same labels.
    reference = model()
    expected = reference(input_ids=IDS, labels=IDS)
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", parallel_output=False)
    boosted, *_ = Booster(plugin=plugin).boost(model(), torch.optim.SGD(reference.parameters(), lr=0.1))
    mask = torch.ones_like(IDS)
    logits = boosted(input_ids=IDS, attention_mask=mask).logits
    same = logits.shape == expected.logits.shape and torch.allclose(logits, expected.logits, atol=1e-5)
    width = logits.shape[-1]
    shard = expected.logits[..., rank * width:(rank + 1) * width]
    what = "equal" if same else f"one device's columns {rank * width}-{(rank + 1) * width - 1}" if (
        shard.shape == logits.shape and torch.allclose(logits, shard, atol=1e-5)) else "differ"
    print(f"rank {rank}: logits {tuple(logits.shape)}, one device {tuple(expected.logits.shape)} ({what})", flush=True)
    try:
        loss = boosted(input_ids=IDS, attention_mask=mask, labels=IDS).loss
        error = abs(float(loss) - float(expected.loss)) / abs(float(expected.loss))
        same = same and error < 1e-5
        print(f"rank {rank}: loss {float(loss):.6f}, one device {float(expected.loss):.6f} (relative error"
              f" {error:.3e}) -> {'OK' if same else 'MISMATCH'}", flush=True)
    except Exception as e:  # the crash (labels past the shard)
        print(f"rank {rank}: loss raised {type(e).__name__}: {e} -> CRASH", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
