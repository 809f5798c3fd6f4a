# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(tp_size=2, parallel_output=False)
# on GPT-2 returns each tensor-parallel rank's vocabulary shard as the logits, and the model's own loss crashes.
# GPT2LMHeadModelPolicy builds the LM head as VocabParallelLMHead1D with "gather_output": False whatever
# parallel_output says (policies/gpt2.py:396), and replaces the forward with the vocabulary-parallel loss only
# `if self.shard_config.parallel_output` (:414); with parallel_output=False transformers' own forward runs on
# the sharded logits. The Llama policy passes "gather_output": not parallel_output (policies/llama.py:407).
# parallel_output=False is documented as "keep the output parallel: False", i.e. gathered logits.
# Found by reading GPT2LMHeadModelPolicy while planning GPT-2 for shardfuzz's colossalai-hybrid target, then
# shown by this script (not by a campaign).
# Run: timeout 120 python this.py  (2 CPU ranks, gloo). Measured: with vocab 128 each rank's logits have 64
# columns (rank 1's differ from the model's by 0.25) and the loss raises "Expected input batch_size (6) to
# match target batch_size (12)"; with vocab 50 (padded to 64) rank 0 shows 50 columns and rank 1 none.
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB = int(sys.argv[1]) if len(sys.argv) > 1 else 128
IDS = torch.tensor([[3, 40, 1, 4, 49, 2], [2, 9, 35, 8, 6, 11]])


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=8, n_embd=8, n_layer=1, n_head=2, n_inner=16, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    return GPT2LMHeadModel(config)


def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29569", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    reference = model()
    expected = reference(input_ids=IDS, labels=IDS)
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", parallel_output=False)
    boosted, *_ = Booster(plugin=plugin).boost(model(), torch.optim.SGD(reference.parameters(), lr=0.1))
    logits = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS)).logits
    ok = logits.shape == expected.logits.shape and torch.allclose(logits, expected.logits, atol=1e-5)
    print(f"rank {rank}: logits {tuple(logits.shape)}, one device {tuple(expected.logits.shape)} -> {'OK' if ok else 'MISMATCH'}")
    try:
        loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS).loss
        print(f"rank {rank}: loss {float(loss):.6f}, one device {float(expected.loss):.6f}")
    except Exception as e:  # the crash
        print(f"rank {rank}: loss raised {type(e).__name__}: {e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
