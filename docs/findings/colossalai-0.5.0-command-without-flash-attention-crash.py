# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin cannot train a Cohere Command model
# (CohereForCausalLM) unless flash attention or sequence parallelism is on: its first forward fails with
# "AssertionError: Flash Attention Error: attention_mask should be a dict." (shardformer/modeling/command.py:398).
# CommandPolicy replaces CohereAttention.forward in every layout with get_command_flash_attention_forward
# (policies/command.py:79-84), which sets `shard_config.enable_flash_attention = True` itself (command.py:395) and
# asserts the mask is the dict ColoAttention.prepare_attn_kwargs makes. The model forward that makes that dict
# (get_command_flash_attention_model_forward, or the pipeline's, both also forcing the flag) is installed only with
# enable_flash_attention or sequence parallelism (policies/command.py:86-98); otherwise transformers' CohereModel
# passes its own mask (a tensor, or None), so tensor or data parallelism alone, with the plugin's defaults, always
# fails. (The forward's eager branch, which the forced flag makes unreachable, would be wrong too: it transposes the
# attention output twice, command.py:411 and :413; measured with the flag not forced, tp 2: loss 4.862076 against
# 4.858349 on one device.)
# Fix (`--fixed`): install the model forward that makes the dict whenever the attention forward expects one (always,
# without a pipeline, as its forcing of the flag intends); the step then matches one device.
# On the CPU both runs let ColoAttention use Colossal-AI's own SDPA kernel (FlashAttentionSdpaCudaExtension, which
# calls torch's scaled_dot_product_attention but reports itself unavailable without CUDA); on a GPU that line does
# nothing. Found by reading CommandPolicy while adding Command to shardfuzz's vocabulary; no Colossal-AI issue found.
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
# Measured (2026-12-08): both ranks raise the AssertionError: CRASH. --fixed: loss 4.858349 on both ranks, one
# device's: OK.
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))


def fix():
    """Without a pipeline, the attention's dict mask from the model forward Colossal-AI wrote for it."""
    from transformers.models.cohere.modeling_cohere import CohereModel

    from colossalai.shardformer.modeling.command import get_command_flash_attention_model_forward
    from colossalai.shardformer.policies.command import CommandPolicy

    original = CommandPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        config = self.shard_config
        if self.pipeline_stage_manager is None and not (config.enable_flash_attention or config.enable_sequence_parallelism):
            self.append_or_create_method_replacement(
                description={"forward": get_command_flash_attention_model_forward(config)}, policy=policy,
                target_key=CohereModel)
        return policy

    CommandPolicy.module_policy = module_policy


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
                          num_attention_heads=4, num_key_value_heads=4, logit_scale=1.0, tie_word_embeddings=False,
                          pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    torch.manual_seed(0)
    return CohereForCausalLM(config).float()


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29583", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    cpu_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    reference = model()
    expected = reference(input_ids=IDS, labels=IDS).loss  # one device, plain transformers
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32")  # flash attention and sp off: the defaults
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
