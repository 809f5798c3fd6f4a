"""deepspeed 0.19.8: MoE top-1 gating without random token selection (`use_rts=False`) keeps arbitrary tokens, not the
first ones, when an expert's capacity is exceeded (on the CPU).

`top1gating` (deepspeed/moe/sharded_moe.py) picks each expert's kept tokens with
`torch.topk(mask1_rand, k=capacity, dim=0)`, where without RTS `mask1_rand` is the 0/1 routing mask itself. Every
token routed to the expert ties at 1, and which tied elements topk returns is unspecified: the CPU kernel returns
tokens from the middle and the end, so earlier tokens are dropped while later ones are kept. The slots the kept
tokens then take are counted by position (`locations1 = cumsum(mask1) - 1`), GShard's first-come policy, which the
selection no longer follows. This path dates from the fix of issue #1658 (PR #1659, 2021: without RTS the capacity
was not applied at all).

Setup: 16 tokens routed top-1 to 2 experts (8 each, alternating), capacity factor 0.5: capacity 4 per expert. Without
random selection each expert keeps its first 4 tokens (expert 0: tokens 0, 2, 4, 6). MISMATCH lists what it kept.
`--fixed` replaces RTS's random scores by scores that fall with position, so topk takes the earliest routed tokens.

Found by shardfuzz's deepspeed-zero target (2026-12-01) once it expressed the case model's MoE blocks (each expert
keeps its earliest tokens of a sequence) as DeepSpeed's MoE layer with `use_rts=False`: the cases whose capacity
dropped tokens diverged (logits 5e5 x their noise) and passed with the fix.

Run: python deepspeed-0.19.8-moe-top1-no-rts-topk-ties.py [--fixed]  (CPU, one process, no distributed setup).
Prints MISMATCH (exit 1) or OK.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from deepspeed.moe import sharded_moe  # noqa: E402

TOKENS, EXPERTS, CAPACITY_FACTOR = 16, 2, 0.5

logits = torch.zeros(TOKENS, EXPERTS)
logits[torch.arange(TOKENS), torch.arange(TOKENS) % EXPERTS] = 1.0  # token t -> expert t % 2
use_rts = False
if "--fixed" in sys.argv:
    sharded_moe.exp_selection_uniform_map[logits.device] = (
        lambda shape: ((TOKENS - torch.arange(TOKENS)).float() / TOKENS).unsqueeze(1).expand(shape))
    use_rts = True  # (the scores above, not random ones)
_, capacity, _, indices, _, _, _ = sharded_moe.top1gating(logits, CAPACITY_FACTOR, 0, drop_tokens=True,
                                                          use_rts=use_rts, sparse_routes=True)
capacity = int(capacity)
bad = False
for e in range(EXPERTS):
    routed = [t for t in range(TOKENS) if t % EXPERTS == e]
    got, want = [t for t in range(TOKENS) if int(indices[0, t]) == e], routed[:capacity]
    print(f"expert {e}: routed {routed}, capacity {capacity}: kept {got}, the first {capacity}: {want}")
    bad |= got != want
print("MISMATCH" if bad else "OK")
sys.exit(1 if bad else 0)
