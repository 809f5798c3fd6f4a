# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): a model with tied embeddings saved by HybridParallelPlugin's
# sharded checkpoint from one pipeline stage and loaded into two loses its LM head, in silence. The one-stage
# checkpoint holds the tied weight once, as `model.embed_tokens.weight` (no `lm_head.weight` key). Under pp 2 the
# embedding is on the first stage and the LM head on the last, where `lm_head.weight` is a parameter of its own;
# HybridParallelCheckpointIO.load_sharded_model looks each held parameter up by name and, with `strict = False`
# hard-coded (checkpoint_io/hybrid_parallel_checkpoint_io.py:395), skips a name the checkpoint lacks without a word:
# the last stage keeps the fresh model's LM head, the two stages' copies of the tied weight differ from then on, and
# training resumes with a wrong model (a gathered checkpoint, or an untied model, resumes correctly).
# Found by shardfuzz (target colossalai-hybrid, campaign 329: a tied Qwen2 resumed from tp 2 into pp 2; narrowed to any
# tied Llama run on one stage, tp 2 or dp 2, resumed from a sharded checkpoint into pp 2: loss after the resume 1,028x
# the f32 noise). The optimizer's state is keyed by the tied parameter's id and loads.
# Fix (`--fixed`, shardfuzz's known fix colossalai-tied-head-sharded-load): where the checkpoint lacks the head's key
# and the model ties it, load the input embedding's tensor into the head through the head module's own loading.
# Run: timeout 150 python this.py [--fixed]  (2 CPU ranks, gloo; shardfuzz's worker is imported from this checkout
# for the fix and for the known fix of the unrelated save crash of a padded embedding,
# colossalai-padded-detached-param-save, which a tied model meets first).
# Measured: rank 0's embedding is the saved one; rank 1's LM head is off by 1 everywhere (the fresh model's):
# MISMATCH. --fixed: both are the saved weight: OK.
import datetime
import glob
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=12, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                                        pad_token_id=None, bos_token_id=None, eos_token_id=None,
                                        _attn_implementation="eager"))


def run(rank, directory, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29583", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    dist.Backend.HCCL = getattr(dist.Backend, "HCCL", "hccl")  # p2p.py reads it; absent from CPU builds
    sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))
    from shardfuzz_worker import known_fixes

    known_fixes._colossalai_padded_detached_param_save()
    if fixed:
        known_fixes._colossalai_tied_head_sharded_load()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    net = model()
    with torch.no_grad():
        net.model.embed_tokens.weight.add_(1.0)  # a trained weight, not the fresh model's
    saved = net.model.embed_tokens.weight.detach().clone()
    one = Booster(plugin=HybridParallelPlugin(tp_size=1, pp_size=1, precision="fp32"))
    boosted, *_ = one.boost(net, torch.optim.SGD(net.parameters(), lr=0.1))
    one.save_model(boosted, directory, shard=True)
    dist.barrier()
    if rank == 0:
        keys = json.load(open(glob.glob(os.path.join(directory, "*.index.json"))[0]))["weight_map"]
        print(f"checkpoint: model.embed_tokens.weight {'model.embed_tokens.weight' in keys}, lm_head.weight "
              f"{'lm_head.weight' in keys}", flush=True)
    two = Booster(plugin=HybridParallelPlugin(tp_size=1, pp_size=2, num_microbatches=2, precision="fp32"))
    fresh = model()
    resumed, *_ = two.boost(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1))
    two.load_model(resumed, directory)
    inner = resumed.unwrap()
    held = inner.model.embed_tokens.weight if rank == 0 else inner.lm_head.weight
    name = "model.embed_tokens.weight" if rank == 0 else "lm_head.weight"
    error = (held.detach()[: saved.shape[0]] - saved).abs().max().item()
    print(f"rank {rank}: {name} against the saved weight: max difference {error:.3g} -> "
          f"{'OK' if error == 0 else 'MISMATCH'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(tempfile.mkdtemp(), "--fixed" in sys.argv), nprocs=2)
