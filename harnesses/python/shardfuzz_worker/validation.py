"""Where each framework refuses a configuration up front: the table that tells `rejected` from `crash`.

A failure is classified by where it was raised, not by its type:
  * innermost relevant frame in our own package (shardfuzz_worker), or the failure never entered the
    framework, or it is a HarnessError: `harness_error` (our worker failed, the framework did not);
  * innermost framework frame in one of the target's validation locations below: `rejected`;
  * anywhere else in the framework (autograd, dispatch of a supported op, a collective): `crash`;
  * in our model's code (targets/*_model.py) while an activation checkpoint recomputes it in the backward (a
    RECOMPUTE frame outside it): `crash`. The same code ran on the forward's inputs moments before, so a
    recomputation that fails ran on what the checkpoint restored, not on what the forward had.

"Relevant" frames are our package's and the target's framework packages' (FRAMEWORKS); frames of the
standard library, numpy, pydantic and the like are skipped, so that pydantic raising for a DeepSpeed
config model counts where DeepSpeed built it, and numpy raising under our code counts as ours. Explicitly
chained exceptions (`raise ... from e`) are followed: a framework wrapper re-raising a refusal ("Sharding
propagation failed" around a view op's "Please redistribute") is still a refusal, and the root cause's
frame decides between harness_error and crash.

VALIDATION: target -> [(path fragment, function or None, message fragment or None)]. A fragment is a
substring of the file path (with "/" separators); the message fragment narrows a location that also raises
for other reasons.
"""

import functools
import importlib.util
import os
import traceback

_TORCH_DTENSOR = [
    # An op with no sharding strategy for these placements.
    ("torch/distributed/tensor/_sharding_prop.py", "propagate_op_sharding_non_cached",
     "does not have a sharding strategy registered"),
    # View / unbind rules asking the user to redistribute first.
    ("torch/distributed/tensor/_ops/", None, "Please redistribute"),
    ("torch/distributed/tensor/_dispatch.py", "as_strided_handler", None),
    ("torch/distributed/tensor/_dispatch.py", "default_tensor", "is not supported"),
    # An in-place op (often inside a decomposition: clamp_, digamma_, masked_fill_) on an argument whose
    # placement it would have to change: DTensor's explicit refusal.
    ("torch/distributed/tensor/", None, "in-place operations that require placement changes are not supported"),
    # An op (or its Python decomposition) that makes plain tensors of its own and mixes them in.
    # (Raised from C++ dispatch: the innermost Python frame is wherever the op was called.)
    ("torch/", None, "got mixed torch.Tensor and DTensor"),
    # The tensor-parallel convolution's own check of what it supports (dilation 1, stride 1 with padding, ...).
    ("torch/distributed/tensor/_tp_conv.py", "_is_supported", None),
    # Before torch 2.5 the same checks, where DTensor then lived (torch_release.py).
    ("torch/distributed/_tensor/_sharding_prop.py", "propagate_op_sharding_non_cached",
     "does not have a sharding strategy registered"),
    ("torch/distributed/_tensor/ops/", None, "Please redistribute"),
    ("torch/distributed/_tensor/_dispatch.py", "default_tensor", "is not supported"),
    ("torch/distributed/_tensor/_tp_conv.py", "_is_supported", None),
    # torch 2.4's split rule refusing a Partial input ("splitting distributed tensor with Partial placement is not
    # implemented!"; 2.5 and later split it).
    ("torch/distributed/_tensor/ops/tensor_ops.py", "split_rule", "is not implemented"),
    # The gloo backend's refusal of a reduction it does not implement (a Partial(avg) reduced through it: gloo
    # raises before any communication on torch 2.4.1 and 2.5.1; 2.15's gloo averages). Raised from C++: the
    # innermost Python frame is wherever the collective was called.
    ("torch/", None, "Cannot use ReduceOp.AVG with Gloo"),
]

_JAX = [
    # shard_map's in_specs check of the argument shapes (jax.experimental.shard_map before jax 0.7).
    ("jax/_src/shard_map.py", "_check_specs_vs_args", "evenly divisible"),
    ("jax/experimental/shard_map.py", "_check_specs_vs_args", "evenly divisible"),
    # jit / device_put refusing an uneven NamedSharding.
    ("jax/_src/pjit.py", "pjit_check_aval_sharding", "evenly divide"),
    ("jax/_src/sharding.py", "_common_shard_shape", "evenly divide"),
    ("jax/_src/core.py", "_check_divisibility", "evenly divide"),
]

_COLOSSALAI = [
    # from_native_module: a width not a multiple of the tensor-parallel size.
    ("colossalai/shardformer/layer/linear.py", "from_native_module", "integer multiples of tensor parallel size"),
    ("colossalai/shardformer/layer/embedding.py", "from_native_module", "integer multiples of tensor parallel size"),
    # Sequence split / reduce-scatter of a sequence not a multiple of the group size (explicit assertions).
    ("colossalai/shardformer/layer/_operation.py", None, "is not a multiple of"),
    # The plugins' and ShardConfig's argument checks.
    ("colossalai/booster/plugin/low_level_zero_plugin.py", "__init__", None),
    ("colossalai/booster/plugin/hybrid_parallel_plugin.py", "__init__", None),
    ("colossalai/booster/plugin/hybrid_parallel_plugin.py", "configure", "Please set precision"),
    ("colossalai/shardformer/shard/shard_config.py", "__post_init__", None),
    # The sharder re-raising a layer's refusal ("Failed to replace ... not integer multiples of tensor parallel size").
    ("colossalai/shardformer/shard/sharder.py", "_replace_sub_module", "integer multiples of tensor parallel size"),
    # Shardformer policies' divisibility assertions (heads by tp, ...).
    ("colossalai/shardformer/policies/llama.py", "module_policy", "divisible"),
    ("colossalai/shardformer/policies/gpt2.py", "module_policy", "divisible"),
    # (the same assertions in the Mistral, Qwen2 and OPT policies, for cases whose model.hf_model names them; campaigns
    # 323 and 324 read them as crashes)
    ("colossalai/shardformer/policies/mistral.py", "module_policy", "divisible"),
    ("colossalai/shardformer/policies/qwen2.py", "module_policy", "divisible"),
    ("colossalai/shardformer/policies/opt.py", "module_policy", "divisible"),
    # (and the Falcon policy's, since the fourteenth session's `model.hf_model: falcon`; campaign 329 read it as a crash)
    ("colossalai/shardformer/policies/falcon.py", "module_policy", "divisible"),
    # (and the Command policy's, since the fifteenth session's `model.hf_model: command`)
    ("colossalai/shardformer/policies/command.py", "module_policy", "divisible"),
    # GPT-2's policy refuses all_to_all sequence parallelism.
    ("colossalai/shardformer/policies/gpt2.py", "module_policy", "not supported for GPT2"),
    # The pipeline schedule's checks of a batch: equal micro-batches, at least as many as stages.
    ("colossalai/pipeline/schedule/one_f_one_b.py", "load_batch", None),
    # (interleaved: also micro-batches a multiple of the stages)
    ("colossalai/pipeline/schedule/interleaved_pp.py", "load_batch", None),
]

_COLOSSALAI_MOE = _COLOSSALAI + [
    # MoeHybridParallelPlugin's argument checks (degrees, ZeRO stage, pipeline style) and its configure()'s refusal of
    # ZeRO in fp32.
    ("colossalai/booster/plugin/moe_hybrid_parallel_plugin.py", "__init__", None),
    ("colossalai/booster/plugin/moe_hybrid_parallel_plugin.py", "configure", "Please set precision"),
    # Mixtral's policy's divisibility assertions (heads and key/value heads by tp), and its refusal of sequence
    # parallelism beside a pipeline.
    ("colossalai/shardformer/policies/mixtral.py", "module_policy", "divisible"),
    ("colossalai/shardformer/policies/mixtral.py", "module_policy", "not supported with pipeline parallelism"),
    # The expert-parallel MoE block's check that the experts divide over the ep ranks, raised there or, once the
    # policy replaces the block, re-raised by the sharder ("Failed to replace block_sparse_moe ... with the exception:
    # The number of experts must be divisible by the number of expert parallel groups", campaign 318).
    ("colossalai/shardformer/modeling/mixtral.py", "setup_process_groups", "must be divisible"),
    ("colossalai/shardformer/shard/sharder.py", "_replace_sub_module", "experts must be divisible by the number of expert"),
]

_MEGATRON_DIVISIBILITY = [
    # `divide` / `ensure_divisibility`: heads, widths and vocabulary per tensor-parallel rank, blocks per stage.
    ("megatron/core/utils.py", "ensure_divisibility", None),
    # The interleaved schedule's checks of the micro-batch count against the stages ("The number of contiguous
    # micro-batches in a virtual pipeline stage should range in [PP, M]", "The remainder of M ...").
    ("megatron/core/pipeline_parallel/schedules.py", "forward_backward_pipelining_with_interleaving", "micro-batches"),
    ("megatron/core/parallel_state.py", "initialize_model_parallel", None),
    # MoELayer's refusal, at its first forward, of tensor parallelism without sequence parallelism in training
    # ("During training, performance may degrade if MoE and tensor parallelism are enabled without also enabling
    # sequence parallelism").
    ("megatron/core/transformer/moe/moe_layer.py", "forward", "without also enabling sequence parallelism"),
    # Its checks of the experts against the expert-parallel ranks (`num_moe_experts % ep_size == 0`).
    ("megatron/core/transformer/moe/moe_layer.py", "__init__", None),
]

_MEGATRON_TRAINING = [
    # Its configs' own checks (dataclass __post_init__) and the optimizer factory's refusals of combinations.
    ("megatron/core/distributed/distributed_data_parallel_config.py", "__post_init__", None),
    ("megatron/core/optimizer/optimizer_config.py", "__post_init__", None),
    ("megatron/core/transformer/transformer_config.py", "__post_init__", None),
    ("megatron/core/model_parallel_config.py", "__post_init__", None),
    # The distributed optimizer's refusal of an optimizer it cannot shard ("Only Adam, HybridDeviceOptimizer, and
    # optimizers with an init_state_fn (e.g., Lion) are currently supported").
    ("megatron/core/optimizer/distrib_optimizer.py", "__init__", "currently supported"),
]

#: DTensor's refusal of a fused optimizer kernel it has no sharding strategy for (torch 2.15 registers `_fused_adam_`
#: and `_fused_adamw_`, not `_fused_sgd_`): `fused=True` over DTensor parameters, which the user fixes with
#: `foreach=True` (train.optimizer.implementation).
_DTENSOR_FUSED_OPTIMIZER = [
    ("torch/distributed/tensor/_sharding_prop.py", "propagate_op_sharding_non_cached", "Operator aten._fused_"),
]

#: DeepSpeed's own checks of a configuration (deepspeed-zero, deepspeed-pp).
_DEEPSPEED = [
    # The JSON config and its pydantic models (DeepSpeedConfigError, asserts, ValidationError).
    ("deepspeed/runtime/config.py", None, None),
    ("deepspeed/runtime/config_utils.py", None, None),
    ("deepspeed/runtime/zero/config.py", None, None),
    # The engine's checks of the config against the accelerator ("Type fp16 is not supported ...").
    ("deepspeed/runtime/engine.py", "_do_sanity_check", None),
    ("deepspeed/runtime/engine.py", "_do_args_sanity_check", None),
    # Its check of the optimizer against the data types ("unsupported mix of model_dtype=... and
    # grad_accum_dtype=...").
    ("deepspeed/runtime/engine.py", "_do_optimizer_sanity_check", None),
    # The ZeRO optimizers' refusals of option combinations ("gradient_predivide_factor != 1.0 is not yet
    # supported with ZeRO-2 with reduce scatter enabled").
    ("deepspeed/runtime/zero/stage_1_and_2.py", "__init__", "is not yet supported"),
    ("deepspeed/runtime/zero/stage3.py", "__init__", "is not yet supported"),
    # With MoE layers: ZeRO 1-2's refusal of options "not tested with MoE" (reduce scatter and, at stage 2,
    # contiguous gradients off), and the engine's of ZeRO-3 ("Native DeepSpeed MoE is not supported with ZeRO
    # Stage 3").
    ("deepspeed/runtime/zero/stage_1_and_2.py", "_configure_moe_settings", "must be set to True for MoE"),
    ("deepspeed/runtime/engine.py", "_validate_zero3_moe_compatibility", None),
    # (releases up to 0.19.0: the same refusal as an assertion where the engine builds the ZeRO-3 optimizer)
    ("deepspeed/runtime/engine.py", "_configure_zero_optimizer", "MoE not supported with Stage 3"),
    # The MoE layer's check of its arguments ("Number of experts (1) should be divisible by expert parallel size
    # (2)").
    ("deepspeed/moe/layer.py", "__init__", "should be divisible by"),
    # Its gate's refusal of a k it does not implement (0.14: "Only top-1 and top-2 gatings are
    # supported").
    ("deepspeed/moe/sharded_moe.py", "__init__", "gatings are supported"),
    # DeepSpeed-Ulysses' checks of the heads against the sequence-parallel ranks at its first all-to-all ("Number of
    # key-value heads (2) must be at least the sequence parallel size (4)"; "Number of heads ... must be divisible by
    # the sequence parallel size").
    ("deepspeed/sequence/layer.py", "_resolve_kv_heads", "must be at least the sequence parallel size"),
    ("deepspeed/sequence/layer.py", "_generate_layout_params", "must be divisible by the sequence parallel size"),
    # AutoEP's checks of its section against the model and the other degrees ("AutoEP+AutoTP folding requires
    # expert_parallel.autoep_size > 1"; "num_experts=3 must be divisible by autoep_size=2").
    ("deepspeed/module_inject/auto_ep_config.py", "validate_autoep_config", None),
    ("deepspeed/module_inject/auto_ep_config.py", "validate_autoep_post_detection", None),
    ("deepspeed/module_inject/auto_ep_folding.py", "build_folding_spec", None),
    ("deepspeed/module_inject/auto_ep_folding.py", "validate_folding_global", None),
    # AutoTP's check that a vocabulary-parallel head leaves every tensor-parallel rank some rows (campaign 303: vocab 3
    # over tp 4, "vocab_parallel_lm_head requires nonempty vocabulary shards").
    ("deepspeed/module_inject/auto_tp.py", "_validate_vocab_parallel_layer", None),
]

#: Its pipeline engine's: PipelineModule's partitioning and grid, the engine's and DualPipeV's asserts on the config
#: ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", "DualPipeV needs gradient_accumulation_steps >= 2 *
#: stages"), the DualPipeV schedule's micro-batch check.
_DEEPSPEED_PIPELINE = [
    ("deepspeed/runtime/pipe/module.py", "__init__", None),
    ("deepspeed/runtime/pipe/module.py", "_partition_layers", None),
    ("deepspeed/runtime/pipe/engine.py", "__init__", None),
    ("deepspeed/runtime/pipe/dualpipev.py", "__init__", None),
    ("deepspeed/runtime/pipe/schedule.py", "__init__", "micro-batches"),
]


VALIDATION = {
    "torch-dtensor": _TORCH_DTENSOR,
    "torch-tp": [
        # (DTensor's "Please redistribute" from inside a parallelized module is a crash: no user call to fix.)
        ("torch/distributed/tensor/parallel/api.py", "parallelize_module", None),
        ("torch/distributed/tensor/parallel/style.py", "_apply", "currently only support"),
        ("torch/distributed/tensor/parallel/loss.py", "_find_all_reduce_mesh_dim", None),
        ("torch/distributed/tensor/parallel/loss.py", None, "is only supported on one-dimensional DeviceMesh"),
    ] + _DTENSOR_FUSED_OPTIMIZER,
    "torch-fsdp2": [
        ("torch/distributed/fsdp/_fully_shard/_fully_shard.py", "fully_shard", None),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_init.py", "_validate_module", None),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_init.py", "_validate_mesh", None),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_init.py", "_get_post_forward_mesh_info", None),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_init.py", "_verify_managed_param", None),
    ] + _DTENSOR_FUSED_OPTIMIZER,
    "torch-fsdp1": [
        # The constructor's and its initialisation's checks of its arguments and of the module.
        ("torch/distributed/fsdp/fully_sharded_data_parallel.py", "__init__", None),
        ("torch/distributed/fsdp/_init_utils.py", None, None),
        # Flat parameters (use_orig_params=False) refuse a unit mixing frozen and trainable parameters ("Must flatten
        # tensors with uniform `requires_grad` when `use_orig_params=False`").
        ("torch/distributed/fsdp/_flat_param.py", "_validate_tensors_to_flatten", None),
        # Dynamo's check that an FSDP1 module it compiles keeps its original parameters (torch 2.5.1 asserts it;
        # torch 2.15 graph-breaks there and runs the module eagerly): flat parameters are not compiled.
        ("torch/_dynamo/variables/builder.py", None, "Dynamo only supports FSDP with use_orig_params=True"),
    ],
    "torch-ddp": [
        # The constructor's argument checks (raised through `_log_and_throw`, see THROW_HELPERS).
        ("torch/nn/parallel/distributed.py", "__init__", None),
        # ZeroRedundancyOptimizer's checks of the parameters it is given (ZeRO 1).
        ("torch/distributed/optim/zero_redundancy_optimizer.py", "_verify_and_init_params", None),
        ("torch/distributed/optim/zero_redundancy_optimizer.py", "_verify_same_dense_param_type", None),
    ],
    "torch-pp": [
        # The schedules' and stages' checks of their arguments (micro-batch counts the schedule cannot order, stages
        # it cannot place), and the wrappers' own, as for torch-fsdp2 and torch-ddp.
        ("torch/distributed/pipelining/schedules.py", "__init__", None),
        ("torch/distributed/pipelining/stage.py", "__init__", None),
        ("torch/distributed/fsdp/_fully_shard/_fully_shard.py", "fully_shard", None),
        ("torch/nn/parallel/distributed.py", "__init__", None),
        # A re-entrant activation checkpoint's refusal of the input-only gradients the stages take
        # (`torch.autograd.grad`, `backward(inputs=...)`): "When use_reentrant=True, torch.utils.checkpoint is
        # incompatible with .grad() or passing an `inputs` parameter to .backward()".
        ("torch/utils/checkpoint.py", "backward", "is incompatible with .grad()"),
        # The zero-bubble and DualPipeV schedules' refusal of compiled stage modules ("The ScheduleZBVZeroBubble
        # schedule is not supported with stage modules that have used torch.compile"): they split each backward into
        # input and weight gradients, which a compiled graph's backward does not.
        ("torch/distributed/pipelining/schedules.py", "_check_torch_compile_compatibility", None),
    ] + _DTENSOR_FUSED_OPTIMIZER,
    "jax-gspmd": _JAX,
    "jax-shardmap": _JAX,
    "deepspeed-zero": _DEEPSPEED,
    "deepspeed-pp": _DEEPSPEED + _DEEPSPEED_PIPELINE,
    "megatron-tp": _MEGATRON_DIVISIBILITY + _MEGATRON_TRAINING,
    "megatron-ddp": _MEGATRON_TRAINING,
    "colossalai-tp": _COLOSSALAI,
    "colossalai-zero": _COLOSSALAI,
    "colossalai-hybrid": _COLOSSALAI,
    "colossalai-moe": _COLOSSALAI_MOE,
}

#: Path fragments of locations that only older releases have (DTensor under torch/distributed/_tensor/ before torch
#: 2.5, shard_map's checks in jax/experimental/shard_map.py before jax 0.7): the table test checks them only where the
#: installed release still has them (checked by hand on torch 2.4.1 and jax 0.4.38).
FORMER_LOCATIONS = ("torch/distributed/_tensor/", "jax/experimental/shard_map.py")

#: Top-level packages whose frames count as the framework's, per target.
FRAMEWORKS = {
    "torch-dtensor": ("torch",),
    "torch-tp": ("torch",),
    "torch-fsdp2": ("torch",),
    "torch-ddp": ("torch",),
    "torch-fsdp1": ("torch",),
    "torch-pp": ("torch",),
    "jax-gspmd": ("jax", "jaxlib"),
    "jax-shardmap": ("jax", "jaxlib"),
    "deepspeed-zero": ("deepspeed", "torch"),
    "deepspeed-pp": ("deepspeed", "torch"),
    "megatron-tp": ("megatron", "torch"),
    "megatron-ddp": ("megatron", "torch"),
    "colossalai-tp": ("colossalai", "torch"),
    "colossalai-zero": ("colossalai", "torch"),
    "colossalai-hybrid": ("colossalai", "torch", "transformers"),
    "colossalai-moe": ("colossalai", "torch", "transformers"),
}

#: Exception types that are a refusal wherever they are raised, per target: DTensor propagates shardings
#: on fake tensors, which cannot run an op whose output shape or value depends on the data (nonzero,
#: unique, allclose).
REFUSAL_TYPES = {
    "torch-dtensor": ("DataDependentOutputException", "DynamicOutputShapeException"),
}

#: Framework functions that only raise what their caller asks for: the caller is the site.
THROW_HELPERS = ("_log_and_throw",)
#: Attribute lookups (`torch.nn.Module.__getattr__` and the like) raising AttributeError: the attribute the caller
#: asked for is missing, so the caller is the site (our code reading a name a release lacks is a harness error, a
#: framework reading one is a crash).
ATTRIBUTE_LOOKUPS = ("__getattr__", "__getattribute__")

#: Where activation checkpoints recompute a checkpointed function in the backward: (path fragment, functions).
RECOMPUTE = (
    ("torch/utils/checkpoint.py", ("backward", "unpack_hook", "unpack_hook_with_error_cb", "recompute_fn")),
    ("deepspeed/runtime/activation_checkpointing/checkpointing.py", ("backward", "checkpoint_unpack")),
    ("megatron/core/tensor_parallel/random.py", ("backward",)),
)

#: Our functions that only hand a framework's own object to the framework's native code, with arguments
#: derived from that object alone (a view of an op's output DTensor: `reshape(-1)`, `transpose(0, n - 1)`).
#: Native code leaves no Python frame, so an exception it raises directly under one of them (the frame is
#: the traceback's innermost) is the framework's: its object was inconsistent, not our call.
#: megatron_common.cuda_on_cpu's mode re-dispatches every torch call megatron makes (a CUDA device turned into the
#: CPU), so an error native code raises under it is the framework's call's.
#: torch_dtensor.seed_backward reshapes the case's cotangent to the framework's gathered output: a size that cannot
#: hold it is that output's size being wrong.
NATIVE_CALLERS = (("shardfuzz_worker/targets/torch_opinfo.py", "viewed"),
                  ("shardfuzz_worker/targets/torch_dtensor.py", "seed_backward"),
                  ("shardfuzz_worker/targets/megatron_common.py", "__torch_function__"))

_OURS = os.path.dirname(os.path.realpath(__file__)) + os.sep
_ROOTS = {}


def describe(e):
    """A failure as the rank sends it: type, message, formatted traceback, and the chain of explicitly
    chained exceptions (outermost first), each with its frames (file, line, function), innermost last."""
    chain, seen = [], set()
    link = e
    while link is not None and id(link) not in seen and len(chain) < 8:
        seen.add(id(link))
        frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(link.__traceback__)]
        chain.append({"type": type(link).__name__, "message": str(link)[:2000], "frames": frames})
        link = link.__cause__
    return {
        "type": type(e).__name__,
        "module": type(e).__module__,
        "message": str(e)[:2000],
        "traceback": "".join(traceback.format_exception(e))[-4000:],
        "chain": chain,
    }


def package_roots(target):
    """Directories of the target's framework packages (found without importing them)."""
    if target not in _ROOTS:
        roots = []
        for pkg in FRAMEWORKS.get(target, ()):
            spec = importlib.util.find_spec(pkg)
            for loc in (spec.submodule_search_locations or []) if spec else []:
                roots.append(os.path.realpath(loc) + os.sep)
        _ROOTS[target] = tuple(roots)
    return _ROOTS[target]


@functools.lru_cache(maxsize=4096)
def _real(filename):
    return os.path.realpath(filename)


def owner(filename, roots):
    """'ours', 'framework' or None (anything else: the standard library, numpy, pydantic, ...)."""
    path = _real(filename)
    if path.startswith(_OURS):
        return "ours"
    if path.startswith(roots):
        return "framework"
    return None


def site(frames, roots, error_type=None):
    """The innermost frame that is ours or the framework's (throw helpers, and attribute lookups raising
    AttributeError, skipped), with its owner; a NATIVE_CALLERS frame at the very bottom counts as the framework's."""
    if frames and is_native_caller(frames[-1]):
        return "framework", frames[-1]
    skip = THROW_HELPERS + (ATTRIBUTE_LOOKUPS if error_type == "AttributeError" else ())
    for frame in reversed(frames):
        who = owner(frame[0], roots)
        if who == "framework" and frame[2] in skip:
            continue
        if who:
            return who, frame
    return None, None


def is_native_caller(frame):
    path = _real(frame[0])
    if not path.startswith(_OURS):
        return False
    ours = "shardfuzz_worker/" + path[len(_OURS):].replace(os.sep, "/")
    return (ours, frame[2]) in NATIVE_CALLERS


def is_validation(target, frame, message):
    path = frame[0].replace(os.sep, "/")
    for fragment, function, text in VALIDATION.get(target, ()):
        if fragment in path and function in (None, frame[2]) and (text is None or text in message):
            return True
    return False


def short(frame):
    """`torch/distributed/x.py:12 in f`; our own files keep their `shardfuzz_worker/` prefix."""
    path = frame[0].replace(os.sep, "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    if "/shardfuzz_worker/" in path:
        path = "shardfuzz_worker/" + path.split("/shardfuzz_worker/", 1)[1]
    return f"{path}:{frame[1]} in {frame[2]}"


# Causes that are not raised where they name: JAX attaches the stack at which a traced operation was written
# (our code, usually) as the cause of an error raised later while JAX transforms it (a transpose rule, lowering).
TRACE_TIME_CAUSES = ("JaxStackTraceBeforeTransformation",)


def causes(failure):
    """The failure's explicitly chained exceptions, outermost first (JAX's trace-time stacks left out)."""
    return [link for link in failure.get("chain") or [] if link["type"] not in TRACE_TIME_CAUSES]


def classify(target, failure):
    """('rejected' | 'crash' | 'harness_error', the deciding frame or None) for one rank's failure."""
    chain = causes(failure)
    if not chain:
        return "crash", None
    roots = package_roots(target)
    if chain[0]["type"] == "HarnessError":
        return "harness_error", site(chain[0]["frames"], roots)[1]
    for link in chain:
        who, frame = site(link["frames"], roots, link["type"])
        if who == "framework" and (is_validation(target, frame, link["message"]) or link["type"] in REFUSAL_TYPES.get(target, ())):
            return "rejected", frame
    who, frame = site(chain[-1]["frames"], roots, chain[-1]["type"])
    if who == "ours" and is_model_code(frame) and (recompute := recomputing(chain[-1]["frames"])) is not None:
        return "crash", recompute
    if who != "framework":
        return "harness_error", frame
    return "crash", frame


def is_model_code(frame):
    """Whether a frame of ours is in a model definition (targets/torch_model.py, megatron_model.py, ...)."""
    path = frame[0].replace(os.sep, "/")
    return "/targets/" in path and path.endswith("_model.py")


def recomputing(frames):
    """The innermost RECOMPUTE frame (an activation checkpoint recomputing in the backward), or None."""
    for frame in reversed(frames):
        path = frame[0].replace(os.sep, "/")
        if any(fragment in path and frame[2] in functions for fragment, functions in RECOMPUTE):
            return frame
    return None
