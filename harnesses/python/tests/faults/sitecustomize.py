"""Test-only framework faults, to prove that the fuzzer and its repro scripts detect a real framework bug.

Put this folder on PYTHONPATH and set SHARDFUZZ_TEST_FAULT; every Python process started with that environment
(the worker, its ranks, a repro script and torchrun's workers) patches the framework as it is imported:

  dtensor-partial-half  torch DTensor's Partial reduction (Partial._reduce_value, Partial._reduce_shard_value:
                        all-reduce, reduce-scatter) returns half the sum.
  dtensor-reduction-rule-replicate
                        a wrong DTensor sharding rule: a reduction over a sharded dimension (sum, amax,
                        norms …: _ops._math_ops.get_placement_from_reduction_op, which the reduction rules
                        ask for the output placement) marks its output Replicate instead of Partial, so the
                        ranks' partial results are never reduced.
  jax-wsc-scale         jax.lax.with_sharding_constraint multiplies its input by 1.5 when the sharding it asks
                        for is not fully replicated.
  jax-psum-scale        jax.lax.psum (the all-reduce of shard_map programs) returns 1.5 times the sum.
  fsdp2-avg-off-by-one  torch FSDP2's gradient reduce-scatter averages over world + 1 ranks: its divide factors
                        (_fsdp_collectives._get_gradient_divide_factors) sum, then divide by the group size + 1.
  ddp-avg-off-by-one    torch DistributedDataParallel's gradient bucket all-reduce averages over world + 1 ranks
                        (a comm hook that DistributedDataParallel.__init__ registers in place of the built-in one).
  megatron-reduce-half  megatron-core's tensor-parallel region all-reduce (tensor_parallel.mappings._reduce: the
                        outputs of row-parallel layers and of the vocab-parallel embedding) returns half the sum.
  megatron-ddp-grads-summed
                        megatron-core's DistributedDataParallel skips each gradient bucket's 1/dp scaling before its
                        all-reduce or reduce-scatter (_ParamAndGradBucketGroup.start_grad_sync): gradients summed over
                        the data-parallel ranks instead of averaged.
  megatron-per-token-count-local
                        megatron-core's finalize_model_grads divides the gradients by each rank's own count of loss
                        tokens instead of the count all-reduced over the data-parallel ranks (per-token loss).
  megatron-overflow-every-step
                        megatron-core's mixed-precision optimizer reports an overflow at every step
                        (MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan): every step skipped, the loss
                        scale halved each time, the parameters never updated.
  deepspeed-reduce-half every SUM reduction DeepSpeed issues through its torch comm backend
                        (deepspeed.comm.torch.TorchBackend: all_reduce, all_reduce_coalesced, reduce, reduce_scatter,
                        reduce_scatter_tensor; ZeRO's gradient reductions) yields half the sum.

SHARDFUZZ_MUTANT=<name> instead loads a framework mutant of the benchmark in scripts/bench/mutants/ (one exact
text of a module's source replaced; mutant_table.py there lists them).

Without either variable this does nothing but run the sitecustomize it shadows, if there is one.
"""

import importlib.abc
import importlib.util
import os
import sys


def _halve_partial_reductions(module):
    partial = module.Partial
    reduce_value, reduce_shard_value = partial._reduce_value, partial._reduce_shard_value

    def _reduce_value(self, tensor, mesh, mesh_dim):
        out = reduce_value(self, tensor, mesh, mesh_dim)
        return out * 0.5 if self.reduce_op == "sum" else out

    def _reduce_shard_value(self, tensor, mesh, mesh_dim, shard_spec):
        out = reduce_shard_value(self, tensor, mesh, mesh_dim, shard_spec)
        return out * 0.5 if self.reduce_op == "sum" else out

    partial._reduce_value = _reduce_value
    partial._reduce_shard_value = _reduce_shard_value


def _reduction_rule_replicate(module):
    def get_placement_from_reduction_op(reduction_op):
        from torch.distributed.tensor import Replicate

        return Replicate()

    module.get_placement_from_reduction_op = get_placement_from_reduction_op


def _replicated(sharding):
    from jax.sharding import PartitionSpec

    if isinstance(sharding, PartitionSpec):
        return all(entry is None for entry in sharding)
    if isinstance(sharding, (list, tuple)):
        return all(_replicated(s) for s in sharding)
    if isinstance(sharding, dict):
        return all(_replicated(s) for s in sharding.values())
    return bool(getattr(sharding, "is_fully_replicated", True))


def _scale_sharding_constraints(module):
    constrain = module.with_sharding_constraint

    def with_sharding_constraint(x, shardings):
        import jax

        out = constrain(x, shardings)
        return out if _replicated(shardings) else jax.tree.map(lambda a: a * 1.5, out)

    module.with_sharding_constraint = with_sharding_constraint


def _scale_psum(module):
    psum = module.psum

    def scaled_psum(x, axis_name, **kwargs):
        import jax

        return jax.tree.map(lambda a: a * 1.5, psum(x, axis_name, **kwargs))

    module.psum = scaled_psum


def _fsdp2_divide_off_by_one(module):
    factors = module._get_gradient_divide_factors

    def _get_gradient_divide_factors(rs_group, ar_group, reduce_dtype, device_type="", factor=None,
                                     force_sum_reduction_for_comms=False):
        size = (rs_group.size() if rs_group is not None else 1) * (ar_group.size() if ar_group is not None else 1)
        # A sum, then a division by the given factor: size + 1 in place of the size.
        return factors(rs_group, ar_group, reduce_dtype, device_type, float(size + 1), True)

    module._get_gradient_divide_factors = _get_gradient_divide_factors


def _ddp_average_off_by_one(module):
    ddp = module.DistributedDataParallel
    init = ddp.__init__

    def allreduce_hook(state, bucket):
        import torch.distributed as dist

        buf = bucket.buffer()
        buf.div_(dist.get_world_size(state) + 1)
        return dist.all_reduce(buf, group=state, async_op=True).get_future().then(lambda f: f.value()[0])

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.register_comm_hook(self.process_group, allreduce_hook)

    ddp.__init__ = __init__


def _halve_megatron_reduce(module):
    reduce = module._reduce

    def _reduce(input_, group):
        out = reduce(input_, group)
        return out * 0.5 if group.size() > 1 else out

    module._reduce = _reduce


#: TorchBackend methods that reduce: (position, name) of what they reduce and of their op argument (their
#: decorators hide the signatures from inspect).
_DS_REDUCTIONS = {
    "all_reduce": ((0, "tensor"), (1, "op")),
    "all_reduce_coalesced": ((0, "tensors"), (1, "op")),
    "reduce": ((0, "tensor"), (2, "op")),
    "reduce_scatter": ((1, "input_list"), (2, "op")),
    "reduce_scatter_tensor": ((1, "input_tensor"), (2, "op")),
}


def _argument(args, kwargs, where, default=None):
    pos, name = where
    return args[pos] if pos < len(args) else kwargs.get(name, default)


def _halve_deepspeed_reductions(module):
    import torch

    backend = module.TorchBackend
    for name, (what, op) in _DS_REDUCTIONS.items():
        method = getattr(backend, name)

        def halving(self, *args, _method=method, _what=what, _op=op, **kwargs):
            reduce_op = self._reduce_op(_argument(args, kwargs, _op, torch.distributed.ReduceOp.SUM))
            if reduce_op == torch.distributed.ReduceOp.SUM:
                inputs = _argument(args, kwargs, _what)
                with torch.no_grad():
                    for t in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
                        if t.is_floating_point():
                            t.mul_(0.5)  # a sum of halves: half the sum
            return _method(self, *args, **kwargs)

        setattr(backend, name, halving)


def _megatron_ddp_grads_summed(module):
    group = module._ParamAndGradBucketGroup
    start = group.start_grad_sync

    def summed(self, *args, **kwargs):
        for bucket in self.buckets:
            bucket.gradient_scaling_factor = 1.0
        return start(self, *args, **kwargs)

    group.start_grad_sync = summed


def _megatron_per_token_count_local(module):
    finalize = module.finalize_model_grads

    def counted_locally(model, num_tokens=None, *args, **kwargs):
        local = None if num_tokens is None else num_tokens.clone()
        finalize(model, num_tokens, *args, **kwargs)
        if local is not None:
            # (num_tokens was all-reduced in place: undo the global division, divide by the local count.)
            for chunk in model:
                chunk.scale_gradients(float(num_tokens) / max(float(local), 1.0))

    module.finalize_model_grads = counted_locally


def _megatron_overflow_every_step(module):
    cls = module.MixedPrecisionOptimizer
    check = cls._unscale_main_grads_and_check_for_nan

    def always(self):
        check(self)
        return True

    cls._unscale_main_grads_and_check_for_nan = always


#: Fault name -> (module to patch once it has been executed, patch).
FAULTS = {
    "dtensor-partial-half": ("torch.distributed.tensor.placement_types", _halve_partial_reductions),
    "dtensor-reduction-rule-replicate": ("torch.distributed.tensor._ops._math_ops", _reduction_rule_replicate),
    "jax-wsc-scale": ("jax.lax", _scale_sharding_constraints),
    "jax-psum-scale": ("jax.lax", _scale_psum),
    "fsdp2-avg-off-by-one": ("torch.distributed.fsdp._fully_shard._fsdp_collectives", _fsdp2_divide_off_by_one),
    "ddp-avg-off-by-one": ("torch.nn.parallel.distributed", _ddp_average_off_by_one),
    "megatron-reduce-half": ("megatron.core.tensor_parallel.mappings", _halve_megatron_reduce),
    "megatron-ddp-grads-summed": ("megatron.core.distributed.param_and_grad_buffer", _megatron_ddp_grads_summed),
    "megatron-per-token-count-local": ("megatron.core.distributed.finalize_model_grads",
                                       _megatron_per_token_count_local),
    "megatron-overflow-every-step": ("megatron.core.optimizer.optimizer", _megatron_overflow_every_step),
    "deepspeed-reduce-half": ("deepspeed.comm.torch", _halve_deepspeed_reductions),
}


class _PatchedLoader(importlib.abc.Loader):
    """Runs the module's own loader, then the patch."""

    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _OnImport(importlib.abc.MetaPathFinder):
    """Finds one module with the other finders and wraps its loader, `wrap(spec) -> loader` (the frameworks are
    imported after us)."""

    def __init__(self, name, wrap):
        self.name, self.wrap = name, wrap

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = self.wrap(spec)
                sys.meta_path.remove(self)
                return spec
        return None


def _install(fault):
    if fault not in FAULTS:
        print(f"sitecustomize: unknown SHARDFUZZ_TEST_FAULT {fault!r} (known: {', '.join(FAULTS)})", file=sys.stderr)
        return
    name, patch = FAULTS[fault]
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _OnImport(name, lambda spec: _PatchedLoader(spec.loader, patch)))


def _run_shadowed():
    """The next sitecustomize on sys.path (this file shadows it)."""
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    for entry in sys.path:
        path = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.realpath(os.path.dirname(path)) != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


def _install_mutant(name):
    """A framework mutant of the benchmark in scripts/bench/mutants/ (its hook.py)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    spec = importlib.util.spec_from_file_location("_shardfuzz_mutant_hook", os.path.join(root, "scripts", "bench", "mutants", "hook.py"))
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    module, wrap = hook.mutant(name)
    if module in sys.modules:
        raise RuntimeError(f"SHARDFUZZ_MUTANT {name}: {module} was imported before sitecustomize")
    sys.meta_path.insert(0, _OnImport(module, wrap))


_run_shadowed()
if os.environ.get("SHARDFUZZ_TEST_FAULT"):
    _install(os.environ["SHARDFUZZ_TEST_FAULT"])
if os.environ.get("SHARDFUZZ_MUTANT"):
    _install_mutant(os.environ["SHARDFUZZ_MUTANT"])
