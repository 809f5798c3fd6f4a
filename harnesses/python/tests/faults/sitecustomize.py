"""Test-only framework faults, to prove that the fuzzer and its repro scripts detect a real framework bug.

Put this folder on PYTHONPATH and set SHARDFUZZ_TEST_FAULT; every Python process started with that environment
(the worker, its ranks, a repro script and torchrun's workers) patches the framework as it is imported:

  dtensor-partial-half  torch DTensor's Partial reduction (Partial._reduce_value, Partial._reduce_shard_value:
                        all-reduce, reduce-scatter) returns half the sum.
  jax-wsc-scale         jax.lax.with_sharding_constraint multiplies its input by 1.5 when the sharding it asks
                        for is not fully replicated.

Without SHARDFUZZ_TEST_FAULT this does nothing but run the sitecustomize it shadows, if there is one.
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


#: Fault name -> (module to patch once it has been executed, patch).
FAULTS = {
    "dtensor-partial-half": ("torch.distributed.tensor.placement_types", _halve_partial_reductions),
    "jax-wsc-scale": ("jax.lax", _scale_sharding_constraints),
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


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds one module with the other finders and wraps its loader (the frameworks are imported after us)."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchedLoader(spec.loader, self.patch)
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
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


def _run_shadowed():
    """The next sitecustomize on sys.path (this file shadows it)."""
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    for entry in sys.path:
        path = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.realpath(os.path.dirname(path)) != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_run_shadowed()
if os.environ.get("SHARDFUZZ_TEST_FAULT"):
    _install(os.environ["SHARDFUZZ_TEST_FAULT"])
