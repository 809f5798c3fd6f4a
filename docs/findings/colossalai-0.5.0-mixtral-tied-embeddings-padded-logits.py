#!/usr/bin/env python3
"""Colossal-AI 0.5.0: a Mixtral with tied embeddings returns logits over the padded vocabulary without tensor parallelism.

MixtralPolicy (shardformer/policies/mixtral.py:95-100) replaces a tied embedding with a PaddingEmbedding when there is no
tensor parallelism, which pads its vocabulary to `make_vocab_size_divisible_by` (64 by default) rows. The LM head shares
that weight, but MixtralForCausalLMPolicy replaces it only under tensor parallelism (Linear1D_Col) or the zero-bubble
schedule: it stays a plain Linear over the padded weight. LlamaForCausalLMPolicy makes it a PaddingLMHead, whose forward
cuts the padding columns off; Mixtral's does not. So the boosted model's logits have 64 columns for a vocabulary of 13:
transformers' own loss fails ("shape '[-1, 13]' is invalid for input of size 640"), and a loss computed on the logits
counts 51 padding classes in every softmax, silently: the loss and every gradient are wrong. Under a pipeline the last
stage sends the wider logits' gradient, and gloo aborts on the size mismatch.

Found by shardfuzz's colossalai-moe target (campaign 316: five findings on cases with tied embeddings, gradients
off by 9-15 times the bf16 noise, a class-weighted loss crashing on "64 classes", a pp 2 case killed by gloo; each
passes with the fix below). Run (Colossal-AI 0.5.0, torch 2.5.1, transformers 4.51.3: shardfuzz's .venv-colossalai):

    python -m torch.distributed.run --nproc_per_node 1 colossalai-0.5.0-mixtral-tied-embeddings-padded-logits.py

It boosts a 1-layer Mixtral (vocabulary 13, tied embeddings) with MoeHybridParallelPlugin (tp 1, pp 1, ep 1, ZeRO 0,
fp32) and compares its logits and the cross-entropy on them with the same model's before boosting: MISMATCH (logits
(2, 5, 64) against (2, 5, 13), loss 4.16 against 2.58; exit status 1). `--fixed` makes the LM head a PaddingLMHead there
as Llama's policy does (shardfuzz's known fix colossalai-mixtral-tied-padded-logits): OK. On the CPU it installs the
gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (none changes what Colossal-AI computes).
"""
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))


def fix():
    """The LM head a PaddingLMHead without tensor parallelism, as LlamaForCausalLMPolicy makes it."""
    from colossalai.shardformer.layer import PaddingLMHead
    from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, SubModuleReplacementDescription
    from colossalai.shardformer.policies.mixtral import MixtralForCausalLMPolicy
    from transformers.models.mixtral.modeling_mixtral import MixtralForCausalLM

    original = MixtralForCausalLMPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        zbv = self.pipeline_stage_manager is not None and self.pipeline_stage_manager.use_zbv
        if not self.shard_config.enable_tensor_parallelism and not zbv and self.tie_weight:
            head = SubModuleReplacementDescription(suffix="lm_head", target_module=PaddingLMHead, kwargs={
                "make_vocab_size_divisible_by": self.shard_config.make_vocab_size_divisible_by})
            policy.setdefault(MixtralForCausalLM, ModulePolicyDescription(sub_module_replacement=[]))
            policy[MixtralForCausalLM].sub_module_replacement = [
                *(policy[MixtralForCausalLM].sub_module_replacement or []), head]
        return policy

    MixtralForCausalLMPolicy.module_policy = module_policy


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    from shardfuzz_worker.targets.colossalai_common import install_shims

    install_shims()
    if "--fixed" in sys.argv:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import MoeHybridParallelPlugin
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           tie_word_embeddings=True, _attn_implementation="eager")
    torch.manual_seed(0)
    reference = MixtralForCausalLM(config).float()
    model = copy.deepcopy(reference)
    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=1, zero_stage=0, precision="fp32",
                                     enable_metadata_cache=False, overlap_p2p=False)
    model, *_ = Booster(plugin=plugin).boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ids = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(1))

    def loss(logits):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item()

    got, want = model(input_ids=ids).logits, reference(input_ids=ids).logits
    print(f"logits {tuple(got.shape)} (the model before boosting: {tuple(want.shape)}); cross-entropy on them "
          f"{loss(got):.6f} ({loss(want):.6f})")
    same = got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    print("OK" if same else "MISMATCH")
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
