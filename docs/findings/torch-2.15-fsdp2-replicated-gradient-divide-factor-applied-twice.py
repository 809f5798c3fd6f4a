#!/usr/bin/env python3
"""torch 2.15 FSDP2: with a reduce-scatter group of one rank, an explicit gradient divide factor is applied twice.

`fully_shard` over an HSDP mesh whose shard dimension has size 1 (every rank a full replica, as `replicate`-style
data parallelism on FSDP2 builds it) skips the reduce-scatter in `foreach_reduce` and copies the gradient instead,
dividing it by the module's `gradient_divide_factor` (set by `set_gradient_divide_factor`, as torchtitan does for its
expert-parallel modules). But `_get_gradient_divide_factors` has already turned the same factor into a pre- and a
post-division wherever the collectives are plain sums: with `set_force_sum_reduction_for_comms(True)` (for backends
without AVG / PREMUL_SUM, or NCCL's zero-copy collectives), or with an fp16 reduce dtype (always pre/post-divided).
The gradients come out divided by the factor twice: 1/dp of the average, silently. torch's own FSDP2-based data
parallelism, `torch.distributed._composable.replicate_with_fsdp.replicate`, goes through the same copy and is wrong the
same way. The same factor on a mesh whose shard dimension has more than one rank is right, and so are both settings
without an explicit factor.

Found by shardfuzz (torch-fsdp2, the case fields `sum_collectives` and `explicit_grad_divide` on HSDP with
`zero_shard_group` 1; tests/python-grad-divide/). Each configuration below runs one backward of a linear layer over
2 ranks and compares the gradient with the data-parallel average computed from every rank's input:

    python -m torch.distributed.run --nproc_per_node 2 torch-2.15-fsdp2-replicated-gradient-divide-factor-applied-twice.py

prints one line per configuration and MISMATCH (exit status 1) on torch 2.15: the gradient 0.5x the average for the
(2, 1) mesh and for replicate(), each with forced sums (f32) and with an fp16 reduce dtype; right for the rest. With `--fixed` (shardfuzz's
known fix torch-fsdp2-world-size-one-divides-twice: the copy divides only where neither a pre- nor a post-division
will, i.e. where it stands in for an averaging or pre-multiplying collective) every line is right: OK. gloo on the CPU.
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def fix():
    """shardfuzz known fix torch-fsdp2-world-size-one-divides-twice."""
    import inspect
    import textwrap

    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group

    old = "if gradient_divide_factor is not None and gradient_divide_factor != 1.0:"
    source = textwrap.dedent(inspect.getsource(_fsdp_collectives.foreach_reduce))
    assert source.count(old) == 1, "the released foreach_reduce changed"
    new = old[:-1] + " and predivide_factor is None and postdivide_factor is None:"
    namespace = {}
    exec(compile(source.replace(old, new), _fsdp_collectives.__file__, "exec"), _fsdp_collectives.__dict__, namespace)
    _fsdp_collectives.foreach_reduce = _fsdp_param_group.foreach_reduce = namespace["foreach_reduce"]


def gradient_ratio(mesh_shape, reduce_dtype, force_sum, factor):
    """The sharded gradient over the data-parallel average (1.0 when right) of one linear layer's weight."""
    world = dist.get_world_size()
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4, bias=False)
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    if mesh_shape == "replicate":  # torch's FSDP2-based data parallelism: a replicate-only mesh
        from torch.distributed._composable.replicate_with_fsdp import replicate

        layer = replicate(layer, mp_policy=policy)
    else:
        names = ("replicate", "shard") if len(mesh_shape) == 2 else ("dp",)
        fully_shard(layer, mesh=init_device_mesh("cpu", mesh_shape, mesh_dim_names=names), mp_policy=policy)
    layer.set_force_sum_reduction_for_comms(force_sum)
    if factor:
        layer.set_gradient_divide_factor(float(world))
    inputs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(1 + r)) for r in range(world)]
    layer(inputs[dist.get_rank()]).sum().backward()
    grad = layer.weight.grad
    grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    expected = sum(torch.ones(4, 3) @ x for x in inputs) / world  # d(sum(x W^T))/dW = 1^T x, averaged over the ranks
    return (grad.float().norm() / expected.norm()).item()


def main():
    dist.init_process_group("gloo")
    if "--fixed" in sys.argv:
        fix()
    world, wrong = dist.get_world_size(), False
    for mesh_shape, dtype, force_sum, factor in [
        ((world, 1), torch.float32, True, True),  # the bug: forced sums
        ((world, 1), torch.float16, False, True),  # the bug: fp16 reduce dtype
        ((world, 1), torch.float32, False, True),  # right: PREMUL path, the copy's division is the only one
        ((world, 1), torch.float32, True, False),  # right: no explicit factor
        ((world,), torch.float32, True, True),  # right: a real reduce-scatter
        ("replicate", torch.float32, True, True),  # the bug: torch's replicate() on FSDP2, forced sums
        ("replicate", torch.float16, False, True),  # the bug: replicate(), fp16 reduce dtype
    ]:
        ratio = gradient_ratio(mesh_shape, dtype, force_sum, factor)
        bad = abs(ratio - 1) > (1e-3 if dtype == torch.float16 else 1e-5)
        wrong |= bad
        if dist.get_rank() == 0:
            print(f"{'replicate()' if mesh_shape == 'replicate' else f'mesh {mesh_shape}'}, reduce dtype {str(dtype)[6:]}, force_sum_reduction_for_comms={force_sum}, "
                  f"set_gradient_divide_factor({world if factor else '-'}): gradient {ratio:.4f}x the average"
                  + ("  <-- wrong" if bad else ""))
    if dist.get_rank() == 0:
        print("MISMATCH: the gradient divided by the factor twice" if wrong else "OK")
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
