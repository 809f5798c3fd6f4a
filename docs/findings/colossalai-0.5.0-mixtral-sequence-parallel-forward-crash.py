#!/usr/bin/env python3
"""Colossal-AI 0.5.0: a Mixtral under sequence parallelism crashes in its first forward.

With `enable_sequence_parallelism` MixtralPolicy installs `get_mixtral_flash_attention_model_forward`'s forward
(shardformer/modeling/mixtral.py:719-), which reads `self._attn_implementation` (lines 783 and 794: an attribute of
older transformers' models) where transformers 4.51.3, the release Colossal-AI 0.5.0 pins, keeps it on the config
only (the same function reads `self.config._attn_implementation` at line 791): AttributeError "'MixtralModel' object
has no attribute '_attn_implementation'" on every rank, whatever the mode. Reading the config's attribute instead
(`--past-attribute`) gets past it, to a second crash in split_gather mode: "shape '[2, 4, 1, 4]' is invalid for input
of size 16" (the attention's view of the split sequence). Sequence parallelism on a Mixtral does not run on 0.5.0.

Found by shardfuzz's colossalai-moe target (campaign 317: tp 2 with sequence parallelism). Run (Colossal-AI 0.5.0,
torch 2.5.1, transformers 4.51.3: shardfuzz's .venv-colossalai):

    python -m torch.distributed.run --nproc_per_node 2 colossalai-0.5.0-mixtral-sequence-parallel-forward-crash.py

prints CRASH (exit status 1) with the AttributeError; with `--past-attribute`, CRASH with the shape error. On the CPU
it installs the gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (none changes what Colossal-AI computes).
"""
import copy
import datetime
import inspect
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))


def past_attribute():
    """The sequence-parallel forward reading the config's `_attn_implementation`, as transformers 4.51 keeps it."""
    from colossalai.shardformer.modeling import mixtral as modeling
    from colossalai.shardformer.policies import mixtral as policies

    source = inspect.getsource(modeling.get_mixtral_flash_attention_model_forward)
    assert source.count("self._attn_implementation ==") == 2, "the released forward changed"
    namespace = {}
    exec(compile(source.replace("self._attn_implementation ==", "self.config._attn_implementation =="),
                 modeling.__file__, "exec"), modeling.__dict__, namespace)
    forward = namespace["get_mixtral_flash_attention_model_forward"]
    modeling.get_mixtral_flash_attention_model_forward = policies.get_mixtral_flash_attention_model_forward = forward


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    if "--past-attribute" in sys.argv:
        past_attribute()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           _attn_implementation="eager")
    torch.manual_seed(0)
    reference = MixtralForCausalLM(config).float()
    plugin = MoeHybridParallelPlugin(tp_size=2, pp_size=1, ep_size=1, zero_stage=0, precision="fp32",
                                     enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather",
                                     parallel_output=False, enable_metadata_cache=False, overlap_p2p=False)
    model = copy.deepcopy(reference)
    model, *_ = Booster(plugin=plugin).boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ids = torch.randint(0, 16, (2, 4), generator=torch.Generator().manual_seed(1))
    try:
        got = model(input_ids=ids).logits
    except Exception as e:  # noqa: BLE001 - the crash is the finding
        print(f"CRASH on rank {dist.get_rank()}: {type(e).__name__}: {e}")
        return 1
    same = torch.allclose(got, reference(input_ids=ids).logits, atol=1e-5)
    print("OK" if same else "MISMATCH")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
