# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(pp_size=2) cannot train a Mistral with
# gradient checkpointing as transformers enables it by default: the first forward fails with "ValueError: Unexpected
# keyword arguments: attention_mask,position_ids,past_key_value,output_attentions,use_cache,cache_position,
# position_embeddings" (torch/utils/checkpoint.py). Colossal-AI's pipeline forward of the Mistral
# (MistralForwards.mistral_model_forward, shardformer/modeling/mistral.py:137-147) passes the decoder layer's inputs
# to `self._gradient_checkpointing_func` as keyword arguments; `gradient_checkpointing_enable()` makes that function
# torch.utils.checkpoint with use_reentrant=True (transformers' default), and the re-entrant checkpoint takes
# positional arguments only. The Llama's, Qwen2's and Mixtral's copies of the same forward (modeling/llama.py:200,
# qwen2.py:215, mixtral.py:844), and transformers' own Mistral, pass them positionally; so does the Mistral's with
# use_reentrant=False.
# Fix (`--fixed`, shardfuzz's known fix colossalai-mistral-pipeline-checkpoint-kwargs): pass them positionally, in the
# decoder layer's order; the step then runs and its loss is one device's.
# Found by shardfuzz (target colossalai-hybrid, a Llama-math case built as a Mistral, `model.hf_model: mistral`, pp 2,
# re-entrant activation checkpointing; campaign 327).
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
# Measured: rank 0 raises the ValueError (rank 1 then sees gloo's "Connection closed by peer"): CRASH. --fixed: the
# last stage's loss 2.7647 against 2.7647 on one device: OK.
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.tensor([[3, 7, 12, 4, 5, 2], [2, 6, 0, 5, 11, 3], [1, 9, 8, 4, 2, 14], [13, 0, 6, 10, 3, 7]])
ORDER = ("attention_mask", "position_ids", "past_key_value", "output_attentions", "use_cache", "cache_position",
         "position_embeddings")


def fix():
    """MistralForwards.mistral_model_forward with its checkpointed layer inputs passed positionally."""
    from colossalai.shardformer.modeling.mistral import MistralForwards

    original = MistralForwards.mistral_model_forward

    def mistral_model_forward(self, *args, **kwargs):
        checkpoint = getattr(self, "_gradient_checkpointing_func", None)
        if checkpoint is None:
            return original(self, *args, **kwargs)

        def positional(layer, hidden_states, **named):
            return checkpoint(layer, hidden_states, *(named.pop(k) for k in ORDER), **named)

        self._gradient_checkpointing_func = positional
        try:
            return original(self, *args, **kwargs)
        finally:
            self._gradient_checkpointing_func = checkpoint

    MistralForwards.mistral_model_forward = staticmethod(mistral_model_forward)


def model():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=4, sliding_window=None,
                           attention_dropout=0.0, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                           _attn_implementation="eager")
    return MistralForCausalLM(config)


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29577", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
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

    expected = model()(input_ids=IDS, labels=IDS).loss
    plugin = HybridParallelPlugin(tp_size=1, pp_size=2, num_microbatches=2, precision="fp32",
                                  enable_metadata_cache=False)
    booster = Booster(plugin=plugin)
    net = model()
    net.gradient_checkpointing_enable()  # transformers' default: use_reentrant=True
    net.train()
    boosted, optimizer, *_ = booster.boost(net, torch.optim.SGD(net.parameters(), lr=0.1))
    batch = iter([{"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": IDS}])
    try:
        out = booster.execute_pipeline(batch, boosted, lambda outputs, inputs: outputs.loss, optimizer, return_loss=True)
    except Exception as e:
        print(f"rank {rank}: {type(e).__name__}: {e} -> CRASH", flush=True)
        os._exit(1)  # (the peer waits in a pipeline send)
    if plugin.stage_manager.is_last_stage(ignore_chunk=True):
        loss = float(out["loss"])
        verdict = "OK" if abs(loss - float(expected)) < 1e-5 * abs(float(expected)) else "MISMATCH"
        print(f"rank {rank}: loss {loss:.4f}, one device {float(expected):.4f} -> {verdict}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
