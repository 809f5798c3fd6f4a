"""What differs between megatron-core releases, in one place, so that the megatron targets run unchanged against an
older release (`--python` pointing at another environment): config options a release may not have yet, the optimizer's parameter
groups, the MoE layer's spec, where a gradient sits in its bucket, the process groups a layout creates, the groups a
checkpoint's sharded tensors take. (The
generated repro scripts embed these functions and name the script itself `megatron_release`: their names must not
clash with the other worker functions a script embeds.)

An option the installed release lacks is left out where the case asks for what the release did before the option
existed (its `OPTIONS_OFF` value); a case that needs the option is `unsupported`, naming the release and the option.
Measured: megatron-core 0.15.3 lacks the first two options below, 0.13.1 all four; 0.19.2 has them all."""

import contextlib

#: Options newer than some supported release: {config class name: {option: the value that means "off"}}.
OPTIONS_OFF = {
    "TransformerConfig": {"moe_shared_expert_gate": False},
    "DistributedDataParallelConfig": {"reduce_scatter_with_fp32_accumulation": False},
    # (0.13.1: Adam is always AdamW; the distributed optimizer's overlapped gather is the DDP config's only)
    "OptimizerConfig": {"decoupled_weight_decay": True, "overlap_param_gather": False},
}


def installed_version():
    """The installed megatron-core release."""
    from importlib.metadata import version as installed

    return installed("megatron-core")


def config_class(name):
    """The installed release's config class `name`."""
    if name == "TransformerConfig":
        from megatron.core.transformer import TransformerConfig

        return TransformerConfig
    if name == "OptimizerConfig":
        from megatron.core.optimizer import OptimizerConfig

        return OptimizerConfig
    from megatron.core.distributed import DistributedDataParallelConfig

    assert name == "DistributedDataParallelConfig", name
    return DistributedDataParallelConfig


def fields_of(name):
    """The option names the installed release's config `name` has."""
    import dataclasses

    return {f.name for f in dataclasses.fields(config_class(name))}


def missing_options(name, kwargs):
    """The options of `kwargs` the installed release's config `name` lacks and the case needs ({option: value})."""
    fields = fields_of(name)
    off = OPTIONS_OFF.get(name, {})
    return {k: v for k, v in kwargs.items() if k not in fields and not (k in off and off[k] == v)}


def new_config(name, **kwargs):
    """The installed release's config `name` from `kwargs`, options it lacks left out where they are off. An option
    it lacks and the case needs reaching here is our error (raised here, in the worker's code: a harness error):
    `unsupported_options` refuses such cases beforehand."""
    needed = missing_options(name, kwargs)
    if needed:
        raise TypeError(f"megatron-core {installed_version()} has no {name}.{next(iter(needed))}; "
                        "the case was not refused")
    fields = fields_of(name)
    return config_class(name)(**{k: v for k, v in kwargs.items() if k in fields})


def unsupported_options(name, kwargs):
    """Why the installed release cannot run a case whose config `name` takes `kwargs` (None: it can)."""
    needed = missing_options(name, kwargs)
    if not needed:
        return None
    option, value = next(iter(needed.items()))
    return f"megatron-core {installed_version()} has no {name}.{option} (the case needs {value!r})"


def new_optimizer(config, chunks, overrides):
    """get_megatron_optimizer over the DDP `chunks`, its parameter groups as `overrides` says (None: megatron's
    default groups, no decay on biases and other vectors; {}: every parameter decayed). Releases before
    `config_overrides` (0.15.3) take a `no_weight_decay_cond` instead. No gloo groups (checkpoints only)."""
    import inspect

    from megatron.core.optimizer import get_megatron_optimizer

    kwargs = {"use_gloo_process_groups": False}
    if "config_overrides" in inspect.signature(get_megatron_optimizer).parameters:
        kwargs["config_overrides"] = overrides
    elif overrides is not None:
        assert overrides == {}, overrides
        kwargs["no_weight_decay_cond"] = lambda name, param: False
    return get_megatron_optimizer(config, chunks, **kwargs)


def replicated_sharded_tensors(state, prefix, tp_group, dp_cp_group):
    """megatron's `make_sharded_tensors_for_checkpoint` over a module's own tensors (replicated ones): 0.19.2 takes the
    tensor- and data-parallel groups, 0.15.3 reads them from parallel_state."""
    import inspect

    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    if "tp_group" in inspect.signature(make_sharded_tensors_for_checkpoint).parameters:
        return make_sharded_tensors_for_checkpoint(state, prefix, tp_group=tp_group, dp_cp_group=dp_cp_group)
    return make_sharded_tensors_for_checkpoint(state, prefix)


@contextlib.contextmanager
def in_process_checkpoint_writer():
    """A block in which megatron's distributed checkpoint writes its buckets in the rank's own process, one after
    the other: 0.15.3's writer forks a process per write bucket (`write_preloaded_data_multiproc`), which Python
    refuses in a daemonic process, as the rank pools' ranks are (Megatron-LM's ranks are torchrun's), and which,
    forked from a rank whose gloo threads hold locks, measured, hangs. Each bucket is written by the release's own
    `write_preloaded_data`, its results collected as the forked writer collects them. 0.19.2 writes from threads."""
    import queue

    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    if not hasattr(FileSystemWriterAsync, "write_preloaded_data_multiproc"):
        yield
        return

    def write_in_process(transform_list, use_msc, rank, write_buckets, global_results_queue):
        results, local, count = {}, queue.Queue(), queue.Queue()
        for i, bucket in enumerate(write_buckets):
            count.put(i)
            kwargs = {"use_msc": use_msc} if use_msc else {}
            FileSystemWriterAsync.write_preloaded_data(transform_list, i, bucket, local, count, True, **kwargs)
            i, out = local.get()
            if isinstance(out, Exception):
                results = out
                break
            results[i] = out
        global_results_queue.put(results)

    forking = FileSystemWriterAsync.__dict__["write_preloaded_data_multiproc"]
    FileSystemWriterAsync.write_preloaded_data_multiproc = staticmethod(write_in_process)
    try:
        yield
    finally:
        FileSystemWriterAsync.write_preloaded_data_multiproc = forking


def new_moe_layer(config, layer_number):
    """megatron's MoELayer without Transformer Engine, from its module spec: 0.19.2's spec builds the layer when
    called, 0.15.3's is a plain ModuleSpec that build_module instantiates."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import build_module

    spec = get_moe_module_spec(use_te=False, num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    if callable(spec):
        return spec(config=config, layer_number=layer_number)
    return build_module(spec, config=config, layer_number=layer_number)


def grad_offset(bucket, param):
    """Where `param`'s gradient starts in `bucket.grad_data` (elements): where its `main_grad` view of the buffer
    starts. Not `bucket.param_to_index`: 0.15.3 counts those offsets as if the bucket's parameters were packed end to
    end, while under the distributed optimizer the buffer pads each parameter's start (0.19.2 derives them from the
    buffer's index map). Measured: read through 0.15.3's offsets, every gradient but a bucket's first came back
    wrong under ZeRO 1 while the trained parameters and later losses matched the reference."""
    size = bucket.grad_data.element_size()
    start = (param.main_grad.data_ptr() - bucket.grad_data.data_ptr()) // size
    assert 0 <= start and start + param.numel() <= bucket.grad_data.numel(), (start, param.numel())
    return start


@contextlib.contextmanager
def new_groups():
    """The process groups created inside the block that this rank is a member of (a list, filled as
    torch.distributed.new_group returns them): what 0.19.2 also lists in `parallel_state._global_process_group_list`,
    which 0.13.1 does not have."""
    import torch.distributed as dist

    created, original = [], dist.new_group

    def new_group(*args, **kwargs):
        group = original(*args, **kwargs)
        if group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER:
            created.append(group)
        return group

    dist.new_group = new_group
    try:
        yield created
    finally:
        dist.new_group = original
