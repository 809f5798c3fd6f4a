# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(tp_size=2) on an OPT whose LM head is its
# own (OPTConfig(tie_word_embeddings=False)) silently replaces the LM head's weight by the input embedding's.
# OPTForCausalLMPolicy.postprocess (policies/opt.py:433-444) runs `lm_head.weight = model.decoder.embed_tokens.weight`
# under tensor parallelism without a pipeline, whether or not the model ties them (the policy records whether it
# does, `self.tie_weight`, in preprocess, and uses it only to choose the embedding class). The boosted model has no
# lm_head parameter of its own any more: its logits are the hidden states times the embedding, the loss and every
# gradient are wrong, and the optimizer never sees the head's weight. Tied OPTs (the released checkpoints) are
# unaffected; any OPT-architecture model trained with its own head is.
# Fix (`--fixed`, shardfuzz's known fix colossalai-opt-untied-lm-head-bound): bind them only when the model tied them.
# Found by shardfuzz (target colossalai-hybrid, a GPT-2-math case built as an OPT, `model.hf_model: opt`, tp 2).
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
# Measured: on both ranks "lm_head.weight is embed_tokens.weight: True", the loss 2.7992 against 2.7692 on one device
# (relative error 1.1e-2; transformers' small random initialisation): MISMATCH. --fixed: False, the loss 2.7692 on
# both ranks: OK.
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.tensor([[3, 7, 12, 4, 5, 2], [2, 6, 0, 5, 11, 3]])


def fix():
    """Bind the LM head to the embedding only where the model tied them (the policy's own check, in preprocess)."""
    from colossalai.shardformer.policies.opt import OPTForCausalLMPolicy

    original = OPTForCausalLMPolicy.postprocess
    OPTForCausalLMPolicy.postprocess = lambda self: original(self) if self.tie_weight else self.model


def model():
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(vocab_size=16, hidden_size=8, ffn_dim=12, num_hidden_layers=2, num_attention_heads=2,
                       max_position_embeddings=8, word_embed_proj_dim=8, dropout=0.0, attention_dropout=0.0,
                       tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                       _attn_implementation="eager")
    return OPTForCausalLM(config)


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29573", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
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
    expected = reference(input_ids=IDS, labels=IDS).loss
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", parallel_output=False)
    boosted, *_ = Booster(plugin=plugin).boost(model(), torch.optim.SGD(reference.parameters(), lr=0.1))
    inner = boosted.unwrap()
    bound = inner.lm_head.weight is inner.model.decoder.embed_tokens.weight
    loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS).loss
    error = abs(float(loss) - float(expected)) / abs(float(expected))
    verdict = "OK" if error < 1e-5 and not bound else "MISMATCH"
    print(f"rank {rank}: lm_head.weight is embed_tokens.weight: {bound}; loss {float(loss):.4f}, one device"
          f" {float(expected):.4f} (relative error {error:.1e}) -> {verdict}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
