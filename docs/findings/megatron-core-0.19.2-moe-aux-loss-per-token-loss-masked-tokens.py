"""megatron-core 0.19.2: under `calculate_per_token_loss`, the MoE load-balancing loss's gradient is weighted by
(the micro-batch's tokens / its counted tokens) whenever the loss mask leaves tokens out.

The router's own comment (transformer/moe/router.py:605-633) states the target: the auxiliary loss's gradient
scaled by 1 / (micro-batches x dp), as without per-token loss. finalize_model_grads divides every gradient by the
global count the loss functions return (`num_tokens`, the loss mask's sum in Megatron-LM's loss_func), so the router
pre-multiplies the auxiliary loss by what it takes that count to be: its own token count (`valid_token_count`,
padding excluded only through the MoE layer's `padding_mask`) x the tensor/context-parallel size. Tokens the loss
mask excludes but the router still routes (an end-of-document mask, masked prompts, ignored labels) are in the
first count and not in the second: the auxiliary gradient grows by tokens / counted tokens, here 2x.

Setup: one rank, one TopKRouter (softmax before top-k, 4 experts, top-2, `seq_aux_loss`), a micro-batch of 2
sequences x 4 tokens whose loss mask counts 4 of its 8 tokens. The auxiliary loss's gradient on the router weight
under per-token loss, divided by the counted tokens as finalize_model_grads divides it, against the same gradient
without per-token loss (the target): MISMATCH, 2.0x. `--fixed` pre-multiplies by the counted tokens instead.

Found by shardfuzz's megatron-tp target (2026-11-30): a dp 2, ep 2 case with per-token loss and ignored targets
diverged on the router weight's gradient once the reference averaged the auxiliary loss over sequences whatever
the loss ignores (campaign 186 had found the reference weighting it by tokens / counted tokens).

Run: python megatron-core-0.19.2-moe-aux-loss-per-token-loss-masked-tokens.py [--fixed]  (CPU, gloo, one process).
Prints MISMATCH (exit 1) or OK.
"""

import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29557")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
torch.cuda.current_device = lambda: "cpu"

from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler  # noqa: E402
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402

ps.initialize_model_parallel()
SEQ, BATCH, HIDDEN, EXPERTS = 4, 2, 8, 4
g = torch.Generator().manual_seed(0)
weight, x = torch.randn(EXPERTS, HIDDEN, generator=g), torch.randn(SEQ, BATCH, HIDDEN, generator=g)
loss_mask = torch.tensor([[1, 1], [1, 0], [1, 0], [0, 0]], dtype=torch.bool)  # [s, b]: 4 of 8 tokens counted
counted = int(loss_mask.sum())

if "--fixed" in sys.argv:
    original = TopKRouter.attach_and_log_load_balancing_loss

    def counted_tokens(self, *args, **kwargs):
        if self.calculate_per_token_loss:  # (the tokens finalize_model_grads divides by, not the routed ones)
            kwargs["valid_token_count"] = counted / self.tp_cp_group.size()
        return original(self, *args, **kwargs)

    TopKRouter.attach_and_log_load_balancing_loss = counted_tokens


def aux_gradient(per_token):
    """The router weight's gradient from the auxiliary loss alone, as the optimizer would see it."""
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=1, num_moe_experts=EXPERTS,
                               moe_router_topk=2, moe_router_pre_softmax=True, moe_aux_loss_coeff=0.1,
                               moe_router_load_balancing_type="seq_aux_loss", use_cpu_initialization=True, add_bias_linear=False,
                               calculate_per_token_loss=per_token)
    router = TopKRouter(config, pg_collection=get_default_pg_collection())
    with torch.no_grad():
        router.weight.copy_(weight)
    MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1))  # (one micro-batch, dp 1: what the schedule sets)
    probs, _ = router(x)
    (probs * 0).sum().backward()  # (the main loss's gradient left out: only the auxiliary one flows)
    grad = router.weight.grad.clone()
    return grad / counted if per_token else grad  # (finalize_model_grads's division by num_tokens)


want, got = aux_gradient(False), aux_gradient(True)
ratio = float(got.norm() / want.norm())
print(f"auxiliary gradient under per-token loss / without: {ratio:.4f} (target 1; tokens / counted = "
      f"{SEQ * BATCH / counted:.1f})")
bad = not torch.allclose(got, want, rtol=1e-5, atol=1e-8)
print("MISMATCH" if bad else "OK")
dist.destroy_process_group()
sys.exit(1 if bad else 0)
