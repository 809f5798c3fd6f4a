# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): shardformer computes a Cohere Command model with query/key
# normalisation (CohereConfig(use_qk_norm=True), as Command R+ has) without it, in silence: every plugin layout,
# data parallelism alone included, trains a different model from the one it was given.
# CommandPolicy replaces CohereAttention.forward in every layout (policies/command.py:79-84) with
# get_command_flash_attention_forward (shardformer/modeling/command.py:349-427), a copy of the Llama's that never
# applies `self.q_norm` / `self.k_norm`; transformers' CohereAttention.forward applies them to the projected queries and
# keys before the rotary embedding (modeling_cohere.py:263-265, "main diff from Llama"). The norms' weights stay
# parameters of the model, get no gradient, and are saved unchanged. The pipeline and sequence-parallel paths call the
# same attention forward.
# Fix (`--fixed`; shardfuzz's known fix colossalai-command-qk-norm): apply the norms where transformers does. (Under
# tensor parallelism the norms' weights, one row per head, must also be sharded by head as q_proj and k_proj are,
# which the policy does not do; the known fix does, and under all_to_all indexes the rank's heads' rows. This script
# runs data parallelism only, where the fix is the two lines.)
# The plugin runs with enable_flash_attention=True (without it Command fails at once:
# colossalai-0.5.0-command-without-flash-attention-crash.py); on the CPU ColoAttention then uses Colossal-AI's own SDPA
# kernel (FlashAttentionSdpaCudaExtension, torch's scaled_dot_product_attention, reported unavailable without CUDA).
# Found by reading CommandPolicy while adding Command to shardfuzz's vocabulary; no Colossal-AI issue found.
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
# Measured (2026-12-08): loss 4.858349 on both ranks (the same model's without the norms: the crash script's fixed
# loss) against 4.856778 on one device: MISMATCH. --fixed: 4.856778, OK.
import copy
import datetime
import inspect
import os
import sys
import textwrap

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))


def fix():
    """The query and key norms, between the projections' view into heads and the transpose, as transformers has them."""
    from colossalai.shardformer.modeling import command
    from colossalai.shardformer.policies import command as policy

    source = textwrap.dedent(inspect.getsource(command.get_command_flash_attention_forward))
    old = ("        query_states = query_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)\n"
           "        key_states = key_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)\n")
    new = ("        query_states = query_states.view(bsz, q_len, -1, self.head_dim)\n"
           "        key_states = key_states.view(bsz, q_len, -1, self.head_dim)\n"
           "        if self.use_qk_norm:\n"
           "            query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)\n"
           "        query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)\n")
    assert source.count(old) == 1
    namespace = {}
    exec(compile(source.replace(old, new), inspect.getsourcefile(command), "exec"), command.__dict__, namespace)
    policy.get_command_flash_attention_forward = namespace["get_command_flash_attention_forward"]


def cpu_shims():
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    from colossalai.kernel.kernel_loader import FlashAttentionSdpaCudaExtension

    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    FlashAttentionSdpaCudaExtension.is_available = lambda self: True  # torch's SDPA runs on the CPU


def model():
    from transformers import CohereConfig, CohereForCausalLM

    config = CohereConfig(vocab_size=128, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, use_qk_norm=True, logit_scale=1.0,
                          tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                          attn_implementation="eager")
    torch.manual_seed(0)
    net = CohereForCausalLM(config).float()
    with torch.no_grad():  # (trained norms: a fresh model's are 1, which a layer norm without bias still changes)
        for layer in net.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 2.0)
            layer.self_attn.k_norm.weight.uniform_(0.5, 2.0)
    return net


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29585", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    cpu_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    reference = model()
    expected = reference(input_ids=IDS, labels=IDS).loss  # one device, plain transformers
    plugin = HybridParallelPlugin(tp_size=1, pp_size=1, precision="fp32", enable_flash_attention=True)  # dp 2
    booster = Booster(plugin=plugin)
    sharded = copy.deepcopy(reference)
    boosted, optimizer, *_ = booster.boost(sharded, torch.optim.SGD(sharded.parameters(), lr=0.1))
    try:
        loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS).loss
        ok = torch.allclose(loss, expected, rtol=1e-5, atol=1e-6)
        print(f"rank {rank}: loss {loss.item():.6f}, one device {expected.item():.6f}: {'OK' if ok else 'MISMATCH'}",
              flush=True)
    except Exception as e:
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:160]} -> CRASH", flush=True)
    os._exit(0)  # (a rank left waiting in a collective would hold the process group's shutdown)


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
