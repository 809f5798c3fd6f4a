"""Shared by the torch-based targets: process group, dtypes, meshes, versions."""

import contextlib
import datetime
import os

from ..lifetime import orphan_dir_prefix, remove_orphan_dirs
from . import torch_release
from .base import Target

_MESHES = {}


def torch_dtype(name):
    import torch

    return {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]


def skip_absent_device_seeding():
    """`torch.manual_seed` also queues a seed for each accelerator not initialised yet, with a formatted
    stack trace of the call (`torch.cuda._lazy_call`): most of a cheap op case's time, since OpInfo seeds
    every sample it draws. Seeding a device that does not exist here changes nothing: it is skipped."""
    import torch

    for name in ("cuda", "xpu", "mtia"):
        device = getattr(torch, name, None)
        if device is not None and hasattr(device, "manual_seed_all") and not device.is_available():
            device.manual_seed_all = lambda seed: None


class TorchTarget(Target):
    coverage_prefixes = ()

    def __init__(self):
        import torch

        # Imported once here, before ranks are forked, instead of in every rank of every new pool.
        import torch.distributed.device_mesh  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        import torch.distributed.tensor  # noqa: F401
        import torch.distributed.tensor.parallel  # noqa: F401
        import torch.nn.parallel  # noqa: F401

        torch_release.public_dtensor()
        skip_absent_device_seeding()
        root = os.path.dirname(torch.__file__)
        self.coverage_prefixes = (os.path.join(root, "distributed") + os.sep, os.path.join(root, "nn", "parallel") + os.sep)

    def versions(self):
        import torch

        return {"torch": torch.__version__.split("+")[0], "backend": "gloo"}

    def init_rank(self, rank, world, timeout_s):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        skip_absent_device_seeding()
        torch.use_deterministic_algorithms(True, warn_only=True)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        from .. import known_fixes

        known_fixes.apply(self.name)


def mesh(shape, names):
    """A cached DeviceMesh over all ranks (meshes and their groups are created once per shape)."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (tuple(shape), tuple(names))
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))
    return _MESHES[key]


def compiled(case, module):
    """`module` under torch.compile where the case's `train.compiled` asks for it (backend aot_eager: Dynamo's graph
    capture and AOTAutograd's joint graphs, run by the eager kernels), else `module` itself. Call compiling() once per
    run first."""
    import torch

    return torch.compile(module, backend="aot_eager") if case["train"].get("compiled") else module


def compiling(case):
    """Dynamo's caches cleared where the case compiles: each case compiles afresh, and a worker that runs many never
    reaches the recompile limit past which Dynamo would run its code eagerly, silently."""
    if case["train"].get("compiled"):
        import torch

        torch._dynamo.reset()


def check_compiled(case):
    """Where the case compiles, that Dynamo captured a graph this run: a compiled run that captured none ran eagerly,
    which is our harness's failure to test what the case asks (HarnessError), not a pass."""
    if case["train"].get("compiled"):
        from torch._dynamo.utils import counters

        from .base import HarnessError

        if not counters["stats"]["unique_graphs"]:
            raise HarnessError("the case asks for torch.compile, but Dynamo captured no graph: the run was eager")


def compile_blocks(case, model):
    """Each block of the case's model under `compiled`, in place (as torchtitan compiles its transformer blocks, after
    parallelising them and before fully_shard); the blocks' parameter names gain `_orig_mod.` (uncompiled_name)."""
    if case["train"].get("compiled"):
        for i, block in enumerate(model.layers):
            model.layers[i] = compiled(case, block)


def unsupported_compiled_blocks(case, name):
    """Why target `name`, which compiles the model's blocks, cannot compile the case's model (it has none), or None."""
    if case["train"].get("compiled") and not case["model"].get("layers"):
        return f"{name} compiles the model's blocks (as torchtitan): a model without blocks has none to compile"
    return None


def uncompiled_name(name):
    """A parameter's name without the `_orig_mod.` a compiled module (torch.compile's OptimizedModule) adds."""
    return name.replace("._orig_mod.", ".")


def to_numpy(t):
    import torch

    return t.detach().to(torch.float64, copy=True).cpu().numpy()


@contextlib.contextmanager
def shared_tempdir(read_by_rank0_only=False):
    """A fresh directory every rank of the default group sees (rank 0 makes it, in memory-backed /dev/shm where
    there is one, and removes it once every rank is done; `read_by_rank0_only`: once it is, without waiting for the
    others, who do not read it). A rank that raises inside leaves at once (its peers may
    be anywhere: a barrier could pair with one of theirs); what such runs leave, or a killed process's, is removed
    by rank 0's next call (the directory names the process that made it)."""
    import shutil
    import tempfile

    import torch.distributed as dist

    rank0 = dist.get_rank() == 0
    where = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    if rank0:
        remove_orphan_dirs(where, "shardfuzz-ckpt", mine=True)
    path = [tempfile.mkdtemp(prefix=orphan_dir_prefix("shardfuzz-ckpt"), dir=where) if rank0 else None]
    dist.broadcast_object_list(path, src=0)
    yield path[0]
    if not read_by_rank0_only:
        dist.barrier()
    if rank0:
        shutil.rmtree(path[0], ignore_errors=True)


class _Done:
    """The handle of a collective that already completed (the shims run synchronously)."""

    def wait(self, *_args, **_kwargs):
        return True

    def is_completed(self):
        return True


def _reduce_scatter_list(output, input_list, op=None, group=None, async_op=False):
    """List-form reduce_scatter over an all_reduce of the concatenated chunks (gloo has none; NCCL, which
    Colossal-AI and megatron count on, takes pieces of any size)."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([t.reshape(-1) for t in input_list])
    dist.all_reduce(flat, op=op if op is not None else dist.ReduceOp.SUM, group=group)
    rank = dist.get_rank(group)
    start = sum(t.numel() for t in input_list[:rank])
    output.copy_(flat[start:start + input_list[rank].numel()].view_as(output))
    return _Done() if async_op else None
