"""What differs between torch releases, in one place, so that the torch targets run unchanged against an older
release (`--python` pointing at another environment). Before torch 2.5, DTensor lived in the private
`torch.distributed._tensor` and `torch.distributed.tensor` held only `parallel`: `public_dtensor()` makes the
public names (`DTensor`, `Shard`, `Replicate`, `Partial`, `distribute_tensor`, `distribute_module`, ...) importable
from `torch.distributed.tensor` there, as later releases have them. (The generated repro scripts embed it.)

Measured: torch 2.4.1 has them only under `torch.distributed._tensor`; 2.5.1 and later have both. torch 2.4's
and 2.5's `DTensor.redistribute` refused every Partial among the placements asked for (`refuses_kept_partials`), and
their `clip_grad_norm_` any sparse gradient (`clips_sparse_gradients`)."""

import functools
import sys

#: The public DTensor names the targets import from torch.distributed.tensor.
DTENSOR_NAMES = ("DTensor", "DeviceMesh", "Placement", "Shard", "Replicate", "Partial", "distribute_tensor",
                 "distribute_module", "init_device_mesh")


def public_dtensor():
    """torch.distributed.tensor with the public DTensor names, on any release (True where they were aliased)."""
    import torch.distributed.tensor as public

    if hasattr(public, "DTensor"):
        return False
    import torch.distributed._tensor as private

    for name in DTENSOR_NAMES:
        if hasattr(private, name):
            setattr(public, name, getattr(private, name))
    sys.modules.setdefault("torch.distributed.tensor.placement_types", private.placement_types)
    return True


@functools.lru_cache(maxsize=None)
def refuses_kept_partials():
    """Whether `DTensor.redistribute` refuses every Partial among the placements asked for, one the tensor already has
    included ("redistributing to Partial is for internal use only": torch 2.4.1 and 2.5.1; 2.15 refuses only a change
    to one). A library-op case whose sources start an argument elsewhere than its placements, a Partial among them,
    cannot be set up there. Read from the release's source; where it ships none, from its version (the refusal was
    measured on 2.4.1 and 2.5.1 only)."""
    import inspect

    import torch
    from torch.distributed.tensor import DTensor

    try:
        return "redistributing to Partial is for internal use only" in inspect.getsource(DTensor.redistribute)
    except (OSError, TypeError):
        return torch.__version__.startswith(("2.4.", "2.5."))


@functools.lru_cache(maxsize=None)
def clips_sparse_gradients():
    """Whether `torch.nn.utils.clip_grad_norm_` takes a sparse gradient on one device (an embedding's with
    sparse=True). Measured: torch 2.4.1 and 2.5.1 raise NotImplementedError ("Could not run 'aten::linalg_vector_norm'
    with arguments from the 'SparseCPU' backend"), 2.15 clips. Tried on a 3x2 parameter, once per process."""
    import torch

    p = torch.nn.Parameter(torch.zeros(3, 2))
    p.grad = torch.sparse_coo_tensor([[0]], torch.ones(1, 2), (3, 2))
    try:
        torch.nn.utils.clip_grad_norm_([p], 1.0, foreach=False)
    except (NotImplementedError, RuntimeError):
        return False
    return True


def context_parallel_module():
    """The module of torch's `context_parallel` (torch.distributed.tensor.experimental._attention on every release
    that has it: 2.5.1 and 2.15 measured)."""
    import torch.distributed.tensor.experimental._attention as attention

    return attention


def cp_load_balances():
    """Whether this torch's `context_parallel` reorders the sequence for causal load balance (2.15: head-tail where
    2 x cp divides the sequence; 2.5.1 has no load balancing: contiguous parts)."""
    options = getattr(context_parallel_module(), "_cp_options", None)
    return bool(getattr(options, "enable_load_balance", False))


def cp_rotate_methods():
    """Whether this torch lets the user pick ring attention's key/value rotation (`set_rotate_method`: 2.15; 2.5.1
    always permutes the shards around the ring)."""
    return hasattr(context_parallel_module(), "set_rotate_method")


def cp_unshard(mesh, t, seq_dim):
    """`t`, a rank's part of every sequence along `seq_dim` under `context_parallel` over `mesh`, as whole sequences in
    order: torch's `context_parallel_unshard` where it has one (undoing its load balancing), else (2.5.1: contiguous
    parts, no reordering) the parts gathered in rank order."""
    import torch
    import torch.distributed as dist

    unshard = getattr(context_parallel_module(), "context_parallel_unshard", None)
    if unshard is not None:
        return unshard(mesh, [t.contiguous()], [seq_dim])[0]
    parts = [torch.empty_like(t) for _ in range(mesh.size())]
    dist.all_gather(parts, t.contiguous(), group=mesh.get_group())
    return torch.cat(parts, dim=seq_dim)
