"""megatron-core 0.19.2: MoE drop-and-pad dispatch crashes when the expert capacity exceeds a router call's tokens.

With `moe_pad_expert_input_to_capacity` the all-to-all token dispatcher sets the capacity to
get_capacity(tokens x topk, experts, capacity_factor) (token_dispatcher.py: `preprocess`) and asks `permute` for
capacity x experts rows. `permute` (moe_utils.py, drop_and_pad branch) takes each expert's first `capacity` token
indices with `routing_map.T.argsort(dim=-1, ...)[:, :capacity]`: each row holds only `num_tokens` indices, so where
the capacity is larger (capacity_factor x topk > experts, e.g. top-4 of 4 experts with a capacity factor of 2) the
slice is shorter than `capacity` and `sorted_indices.view(num_experts, capacity)` fails: "RuntimeError: shape
'[4, 8]' is invalid for input of size 16". A capacity above the tokens is legitimate (every token fits; the rest is
padding), and the all-gather dispatcher's padded path runs such a case.

Found by shardfuzz's megatron-tp target (2026-12-01, campaign 200: a dp 2 x ep 2 f16 case with a top-4 of 4 MoE,
capacity factor 2 and `pad_to_capacity`, one 4-token sequence per micro-batch); reduced by hand to the padded
dp 2 x ep 2 test case with a capacity factor of 4, and to this call. Not found among Megatron-LM's issues by search;
not reported from here. The router's own token-drop code (`apply_router_token_dropping`) handles the case ("No need
to drop tokens if capacity exceeds the number of tokens"); the dispatcher does not. Met again on 2026-12-06 (campaigns
289 and 293, minimized to 2 experts, top-1, capacity factor 4, one token per rank).

Fix (`--fixed`; shardfuzz's known fix megatron-moe-pad-to-capacity-above-tokens, 2026-12-06): the dispatcher's
capacity at most the router call's token count. An expert receives each token once at most, so nothing more is
dropped; only fewer zero-weighted padding rows are computed. With it the minimized case and campaign 293's pass
shardfuzz's oracle against the float64 reference.

This script calls `permute` as the all-to-all dispatcher does for 4 tokens routed to all 4 experts, then (where it
runs) `unpermute` with identity experts: every token must come back as itself times its summed probabilities.

Run: python megatron-core-0.19.2-moe-pad-to-capacity-above-tokens-permute-crash.py [--fixed] (one process, CPU).
Prints CRASH (exit 1), MISMATCH (exit 1) or OK.
"""

import sys

import torch
from megatron.core.transformer.moe.moe_utils import get_capacity, permute, unpermute

tokens, experts, topk, capacity_factor = 4, 4, 4, 2.0
hidden = torch.randn(tokens, 8)
routing_map = torch.ones(tokens, experts, dtype=torch.bool)
probs = torch.full((tokens, experts), 1.0 / experts)
capacity = get_capacity(num_tokens=tokens * topk, num_experts=experts, capacity_factor=capacity_factor)
if "--fixed" in sys.argv:
    capacity = min(capacity, tokens)
print(f"{tokens} tokens, top-{topk} of {experts} experts, capacity factor {capacity_factor}: capacity {capacity}")
try:
    out = permute(hidden, routing_map, probs=probs, num_out_tokens=capacity * experts, drop_and_pad=True)
    back = unpermute(out[0], out[2], hidden.shape, probs=probs, routing_map=routing_map, drop_and_pad=True)
except RuntimeError as e:
    print(f"CRASH: {e}")
    sys.exit(1)
if not torch.allclose(back, hidden * probs.sum(dim=-1, keepdim=True), rtol=1e-6, atol=1e-6):
    print("MISMATCH: the tokens do not come back times their probabilities")
    sys.exit(1)
print(f"OK: {tuple(out[0].shape)} permuted rows, every token back times its probabilities")
