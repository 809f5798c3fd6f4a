"""PyTorch 2.15: under torch's zero-bubble pipeline schedules, a stage whose inputs need no gradient trains nothing:
with every earlier stage frozen (a head, or the last blocks, fine-tuned on a frozen backbone) its trainable parameters
keep `.grad` None, and the optimizer silently skips them.

A zero-bubble schedule (`ScheduleZBVZeroBubble`, `ScheduleInterleavedZeroBubble`, `ScheduleDualPipeV`) splits each
stage's backward in two. The input part, `stage_backward_input`, finds the weights' part of the autograd graph through
the graph reachable from the stage's inputs (`get_param_groups`); when no input requires a gradient that graph is
empty, no parameter group is found, the weight part computes nothing, and `stage_backward_input` detaches the stage's
output. The code knows this for the first stage ("if inputs does not require gradient, then the parameter group will
not be fully captured during stage_backward_input; in this case, we need call grad directly on the parameters", in
`backward_weight_one_chunk`, and an assert in `get_param_groups` commented out for it) and runs the first stage's
weight step as a full backward; any later stage whose inputs need no gradient gets nothing. Without zero bubble
(`Schedule1F1B`) the same model trains.

Found by shardfuzz (torch-pp target): pp 3 x dp 2, interleaved zero bubble with 2 stages per rank, every block and the
embedding frozen: the final norm and LM head never got a gradient (with the stages in DDP and in FSDP2 ZeRO-2 alike).

Run: torchrun --nproc_per_node 2 torch-2.15-pipelining-zero-bubble-frozen-input-no-grad.py [--fix] [--interleaved] [--1f1b]
(CPU, gloo; 2 pipeline ranks, 4 stages). The first three stages are frozen, the last (norm + LM head) trains. Prints
NO GRADIENT (the stage's trainable parameters left with `.grad` None) or OK on the rank holding the last stage.
`--fix` runs the weight step of every stage whose inputs need no gradient as a full backward, as the first stage's;
`--1f1b` runs the same stages under ScheduleInterleaved1F1B, without zero bubble (OK).
"""

import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import (PipelineStage, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                                         ScheduleZBVZeroBubble)
from torch.distributed.pipelining.stage import _PipelineStageBase

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
RANK = dist.get_rank()
PP, MICROBATCHES, VOCAB, HIDDEN = 2, 2, 13, 8

if "--fix" in sys.argv:
    import inspect
    import textwrap

    def patch(name, old, new):
        source = textwrap.dedent(inspect.getsource(getattr(_PipelineStageBase, name)))
        assert source.count(old) == 1, f"the released {name} has changed"
        module = sys.modules[_PipelineStageBase.__module__]
        namespace = {}
        exec(compile(source.replace(old, new), inspect.getsourcefile(module), "exec"), module.__dict__, namespace)
        setattr(_PipelineStageBase, name, namespace[name])

    patch("backward_one_chunk", "            if not self.is_first:\n",
          "            if not self.is_first and not any(isinstance(v, torch.Tensor) and v.requires_grad\n"
          "                                             for v in bwd_kwargs[\"input_values\"]):\n"
          "                grads_input = tuple(None for _ in bwd_kwargs[\"input_values\"])\n"
          "            elif not self.is_first:\n")
    patch("backward_weight_one_chunk", "if self.stage_index != 0:", "if param_groups is not None:")

torch.manual_seed(0)
every_stage = [nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN)),
               nn.Sequential(nn.Linear(HIDDEN, HIDDEN)), nn.Sequential(nn.Linear(HIDDEN, HIDDEN)),
               nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB))]
for frozen in every_stage[:3]:
    frozen.requires_grad_(False)  # a frozen backbone, the head trained
interleaved, one_f_one_b = "--interleaved" in sys.argv, "--1f1b" in sys.argv
mine = [RANK, RANK + PP] if interleaved or one_f_one_b else [RANK, 2 * PP - 1 - RANK]  # ZBV places stages in a V
group = dist.new_group(list(range(PP)))
stages = [PipelineStage(every_stage[i], i, 2 * PP, torch.device("cpu"), group=group) for i in mine]
Schedule = (ScheduleInterleavedZeroBubble if interleaved else ScheduleInterleaved1F1B if one_f_one_b
            else ScheduleZBVZeroBubble)
schedule = Schedule(stages, MICROBATCHES, loss_fn=lambda out, tgt: F.cross_entropy(out.reshape(-1, VOCAB), tgt.reshape(-1)))
ids = torch.randint(0, VOCAB, (MICROBATCHES, 4))
targets = torch.randint(0, VOCAB, (MICROBATCHES, 4))
first, last = 0 in mine, 2 * PP - 1 in mine
schedule.step(*([ids] if first else []), **({"target": targets, "losses": []} if last else {}))
code = 0
if last:
    head = every_stage[-1]
    missing = [n for n, p in head.named_parameters() if p.requires_grad and p.grad is None]
    print(f"NO GRADIENT on the last stage (rank {RANK}): {', '.join(missing)}" if missing
          else f"OK: the last stage's parameters have their gradients (rank {RANK})", flush=True)
    code = 1 if missing else 0
dist.destroy_process_group()
sys.exit(code)
