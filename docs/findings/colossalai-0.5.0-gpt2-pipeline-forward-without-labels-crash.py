# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(pp_size=2) on GPT-2 crashes on the
# last pipeline stage whenever the model is called without labels, i.e. with a criterion on the logits (the
# plugin's documented execute_pipeline(data, model, criterion, ...) usage) or for inference:
# GPT2PipelineForwards.gpt2_lmhead_model_forward assigns `loss` only `if labels is not None` (modeling/gpt2.py:414)
# and then returns it (:424), so the stage raises UnboundLocalError. The Llama forward sets `loss = None` first.
# The policy installs the same forward whenever parallel_output is on (policies/gpt2.py:414), so with the plugin's
# default (parallel_output=True) any GPT-2 forward without labels under tp_size > 1 fails the same way, pipeline
# or not (shardfuzz: tests/python-vocab-loss/gpt2-tp2-f32-vocab-sharded.json).
# Fix (`--fixed`): `loss = None` before the branch. Found by shardfuzz (target colossalai-hybrid, on the seed
# corpus/pp3-1f1b-more-microbatches.json once the target built GPT-2).
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
import datetime
import inspect
import os
import sys
import textwrap

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.tensor([[3, 7, 1, 4, 9, 2], [2, 9, 5, 8, 6, 11]])


def fix():
    from colossalai.shardformer.modeling import gpt2

    source = textwrap.dedent(inspect.getsource(gpt2.GPT2PipelineForwards.gpt2_lmhead_model_forward))
    anchor = "\n    lm_logits = self.lm_head(hidden_states)\n"
    source = source.replace("@staticmethod\n", "", 1).replace(anchor, anchor + "    loss = None\n", 1)
    namespace = {}
    exec(compile(source, inspect.getsourcefile(gpt2), "exec"), gpt2.__dict__, namespace)
    gpt2.GPT2PipelineForwards.gpt2_lmhead_model_forward = staticmethod(namespace["gpt2_lmhead_model_forward"])


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29570", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    dist.Backend.HCCL = getattr(dist.Backend, "HCCL", "hccl")  # p2p.py reads it; absent from CPU builds
    torch.cuda.set_device = lambda *_a, **_k: None  # the GPT-2 stage forward calls it (modeling/gpt2.py:258)
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=2, n_head=2, n_inner=16, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    plugin = HybridParallelPlugin(tp_size=1, pp_size=2, num_microbatches=2, precision="fp32", parallel_output=False)
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def criterion(outputs, micro_batch):
        logits = outputs.logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 micro_batch["input_ids"][:, 1:].reshape(-1))

    batch = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}
    try:
        out = booster.execute_pipeline(iter([batch]), boosted, criterion, optimizer, return_loss=True)
        print(f"rank {rank}: step finished, loss {out['loss']}")
    except Exception as e:  # the crash (the other stage then fails waiting for it)
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:200]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
