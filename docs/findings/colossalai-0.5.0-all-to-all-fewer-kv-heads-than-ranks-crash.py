# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin with sequence_parallelism_mode
# "all_to_all" on a Llama with fewer key/value heads than sequence-parallel ranks (GQA, here 1 kv head, sp 2)
# crashes in the attention's reshape: the policy divides num_key_value_heads by sp_size (policies/llama.py:69,
# 1 // 2 = 0) without checking it, where a clear refusal (as for tensor parallelism's `num_kv_heads >= tp_size`
# assertion) is due. Found by shardfuzz (target colossalai-hybrid). Run: python this.py  (2 CPU ranks, gloo)
import os
import torch, torch.distributed as dist, torch.multiprocessing as mp


def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29564", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    plugin = HybridParallelPlugin(tp_size=1, pp_size=1, sp_size=2, precision="fp32", enable_sequence_parallelism=True,
                                  sequence_parallelism_mode="all_to_all", parallel_output=False)
    model, *_ = Booster(plugin=plugin).boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ids = torch.randint(0, 16, (1, 4))
    try:
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
        print(f"rank {rank}: ran")
    except Exception as e:  # the crash
        print(f"rank {rank}: {type(e).__name__}: {e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
