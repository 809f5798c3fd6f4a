# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(tp_size=2) with its default
# parallel_output=True crashes a Falcon's loss when one tensor-parallel rank's vocabulary shard is all padding.
# VocabParallelLMHead1D pads the vocabulary to a multiple of make_vocab_size_divisible_by (64) x tp and returns each
# rank's valid columns only, so with a vocabulary of 16 under tp=2 rank 1's logits have width 0. Falcon's causal-LM
# forwards compute the loss themselves (not through dist_cross_entropy, whose form of this is the Llama script
# colossalai-0.5.0-empty-vocab-shard-loss-crash.py) and flatten the shifted logits first,
# `shift_logits.view(-1, new_vocab_size)` (shardformer/modeling/falcon.py:792 without a pipeline, :421 on the last
# pipeline stage): "cannot reshape tensor of 0 elements into shape [-1, 0]" on that rank.
# Fix (`--fixed`, shardfuzz's known fix colossalai-falcon-empty-vocab-shard): such a rank's logits take one column of
# -inf (no target falls in its range; exp(-inf) adds nothing to the softmax's sum; its gradient is 0); the loss then
# matches one device.
# Found by shardfuzz (target colossalai-hybrid, a case built as a Falcon, `model.hf_model: falcon`, tp 2, vocabulary
# sharded in the loss).
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
# Measured (2026-12-08): rank 1 raises the RuntimeError, rank 0 then loses its peer in the loss's all-reduce: CRASH.
# --fixed: both ranks' loss 2.756543 against 2.756543 on one device: OK.
import datetime
import inspect
import os
import sys
import textwrap

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.tensor([[3, 7, 1, 4, 9, 2], [2, 9, 5, 8, 6, 11]])


def a_column_where_none(logits):
    if logits.size(-1) > 0:
        return logits
    return torch.cat([logits, torch.full((*logits.shape[:-1], 1), float("-inf"), dtype=logits.dtype)], -1)


def fix():
    """The tensor-parallel forward's flattening, given a column where the rank has none."""
    from colossalai.shardformer.modeling import falcon
    from colossalai.shardformer.policies import falcon as policy

    source = textwrap.dedent(inspect.getsource(falcon.get_lm_forward_with_dist_cross_entropy))
    old = "new_vocab_size = shift_logits.shape[-1]"
    assert source.count(old) == 1
    source = source.replace(old, "shift_logits = a_column_where_none(shift_logits); " + old)
    namespace = {}
    exec(compile(source, inspect.getsourcefile(falcon), "exec"), {**falcon.__dict__, "a_column_where_none": a_column_where_none},
         namespace)
    policy.get_lm_forward_with_dist_cross_entropy = namespace["get_lm_forward_with_dist_cross_entropy"]


def model():
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    config = FalconConfig(vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_kv_heads=2,
                          ffn_hidden_size=12, alibi=False, new_decoder_architecture=False, multi_query=False,
                          parallel_attn=False, bias=True, hidden_dropout=0.0, attention_dropout=0.0,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                          _attn_implementation="eager")
    return FalconForCausalLM(config)


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29581", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    expected = model()(input_ids=IDS, labels=IDS).loss  # one device, plain transformers
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32")  # parallel_output=True, the default
    booster = Booster(plugin=plugin)
    sharded = model()
    boosted, optimizer, *_ = booster.boost(sharded, torch.optim.SGD(sharded.parameters(), lr=0.1))
    try:
        loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS).loss
        ok = torch.allclose(loss, expected, rtol=1e-5, atol=1e-6)
        print(f"rank {rank}: loss {loss.item():.6f}, one device {expected.item():.6f}: {'OK' if ok else 'MISMATCH'}",
              flush=True)
    except Exception as e:  # the crash (the other rank then times out waiting for it)
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:160]} -> CRASH", flush=True)
    os._exit(0)  # (a rank left waiting in a collective would hold the process group's shutdown)


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
