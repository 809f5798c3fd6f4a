"""megatron-core 0.19.2: the MoE `position` token-drop policy does not drop "tokens at the end of each batch" (its
documented meaning, TransformerConfig.moe_token_drop_policy): it keeps arbitrary tokens on the CPU.

`apply_router_token_dropping` (transformer/moe/moe_utils.py) picks each expert's kept tokens with
`torch.topk(routing_map.int(), k=expert_capacity, dim=0, sorted=False)`. Every token routed to the expert ties at 1,
and which of the tied elements topk returns is unspecified: the CPU kernel (a partial sort) returns tokens from the
middle and the end of the batch, so tokens at the front are dropped while later ones are kept. The result depends on
the kernel's tie order, not on position.

Setup: 16 tokens routed top-1 to 2 experts (8 each, alternating), capacity factor 0.5: capacity 4 per expert. The
`position` policy must keep each expert's first 4 tokens (expert 0: tokens 0, 2, 4, 6). MISMATCH lists what it
kept. `--fixed` keeps a routed token while the expert's running count is within its capacity (a cumulative sum),
which is what the documentation describes.

Found by shardfuzz's megatron-tp target (2026-12-01) once it expressed the case model's capacity (each expert keeps
its earliest tokens of a sequence) as megatron's `position` policy: every case whose capacity dropped tokens diverged
(logits 7.7e5 x their noise), and passed with the fix.

Run: python megatron-core-0.19.2-moe-position-drop-policy-topk-ties.py [--fixed]  (CPU, one process, no
distributed setup). Prints MISMATCH (exit 1) or OK.
"""

import sys

import torch
from megatron.core.transformer.moe import moe_utils

TOKENS, EXPERTS, TOPK, CAPACITY_FACTOR = 16, 2, 1, 0.5

if "--fixed" in sys.argv:
    def dropping(routing_probs, routing_map, router_topk, capacity_factor, drop_policy="probs",
                 pad_to_capacity=False):
        capacity = moe_utils.get_capacity(routing_map.shape[0] * router_topk, routing_map.shape[1], capacity_factor)
        kept = torch.logical_and(routing_map, routing_map.int().cumsum(dim=0) <= capacity)
        return routing_probs * kept, kept

    moe_utils.apply_router_token_dropping = dropping

routing_map = torch.zeros(TOKENS, EXPERTS, dtype=torch.bool)
routing_map[torch.arange(TOKENS), torch.arange(TOKENS) % EXPERTS] = True  # token t -> expert t % 2
probs = routing_map.float() * 0.7
capacity = moe_utils.get_capacity(TOKENS * TOPK, EXPERTS, CAPACITY_FACTOR)
_, kept = moe_utils.apply_router_token_dropping(probs, routing_map, router_topk=TOPK, capacity_factor=CAPACITY_FACTOR,
                                                drop_policy="position")
bad = False
for e in range(EXPERTS):
    routed = routing_map[:, e].nonzero().flatten().tolist()
    got, want = kept[:, e].nonzero().flatten().tolist(), routed[:capacity]
    print(f"expert {e}: routed {routed}, capacity {capacity}: kept {got}, the first {capacity}: {want}")
    bad |= got != want
print("MISMATCH" if bad else "OK")
sys.exit(1 if bad else 0)
