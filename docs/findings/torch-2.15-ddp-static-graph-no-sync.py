"""PyTorch 2.15: DistributedDataParallel(static_graph=True) with gradient accumulation under no_sync() crashes at
the first backward, and once that crash is avoided, stops all-reducing gradients from the second step on.

Under no_sync() `require_backward_grad_sync` is False, so `_post_forward` never calls
`reducer.prepare_for_backward()` and the reducer does not expect its autograd hooks. `_DDPSink.backward` still
queues the static graph's one-shot delayed all-reduce (`reducer._delay_all_reduce`) on that backward, and
`Reducer::finalize_backward` asserts `expect_autograd_hooks_`: "INTERNAL ASSERT FAILED at reducer.cpp:1801".
With the queueing moved to a syncing backward (the Python half of the fix proposed in pytorch/pytorch PR #187732,
for the open issue #143580), training runs but is silently wrong: the ranks step on gradients that were not
all-reduced, and their replicas drift apart. (PR #187732's analysis: the reducer's per-parameter hook counts of the
static graph's first iteration also grow on the no_sync micro-batches, so parameters stop being marked ready; that
half of its fix is C++ and is not patched here.)

Found by shardfuzz (torch-ddp target) on its first case with the case field `parallel.static_graph` and gradient
accumulation (dp 2, two accumulation micro-steps, f32: a crash at step 0; with `--sink-fix`, the parameters after
the second step diverge from the single-device reference and between the ranks, every tensor thousands of times
its noise; the same case without static_graph passes).

Run: torchrun --nproc_per_node 2 torch-2.15-ddp-static-graph-no-sync.py [--sink-fix]
(CPU, gloo). Prints CRASH, MISMATCH or OK on rank 0.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
STEPS, MICRO, LR = 2, 2, 0.1

if "--sink-fix" in sys.argv:
    from torch.autograd import Variable
    from torch.nn.parallel import distributed

    def backward(ctx, *grad_outputs):
        ddp = ctx.ddp_weakref()
        if ddp.static_graph and not ddp._static_graph_delay_allreduce_enqueued and ddp.require_backward_grad_sync:
            Variable._execution_engine.queue_callback(ddp.reducer._delay_all_reduce)
            ddp._static_graph_delay_allreduce_enqueued = True
        return (None, *grad_outputs)

    distributed._DDPSink.backward = staticmethod(backward)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


# data[step][rank][micro]: 3 rows each
DATA = torch.randn(STEPS, WORLD, MICRO, 3, 4, generator=torch.Generator().manual_seed(1))


def reference():
    """One process: each step's gradient is the mean over every rank's micro-batches."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(m(DATA[step, r, k]).pow(2).sum() for r in range(WORLD) for k in range(MICRO)) / WORLD
        loss.backward()
        opt.step()
    return [p.detach() for p in m.parameters()]


def distributed_run(static_graph):
    m = DDP(model(), static_graph=static_graph)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        with m.no_sync():
            for k in range(MICRO - 1):
                m(DATA[step, RANK, k]).pow(2).sum().backward()
        m(DATA[step, RANK, MICRO - 1]).pow(2).sum().backward()
        opt.step()
    return [p.detach() for p in m.parameters()]


want = reference()
bad = []
for static_graph in (False, True):
    try:
        got = distributed_run(static_graph)
    except RuntimeError as e:
        bad.append(f"static_graph={static_graph}: CRASH {str(e).splitlines()[0][:160]}")
        continue
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.allclose(g, w, rtol=1e-5, atol=1e-6):
            bad.append(f"static_graph={static_graph}: rank {RANK} parameter {i} off by {float((g - w).norm()):.4f}"
                       f" (|parameter| {float(w.norm()):.4f})")
    others = [torch.zeros_like(torch.cat([g.flatten() for g in got])) for _ in range(WORLD)]
    dist.all_gather(others, torch.cat([g.flatten() for g in got]))
    if any(not torch.equal(o, others[0]) for o in others):
        bad.append(f"static_graph={static_graph}: the ranks' replicas differ")
reports = [None] * WORLD
dist.all_gather_object(reports, bad)
if RANK == 0:
    lines = [line for r in reports for line in r]
    print("\n".join(dict.fromkeys(lines)))
    print("CRASH" if any("CRASH" in x for x in lines) else "MISMATCH" if lines else "OK")
dist.destroy_process_group()
