"""Fixes of known framework bugs, applied only on request: the test suite's baseline of known findings.

A divergence the fuzzer reports is a *known* finding when the same case passes once the fix of a bug already
reported (docs/findings/, listed in the README) is applied; anything else stays a new finding (or, in the test
suite, a false positive). `SHARDFUZZ_KNOWN_FIXES=name,name` makes every rank apply those fixes at start-up.
Each fix is the smallest correct change, written against the released code it patches.
"""

import os

ENV = "SHARDFUZZ_KNOWN_FIXES"


def _colossalai_row_bias_sp():
    """Colossal-AI 0.5.0: Linear1D_Row adds its bias to the reduce-scattered (sequence-chunk) output under
    split_gather / ring sequence parallelism, but leaves the bias unmarked, so its partial gradient is never
    all-reduced (docs/findings/colossalai-0.5.0-row-bias-grad-sequence-parallel.py). Fix: mark it."""
    from colossalai.shardformer.layer import GPT2FusedLinearConv1D_Row, Linear1D_Row
    from colossalai.shardformer.layer.utils import SeqParallelUtils, is_share_sp_tp

    for cls in (Linear1D_Row, GPT2FusedLinearConv1D_Row):  # (GPT-2's row-parallel Conv1D has the same code)
        original = cls.__init__

        def init(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            if self.bias is not None and is_share_sp_tp(self.seq_parallel_mode):
                SeqParallelUtils.marked_as_sp_partial_derived_param(self.bias)

        cls.__init__ = init


def _colossalai_ring_gather():
    """Colossal-AI 0.5.0: _ring_as_gather saves `send_tensors` instead of the received chunk in its final
    round, so ring mode's gathered input (and the column linear's weight gradient) is wrong
    (docs/findings/colossalai-0.5.0-ring-sp-column-weight-grad.py). Fix: the gathered input by all_gather."""
    from colossalai.shardformer.layer import _operation

    original = _operation._ring_as_gather

    def ring_as_gather(func, input_to_gather=None, input_local=None, process_group=None, gather_dim=1, keep_item=False):
        output, _ = original(func, input_to_gather=input_to_gather, input_local=input_local,
                             process_group=process_group, gather_dim=gather_dim, keep_item=keep_item)
        gathered = {k: _operation._gather(v, gather_dim, process_group) for k, v in input_to_gather.items()}
        return output, gathered

    _operation._ring_as_gather = ring_as_gather


def _colossalai_narrow_linear_sp():
    """Colossal-AI 0.5.0: from_native_module keeps a linear narrower than tp as the native layer; under
    split_gather / ring sequence parallelism it runs on the sequence chunk and its gradients stay partial
    (docs/findings/colossalai-0.5.0-unsharded-linear-grad-sequence-parallel.py). GPT-2's fused Conv1D classes have
    the same early return (qkv_fused_linear.py:338, :537; found by campaign 125 on a GPT-2 with ffn 1 under tp 2).
    Fix: mark them."""
    from colossalai.shardformer.layer import (GPT2FusedLinearConv1D_Col, GPT2FusedLinearConv1D_Row, Linear1D_Col,
                                              Linear1D_Row)
    from colossalai.shardformer.layer.utils import SeqParallelUtils, is_share_sp_tp

    for cls in (Linear1D_Col, Linear1D_Row, GPT2FusedLinearConv1D_Col, GPT2FusedLinearConv1D_Row):
        original = cls.from_native_module

        def from_native_module(module, process_group, *args, _original=original, **kwargs):
            out = _original(module, process_group, *args, **kwargs)
            if out is module and is_share_sp_tp(kwargs.get("seq_parallel_mode")):
                for p in module.parameters():
                    SeqParallelUtils.marked_as_sp_partial_derived_param(p)
            return out

        cls.from_native_module = staticmethod(from_native_module)


def _colossalai_interleaved_metadata():
    """Colossal-AI 0.5.0: with `enable_metadata_cache=False`, InterleavedSchedule's
    send_forward_recv_forward / send_backward_recv_backward set `send_*_metadata = not enable_metadata_cache
    and is_send`: a call on a rank that only receives (a chunk on the last or first device) turns the flag off,
    the rank's next send carries no metadata while its peer (no cache) waits for it, and the pipeline hangs in
    its second step (docs/findings/colossalai-0.5.0-interleaved-pipeline-no-metadata-cache-hang.py). Fix: a call that does
    not send leaves the flag as it was."""
    from colossalai.pipeline.schedule.interleaved_pp import InterleavedSchedule

    def keep_flag_unless_sent(method, flag, sends):
        def wrapped(self, model_chunk_id_send, model_chunk_id_recv, *args, **kwargs):
            with self.stage_manager.switch_model_chunk_id(model_chunk_id_send):
                is_send = sends(self.stage_manager)
            before = getattr(self, flag)
            out = method(self, model_chunk_id_send, model_chunk_id_recv, *args, **kwargs)
            if not is_send:
                setattr(self, flag, before)
            return out

        return wrapped

    InterleavedSchedule.send_forward_recv_forward = keep_flag_unless_sent(
        InterleavedSchedule.send_forward_recv_forward, "send_tensor_metadata", lambda sm: not sm.is_last_stage())
    InterleavedSchedule.send_backward_recv_backward = keep_flag_unless_sent(
        InterleavedSchedule.send_backward_recv_backward, "send_grad_metadata", lambda sm: not sm.is_first_stage())


def _colossalai_interleaved_metadata_requires_grad():
    """Colossal-AI 0.5.0: with the metadata cache (HybridParallelPlugin's default), InterleavedSchedule keeps one
    forward-metadata cache per rank, not per model chunk: the first activation a rank receives fixes shape, dtype and
    `requires_grad` of every later one (and a sender sends metadata only once). When the first chunk's output needs no
    gradient (a frozen embedding alone in chunk 0, or a frozen first chunk), every later chunk's input on that rank is
    received without `requires_grad`, the last stage's backward stops at its input and no earlier decoder layer gets
    a gradient: silently, they do not train (found 2026-11-29 by a colossalai-hybrid campaign;
    docs/findings/colossalai-0.5.0-interleaved-metadata-cache-frozen-first-chunk-no-grads.py). Workaround, not a
    fix: the schedule without the cache (each message carries its metadata), which is right once its own hang is
    fixed (colossalai-interleaved-metadata, applied here too)."""
    from colossalai.pipeline.schedule.interleaved_pp import InterleavedSchedule

    if "colossalai-interleaved-metadata" not in _APPLIED:
        _colossalai_interleaved_metadata()
        _APPLIED.add("colossalai-interleaved-metadata")
    original = InterleavedSchedule.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.enable_metadata_cache = False

    InterleavedSchedule.__init__ = __init__


def _colossalai_frozen_shared_param_sync():
    """Colossal-AI 0.5.0: under pipeline parallelism a tied embedding is a shared parameter of the first and last
    stages, and `HybridParallelModule.sync_shared_params` (hybrid_parallel_plugin.py:131-136) all-reduces its
    `.grad` between them without asking whether it trains: a frozen tied embedding (grad None) crashes every step in
    `dist.all_reduce` ("Invalid function argument. Expected parameter `tensor` of type torch.Tensor"). Found
    2026-11-29 by a colossalai-hybrid campaign (seed 159;
    docs/findings/colossalai-0.5.0-frozen-tied-embedding-pipeline-shared-grad-sync-crash.py). Fix: a shared parameter
    without a gradient (frozen on every stage that holds it) is not reduced."""
    import torch.distributed as dist
    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelModule

    def sync_shared_params(self):
        for shared_param, group in zip(self.shared_params, self.shared_param_process_groups):
            if self.stage_manager.stage in shared_param:
                param = shared_param[self.stage_manager.stage]
                if param.grad is not None:
                    dist.all_reduce(param.grad, group=group)
            dist.barrier()

    HybridParallelModule.sync_shared_params = sync_shared_params


def _deepspeed_unfused_init_step():
    """DeepSpeed 0.19.8: FP16_UnfusedOptimizer (what bf16 without ZeRO, stage 0, runs) initialises the
    optimizer's state by a real step() on zero gradients, so Adam's step counter is 1 before training and
    the first update uses step 2's bias correction: every parameter moves 0.742 lr instead of lr
    (docs/findings/deepspeed-0.19.8-bf16-zero0-adam-init-step.py). ZeRO 1-3 dropped that step (PR #5104).
    Fix: no step at initialisation; the optimizer creates its state lazily, as torch's does."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    FP16_UnfusedOptimizer.initialize_optimizer_states = lambda self: None


def _deepspeed_pipeline_clip_all_stages():
    """DeepSpeed 0.17.6 to 0.19.8: without ZeRO in fp32 the engine clips by deepspeed.runtime.utils.clip_grad_norm_ with
    the pipeline's grid as mpu, which counts a gradient only where the grid's model-parallel rank is 0 (Megatron's
    rule against counting tensor-parallel replicas twice); the grid's model-parallel rank is the rank's index over
    pipeline stages x slices, so no later stage's gradient is counted
    (docs/findings/deepspeed-0.19.8-pipeline-clip-grad-norm-first-stage-only.py). Fix: count by the slice (tensor)
    rank and, as DeepSpeed's other norms do (utils.py get_grad_norm, the ZeRO and BF16 optimizers), count a tied
    weight's pipeline replicas (`ds_pipe_replicated`) once; sum over the grid's model-parallel group as before."""
    import torch
    import deepspeed.comm as dist
    import deepspeed.runtime.engine as engine_module
    from deepspeed.runtime.utils import clip_grad_norm_ as original
    from deepspeed.runtime.utils import is_model_parallel_parameter

    def clip_grad_norm_(parameters, max_norm, norm_type=2, mpu=None):
        if mpu is None or not hasattr(mpu, "get_slice_parallel_rank"):
            return original(parameters, max_norm, norm_type, mpu=mpu)
        params = [p for p in parameters if p.grad is not None]
        counted = [p.grad.detach().float() for p in params if not getattr(p, "ds_pipe_replicated", False)
                   and (mpu.get_slice_parallel_rank() == 0 or is_model_parallel_parameter(p))]
        norm_type = float(norm_type)
        if norm_type == float("inf"):
            total = torch.stack([g.abs().max() for g in counted]).max() if counted else torch.zeros(())
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=mpu.get_model_parallel_group())
        else:
            total = torch.stack([g.norm(norm_type) ** norm_type for g in counted]).sum() if counted else torch.zeros(())
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=mpu.get_model_parallel_group())
            total = total ** (1.0 / norm_type)
        coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        for p in params:
            p.grad.data.mul_(coef)
        return total

    engine_module.clip_grad_norm_ = clip_grad_norm_


def _deepspeed_zero1_pipeline_group_norm():
    """DeepSpeed 0.19.8: ZeRO-1's step takes the gradient norm per parameter group, each with its own all-reduce over the
    model-parallel group, which beside a pipeline spans the stages: stages whose optimizers have different numbers of
    groups hang in that all-reduce
    (docs/findings/deepspeed-0.19.8-zero1-pipeline-stages-with-different-param-group-counts-hang.py). Fix: every
    group's squares summed first, one all-reduce over the data-parallel ranks and one over the model-parallel ranks
    (the offload and MoE paths are left as they are)."""
    import torch
    import deepspeed.comm as dist
    from deepspeed.runtime.utils import is_model_parallel_parameter, mask_nan_or_inf_with_val_inplace
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    original = DeepSpeedZeroOptimizer.scaled_global_norm

    def scaled_global_norm(self, norm_type=2):
        if self.cpu_offload or self.has_moe_layers or norm_type != 2:
            return original(self, norm_type)
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for i, _ in enumerate(self.bit16_groups):
            grads = (g for g in self.averaged_gradients[i] if not getattr(g, "_zero_padding", False))
            for g, p in zip(grads, self.params_in_partition[i]):
                if getattr(p, "ds_pipe_replicated", False):
                    continue
                if is_model_parallel_parameter(p) or self.model_parallel_rank == 0:
                    total += g.detach().float().norm() ** 2
        dist.all_reduce(total, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
        total = total.sqrt()
        mask_nan_or_inf_with_val_inplace(total, device=self.device)
        return total

    DeepSpeedZeroOptimizer.scaled_global_norm = scaled_global_norm


def _deepspeed_bf16_pipeline_frozen_tied_weight():
    """DeepSpeed 0.19.8: with the BF16_Optimizer the pipeline engine reduces a tied weight's `_hp_grad`, which a frozen
    tied weight does not have: AttributeError at the first step
    (docs/findings/deepspeed-0.19.8-bf16-pipeline-frozen-tied-weight-hp-grad-crash.py). Fix: a frozen tied weight has
    nothing to reduce (as in fp32, where its `grad` is None)."""
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    original = PipelineEngine._INSTRUCTION_MAP[schedule.ReduceTiedGrads]

    def reduce_tied_grads(self):
        frozen = [w for w, _ in self.module.get_tied_weights_and_groups() if not w.requires_grad]
        for w in frozen:
            w._hp_grad = None
        try:
            return original(self)
        finally:
            for w in frozen:
                del w._hp_grad

    for engine in (PipelineEngine, *_dual_pipe_engine()):  # (the engines dispatch schedule steps through these maps)
        engine._INSTRUCTION_MAP[schedule.ReduceTiedGrads] = reduce_tied_grads


def _dual_pipe_engine():
    """DeepSpeed's DualPipeV engine class, in a tuple (empty in releases without one, such as 0.17.6)."""
    try:
        from deepspeed.runtime.pipe.dualpipev import DualPipeVEngine
    except ImportError:
        return ()
    return (DualPipeVEngine,)


def _deepspeed_dualpipev_frozen_first_stage():
    """DeepSpeed 0.19.8: DualPipeV runs the backward of rank 0's first stage even when its output needs no gradient (all
    its layers frozen; rank 0 trains its last stage): RuntimeError "element 0 of tensors does not require grad"
    (docs/findings/deepspeed-0.19.8-dualpipev-frozen-first-stage-backward-crash.py). Fix: no backward for an output that
    needs no gradient."""
    import torch
    from deepspeed.runtime.pipe import schedule

    if not _dual_pipe_engine():
        return
    (DualPipeVEngine,) = _dual_pipe_engine()
    original = DualPipeVEngine._INSTRUCTION_MAP[schedule.BackwardPass]

    def backward_pass(self, buffer_id, phase):
        outputs = self.pipe_buffers["outputs"][buffer_id]
        first = outputs if torch.is_tensor(outputs) else (outputs[0] if outputs else None)
        if phase == 0 and self.stage_id == 0 and first is not None and not first.requires_grad:
            self.pipe_buffers["outputs"][buffer_id] = None
            self.pipe_buffers["inputs"][buffer_id] = None
            return None
        return original(self, buffer_id, phase)

    DualPipeVEngine._INSTRUCTION_MAP[schedule.BackwardPass] = backward_pass


def _deepspeed_bf16_pipeline_checkpoint_load():
    """DeepSpeed 0.19.8: beside a pipeline, bf16 at ZeRO 0 runs the BF16_Optimizer, whose per-rank state `save_checkpoint`
    writes as ZeRO files; `load_checkpoint` takes the ZeRO path only under ZeRO (PR #7586) and hands the model-states
    file's single dict to `BF16_Optimizer.load_state_dict`, which indexes it by the data-parallel rank: KeyError: 0
    (docs/findings/deepspeed-0.19.8-bf16-pipeline-checkpoint-load-keyerror.py). Fix: a BF16_Optimizer loads its per-rank
    files, as before #7586."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.engine import DeepSpeedEngine

    load_state_dict, load_checkpoint = BF16_Optimizer.load_state_dict, DeepSpeedEngine.load_checkpoint

    def skip_single_dict(self, state_dict_list, *args, **kwargs):
        if isinstance(state_dict_list, dict):
            return None
        return load_state_dict(self, state_dict_list, *args, **kwargs)

    def load_with_per_rank_state(self, load_dir, tag=None, **kwargs):
        out = load_checkpoint(self, load_dir, tag, **kwargs)
        if isinstance(self.optimizer, BF16_Optimizer) and not self.zero_optimization() and out[0] is not None:
            self._load_zero_checkpoint(load_dir, tag, load_optimizer_states=kwargs.get("load_optimizer_states", True))
        return out

    BF16_Optimizer.load_state_dict = skip_single_dict
    DeepSpeedEngine.load_checkpoint = load_with_per_rank_state


def _deepspeed_cpu_checkpointing_input_kept():
    """DeepSpeed 0.19.8: `cpu_checkpointing` on the CPU accelerator empties each checkpointed input before saving its
    "copy", which there is the input itself: the recomputation runs on an empty tensor
    (docs/findings/deepspeed-0.19.8-cpu-checkpointing-on-cpu-accelerator-input-lost-crash.py). Fix: keep the storage
    before emptying the input, as the script's `--fixed`."""
    import torch
    from deepspeed.runtime.activation_checkpointing import checkpointing as ck

    def keep(args, inputs):
        kept = [inp.data if torch.is_tensor(inp) else None for inp in inputs]
        new_args = []
        for arg, data in zip(args, kept):
            if ck.is_activation_to_checkpoint(arg):
                arg.data = torch.empty([], device=arg.device).data
                arg.saved_data = data
            new_args.append(arg)
        return new_args

    ck.get_cpu_activations_for_backward = keep


def _deepspeed_ulysses_mesh_gradient_group():
    """DeepSpeed 0.19.8: with sequence parallelism configured by `sequence_parallel_size` and `data_parallel_size` (or
    `mesh_param`), deepspeed.initialize builds a (data_parallel, sequence_parallel) device mesh, but
    groups._get_sequence_data_parallel_group() (the group ZeRO and the engine reduce gradients over, "across both
    dimensions of data and sequence parallelism", its comment says) falls back to the mesh's data-parallel dimension
    alone; the engine still divides by that group's size over sequence_parallel_size. The sequence-parallel ranks'
    gradients are never combined: each rank steps on its own part of the sequence, scaled by sp
    (docs/findings/deepspeed-0.19.8-ulysses-mesh-gradients-not-reduced-over-sequence-ranks.py). Fix: the group over
    both mesh dimensions."""
    from deepspeed.utils import groups

    def seq_data_mesh():
        mesh = groups.mesh_device
        if not hasattr(mesh, "_shardfuzz_seq_data"):
            mesh._shardfuzz_seq_data = mesh["data_parallel", "sequence_parallel"]._flatten()
        return mesh._shardfuzz_seq_data

    def mesh_only(released, fixed):
        def get():
            if groups.mesh_device is not None and not (groups.mpu is not None and hasattr(
                    groups.mpu, "get_sequence_data_parallel_group")):
                return fixed(seq_data_mesh())
            return released()
        return get

    import torch.distributed as dist

    groups._get_sequence_data_parallel_group = mesh_only(groups._get_sequence_data_parallel_group,
                                                         lambda m: m.get_group())
    groups._get_sequence_data_parallel_world_size = mesh_only(groups._get_sequence_data_parallel_world_size,
                                                              lambda m: m.size())
    groups._get_sequence_data_parallel_rank = mesh_only(groups._get_sequence_data_parallel_rank,
                                                        lambda m: dist.get_rank(m.get_group()))


def _deepspeed_zero3_reduce_scatter_sequence_parallel():
    """DeepSpeed 0.19.8: under sequence parallelism every gradient reduction divides by the reduction group's size over
    sequence_parallel_size (ZeRO 0-2, and ZeRO-3's all-reduce path, `__avg_scatter_contiguous_grads`): gradients are
    summed over the sequence-parallel ranks. ZeRO-3's reduce-scatter path (`__avg_scatter_grads`, taken with
    `reduce_scatter`, the default) averages over the whole group (reduce_scatter_coalesced divides by its size) and
    never multiplies back: its gradients are 1/sp of every other path's
    (docs/findings/deepspeed-0.19.8-zero3-reduce-scatter-averages-over-sequence-ranks.py). Fix: the missing factor."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    name = "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads"
    original = getattr(Stage3, name)

    def avg_scatter_grads(self, params_to_reduce, communication_data_type):
        partitions = original(self, params_to_reduce, communication_data_type)
        if self.sequence_parallel_size > 1:
            partitions = [g.mul(self.sequence_parallel_size) for g in partitions]
        return partitions

    setattr(Stage3, name, avg_scatter_grads)


def _deepspeed_sequence_parallel_unit_model_parallel_rank():
    """DeepSpeed 0.19.8 (an open issue, deepspeedai/DeepSpeed#7833, "Ulysses crashes in Stage 0"): DeepSpeed's own
    sequence-parallel unit (`parallel_state_sp`, passed as `mpu`) aliases get_model_parallel_rank / _world_size / _group
    to its sequence-parallel ones, and having no tensor-parallel getters, `bwc_tensor_model_parallel_rank` falls back to
    them: the BF16_Optimizer's gradient norm counts a replicated gradient on tensor-parallel rank 0 only, which is sp
    rank 0, and sp rank 1 stacks an empty list ("stack expects a non-empty TensorList";
    docs/findings/deepspeed-0.19.8-sequence-parallel-unit-bf16-norm-empty-stack-crash.py). Fix: the unit says there is
    no tensor parallelism."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    parallel_state_sp.get_tensor_model_parallel_rank = lambda: 0
    parallel_state_sp.get_tensor_model_parallel_world_size = lambda: 1


def _deepspeed_zero1_moe_noncontiguous_expert_group():
    """DeepSpeed 0.19.8: ZeRO-1 with MoE and `contiguous_gradients: false` (allowed at stage 1 with a warning, "not
    thoroughly tested with MoE. This configuration is still experimental"; stage 2 refuses it) reduces every gradient of
    an ipg bucket through `buffered_reduce_fallback`, i.e. over the whole data-parallel group: the expert gradients of
    different experts (one set per expert-parallel rank) are summed together and divided by dp, where the contiguous
    path (`average_tensor`) reduces each expert group over its expert-data-parallel group
    (docs/findings/deepspeed-0.19.8-zero1-moe-noncontiguous-gradients-mix-experts.py). Fix: expert gradients reduced
    over their expert-data-parallel group."""
    import deepspeed.comm as dist
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Zero

    reduce_ipg_grads, fallback = Zero.reduce_ipg_grads, Zero.buffered_reduce_fallback

    def reduce_ipg_grads_fixed(self, comm_dtype=None):
        self._expert_groups = {}
        if not self.contiguous_gradients and getattr(self, "has_moe_layers", False):
            for bucket in self.ipg_buckets.values():
                for grad, (i, _, _) in zip(bucket.grads, bucket.params):
                    if self.is_moe_param_group[i]:
                        self._expert_groups[id(grad)] = self.real_dp_process_group[i]
        return reduce_ipg_grads(self, comm_dtype)

    def buffered_reduce_fallback_fixed(self, rank, grads, communication_data_type, elements_per_buffer=500000000,
                                       log=None):
        experts = getattr(self, "_expert_groups", {})
        for g in grads:
            if id(g) in experts:
                # Averaged over the whole data-parallel group, as average_tensor and the engine average expert
                # gradients ("to maintain the gradients value unaffected by ep_size"), summed over the expert group.
                g.div_(dist.get_world_size(group=self.dp_process_group) / float(self.sequence_parallel_size))
                self.allreduce_no_retain([g], communication_data_type, numel_per_bucket=elements_per_buffer,
                                         rank=rank, log=log, divide=False, process_group=experts[id(g)])
        rest = [g for g in grads if id(g) not in experts]
        if rest:
            fallback(self, rank, rest, communication_data_type, elements_per_buffer=elements_per_buffer, log=log)

    Zero.reduce_ipg_grads, Zero.buffered_reduce_fallback = reduce_ipg_grads_fixed, buffered_reduce_fallback_fixed


def _deepspeed_moe_fp32_clip_norm_average():
    """DeepSpeed 0.19.8: without ZeRO in fp32 the engine clips by deepspeed.runtime.utils.clip_grad_norm_, which, "to
    consider MoE params", takes each rank's local norm (the shared gradients and its own experts') and averages the
    norms over the data-parallel group: mean_r sqrt(S + E_r) instead of the global sqrt(S + sum of every expert's
    squares), so with expert parallelism the clipping coefficient is not the global norm's, unlike ZeRO-1/2's
    (docs/findings/deepspeed-0.19.8-moe-fp32-clip-norm-averages-rank-norms.py). Fix: the global 2-norm (shared
    gradients once, each expert's squares summed over the data-parallel group and divided by its replica count)."""
    import torch
    from deepspeed import comm as dist
    from deepspeed.moe.utils import is_moe_param
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils import groups

    original = DeepSpeedEngine.clip_fp32_gradients

    def clip_fp32_gradients(self):
        if self.mpu is not None or not getattr(self, "has_moe_layers", False):
            return original(self)
        grads = [(p, p.grad) for p in self.module.parameters() if p.grad is not None]
        shared = sum((g.detach().float().norm() ** 2 for p, g in grads if not is_moe_param(p)), torch.zeros(()))
        experts = sum((g.detach().float().norm() ** 2 / groups._get_expert_data_parallel_world_size(p.group_name)
                       for p, g in grads if is_moe_param(p)), torch.zeros(()))
        dist.all_reduce(experts, group=groups._get_data_parallel_group())
        clip_coef = torch.clamp(self.gradient_clipping() / ((shared + experts).sqrt() + 1e-6), max=1.0)
        for _, g in grads:
            g.data.mul_(clip_coef)

    DeepSpeedEngine.clip_fp32_gradients = clip_fp32_gradients


def _deepspeed_predivide_sequence_parallel():
    """DeepSpeed 0.19.8: ZeRO-1/2's `gradient_reduction_w_predivide` (`gradient_predivide_factor` f, `reduce_scatter`
    off) divides by f, all-reduces over the sequence-and-data-parallel group of W ranks and multiplies by
    f / (W / sequence_parallel_size), but skips that multiplication when f == W, which is only right without sequence
    parallelism: with sp > 1 and f == W every gradient comes out sp times too small
    (docs/findings/deepspeed-0.19.8-predivide-factor-equal-to-world-size-under-sequence-parallelism.py). Fix: the
    multiplication skipped only when its factor is 1."""
    import deepspeed.comm as dist
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Zero

    original = Zero.gradient_reduction_w_predivide

    def gradient_reduction_w_predivide(self, tensor, communication_data_type):
        out = original(self, tensor, communication_data_type)
        world = dist.get_world_size(group=self.dp_process_group)
        f, sp = self.gradient_predivide_factor, float(self.sequence_parallel_size)
        if self.gradient_average and self.postscale_gradients and f == world and sp > 1:
            tensor.mul_(f / (world / sp))  # (the released code returns `tensor`, reduced in place)
        return out

    Zero.gradient_reduction_w_predivide = gradient_reduction_w_predivide


def _torch_sequence_parallel_requires_grad():
    """torch 2.4 to 2.15: tensor parallelism's `SequenceParallel._replicate_module_fn` wraps each parameter of the norm
    it parallelizes in `nn.Parameter(DTensor.from_local(...))`, whose `requires_grad` defaults to True: a frozen norm is
    trained again (docs/findings/torch-2.15-tp-sequence-parallel-unfreezes-frozen-norm.py; pytorch/pytorch PR #171709
    fixed the other styles, not this one). Fix: keep the parameter's `requires_grad`, as #171709 does elsewhere."""
    import torch.nn as nn
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import SequenceParallel

    def replicate_module_fn(self, name, module, device_mesh):
        for p_name, param in module.named_parameters():
            module.register_parameter(p_name, nn.Parameter(
                DTensor.from_local(param, device_mesh, [Replicate()], run_check=False),
                requires_grad=param.requires_grad))

    SequenceParallel._replicate_module_fn = replicate_module_fn


def _torch_ddp_tp_local_parameters():
    """torch 2.5.1 to 2.15: DDP over a tensor-parallel model (its `device_mesh` path, `_pre_dp_module_transform`) replaces
    the DTensor parameters by new local `nn.Parameter`s, which (1) are trainable whatever the DTensor was
    (`_flatten_tensor` sets requires_grad, `nn.Parameter` defaults to it): a frozen parameter is trained; and (2) are
    gone after the first forward: its pre-forward hook puts plain DTensors (not parameters) in their place, so its
    post-forward hook finds nothing to localize, and `module.parameters()` is empty from then on: `zero_grad()` clears
    nothing (gradients pile up over steps), clipping over `parameters()` clips nothing, and a pipeline stage's
    `scale_grads` leaves the gradients n_microbatches times too large
    (docs/findings/torch-2.15-ddp-tp-parameters-gone-after-forward.py). Fix: localize keeping `requires_grad`, leave the
    local parameters registered, and show each module its own parameters as DTensors during its every call (an instance
    attribute over the registered parameter, dropped after the call): an activation checkpoint's recomputation in the
    backward, which calls the blocks again after the model's forward has ended (and may stop early, before their
    post-forward hooks), finds DTensors too, and `parameters()` never changes."""
    import functools

    import torch.distributed.tensor.parallel.ddp as ddp_tp
    import torch.nn as nn

    def show_dtensors(module, _args, local):
        for _, name, t in local:
            object.__setattr__(module, name, ddp_tp._unflatten_tensor(t, t._st_info))

    def hide_dtensors(module, _args, _out, local):
        for _, name, _t in local:
            module.__dict__.pop(name, None)

    def pre_dp_module_transform(module):
        for sub in module.modules():
            local = []
            for name, q in list(sub.named_parameters(recurse=False)):
                t, spec = ddp_tp._flatten_tensor(q)
                if spec is not None:
                    t = nn.Parameter(t, requires_grad=q.requires_grad)
                    t._st_info = spec
                    local.append((sub, name, t))
            if local:
                ddp_tp._update_module_param(local)
                sub.register_forward_pre_hook(functools.partial(show_dtensors, local=local))
                sub.register_forward_hook(functools.partial(hide_dtensors, local=local))

    ddp_tp._pre_dp_module_transform = pre_dp_module_transform


def _torch_pipelining_split_backward_frozen_input():
    """torch 2.15: under a zero-bubble schedule (backward split into input and weight parts) a stage whose inputs need no
    gradient (every earlier stage frozen: a head or last blocks trained on a frozen backbone) gets no weight gradient:
    `stage_backward_input` finds the weights through the inputs' part of the graph, which is empty, and the stage's
    parameters keep `.grad` None, which the optimizer skips (docs/findings/torch-2.15-pipelining-zero-bubble-frozen-input-no-grad.py).
    The code says so for the first stage ("if inputs does not require gradient, then the parameter group will not be
    fully captured") and runs its weight step as a full backward; the fix does the same for every stage whose inputs
    need no gradient."""
    from torch.distributed.pipelining.stage import _PipelineStageBase

    fix = "torch-pipelining-split-backward-frozen-input"
    _replace_in_method(
        _PipelineStageBase, "backward_one_chunk",
        "            if not self.is_first:\n",
        "            if not self.is_first and not any(isinstance(v, torch.Tensor) and v.requires_grad\n"
        "                                             for v in bwd_kwargs[\"input_values\"]):\n"
        "                grads_input = tuple(None for _ in bwd_kwargs[\"input_values\"])\n"
        "            elif not self.is_first:\n", fix)
    _replace_in_method(_PipelineStageBase, "backward_weight_one_chunk", "if self.stage_index != 0:",
                       "if param_groups is not None:", fix)


def _torch_fsdp2_int_reshard_submesh():
    """torch 2.15: FSDP2's `_get_post_forward_mesh_info` builds an integer `reshard_after_forward`'s mesh from the ranks
    of this rank's FSDP mesh; over a sub-mesh (FSDP beside tensor parallelism) the ranks of each tensor-parallel index
    create different groups, which pair up wrongly: the run hangs
    (docs/findings/torch-2.15-fsdp2-int-reshard-after-forward-submesh-hang.py). Fix: the post-forward mesh built from
    the root mesh, the same on every rank (the sub-mesh's dimensions last, split into groups of g)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp._fully_shard import _fsdp_init, _fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_common import HSDPMeshInfo

    original = _fsdp_init._get_post_forward_mesh_info

    def post_forward_mesh_info(reshard_after_forward, mesh_info):
        mesh = mesh_info.mesh
        root = mesh._get_root_mesh()
        plain = isinstance(reshard_after_forward, bool) or reshard_after_forward in (1, mesh_info.shard_mesh_size)
        if plain or root is mesh:
            return original(reshard_after_forward, mesh_info)
        names = root.mesh_dim_names
        inner = [names.index(n) for n in mesh.mesh_dim_names]
        outer = [i for i in range(len(names)) if i not in inner]
        every = root.mesh.permute(*outer, *inner).reshape(-1, reshard_after_forward)
        return HSDPMeshInfo(DeviceMesh(mesh.device_type, every), shard_mesh_dim=1, replicate_mesh_dim=0)

    _fsdp_init._get_post_forward_mesh_info = post_forward_mesh_info
    _fully_shard._get_post_forward_mesh_info = post_forward_mesh_info


def _torch_fsdp2_world_size_one_divides_twice():
    """torch 2.15: FSDP2's `foreach_reduce` with a reduce-scatter group of one rank (HSDP whose shard groups hold one
    rank each, replication only) skips the collective and divides by the module's `gradient_divide_factor` itself, but
    `_get_gradient_divide_factors` has already turned that factor into a pre- and post-division wherever the
    collectives are plain sums (`set_force_sum_reduction_for_comms`, or an fp16 / f64 reduce dtype): the gradients come
    out divided by the factor twice, 1/dp of the average (docs/findings/torch-2.15-fsdp2-replicated-gradient-divide-
    factor-applied-twice.py). Fix: the copy divides only where no pre- or post-division will (the averaging /
    pre-multiplying collectives it stands in for)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group

    old = "if gradient_divide_factor is not None and gradient_divide_factor != 1.0:"
    _replace_in_method(_fsdp_collectives, "foreach_reduce", old,
                       old[:-1] + " and predivide_factor is None and postdivide_factor is None:",
                       "torch-fsdp2-world-size-one-divides-twice")
    _fsdp_param_group.foreach_reduce = _fsdp_collectives.foreach_reduce


def _dtensor_found_inf_placements():
    """torch 2.5.1 to 2.15: DTensor's handler of `_amp_foreach_non_finite_check_and_unscale_`
    (`found_inf_reduce_handler`, what GradScaler.unscale_ runs on DTensor gradients) reduces found_inf
    across ranks by `grads[0].placements` alone: with a replicated first gradient, an overflow in a later
    sharded one is seen by its rank only, which skips the step while the others take it
    (docs/findings/torch-2.15-dtensor-gradscaler-found-inf-first-grad-placement.py). Fix: reduce over every
    mesh dim on which any gradient is not Replicate."""
    import torch
    import torch.utils._pytree as pytree
    from torch.distributed.tensor import DTensor, Partial, Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    def handler(op_call, args, kwargs):
        op_info = DTensor._op_dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        op_call(*pytree.tree_unflatten(list(op_info.local_args), op_info.args_tree_spec), **op_info.local_kwargs)
        grads, found_inf = args[0], args[1]
        mesh = grads[0].device_mesh
        placements = tuple(
            Replicate() if all(isinstance(g.placements[i], Replicate) for g in grads) else Partial("max")
            for i in range(mesh.ndim))
        meta = TensorMeta(shape=found_inf.size(), stride=found_inf.stride(), dtype=found_inf.dtype)
        spec = DTensorSpec(mesh=mesh, placements=placements, tensor_meta=meta)
        found_inf.copy_(DTensor(local_tensor=found_inf, spec=spec, requires_grad=False).full_tensor())

    op = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
    DTensor._op_dispatcher._custom_op_handlers[op] = handler


def _torch_dtensor_inf_norm_empty_shard():
    """torch 2.5.1 to 2.15: DTensor computes a vector norm (`linalg_vector_norm`, `_foreach_norm`) on each rank's
    local shard and reduces the partial norms; of order inf (or -inf) the local norm of an empty shard raises
    "cannot compute the inf norm on an empty tensor because the operation does not have an identity", so
    `clip_grad_norm_(..., norm_type=inf)` over FSDP2 gradients crashes on every rank holding an empty shard of a
    parameter with fewer rows than ranks (docs/findings/torch-2.15-dtensor-inf-norm-empty-local-shard-crash.py).
    Fix: an empty local shard enters a full reduction of order ±inf as the identity of its maximum / minimum over
    |x| (0 / inf)."""
    import math

    import torch
    from torch.distributed.tensor import DTensor

    handlers = DTensor._op_dispatcher._custom_op_handlers

    def identity_shard(t, order):
        if isinstance(t, DTensor) and abs(order) == math.inf and t.to_local().numel() == 0:
            fill = 0.0 if order > 0 else math.inf
            local = torch.full([1] * t.dim(), fill, dtype=t.dtype)
            return DTensor(local, t._spec, requires_grad=False)
        return t

    def handler(op_call, args, kwargs):
        order = args[1] if len(args) > 1 else kwargs.get("ord", kwargs.get("scalar", 2))
        full_reduction = op_call is foreach or (len(args) < 3 and kwargs.get("dim") is None)
        if full_reduction and isinstance(order, (int, float)):
            first = [identity_shard(t, order) for t in args[0]] if op_call is foreach else identity_shard(args[0], order)
            args = (first, *args[1:])
        own = handlers.pop(op_call)
        try:
            return op_call(*args, **kwargs)
        finally:
            handlers[op_call] = own

    foreach = torch.ops.aten._foreach_norm.Scalar
    for op in (torch.ops.aten.linalg_vector_norm.default, foreach):
        handlers[op] = handler


def _torch_fsdp1_sharded_scaler_scalar_found_inf():
    """torch 2.5.1 to 2.15: `ShardedGradScaler.unscale_` records its overflow flags as one-element vectors
    (`torch.full((1,), 0.0)`, where torch.amp.GradScaler uses a scalar); a fused optimizer stepped after `unscale_`
    gets their sum as `found_inf` and its `_foreach_sub_(state_steps, [found_inf] * n)` fails: "output with shape []
    doesn't match the broadcast shape [1]" (docs/findings/torch-2.15-fsdp1-sharded-grad-scaler-fused-optimizer-crash.py).
    Fix: the recorded flags as scalars."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    unscale = ShardedGradScaler.unscale_

    def unscale_(self, optimizer):
        unscale(self, optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        state["found_inf_per_device"] = {d: t.reshape(()) for d, t in state["found_inf_per_device"].items()}

    ShardedGradScaler.unscale_ = unscale_


def _colossalai_ce_mean_nonzero():
    """Colossal-AI 0.5.0: cross_entropy_1d's default mode "mean" divides the summed loss by
    `torch.sum(loss != 0.0)`, the targets whose loss is not exactly zero, instead of the targets it does not
    ignore: a token predicted with certainty in fp32 (every other exp(logit - max) under half an ulp of 1)
    leaves the denominator, and the loss and every gradient grow by counted / nonzero
    (docs/findings/colossalai-0.5.0-cross-entropy-1d-mean-drops-zero-loss-tokens.py). Fix: the sum over
    the targets not ignored, divided by their count. (colossalai-hybrid meets it in Falcon's forwards, which call
    cross_entropy_1d in that mode.)"""
    from colossalai.shardformer import layer
    from colossalai.shardformer.layer import loss
    from colossalai.shardformer.modeling import falcon

    original = loss.cross_entropy_1d

    def cross_entropy_1d(vocab_logits, labels, ignore_index=-100, process_group=None, vocab_size=None, dtype=None,
                         mode="mean"):
        out = original(vocab_logits, labels, ignore_index=ignore_index, process_group=process_group,
                       vocab_size=vocab_size, dtype=dtype, mode="sum")
        return out / (labels != ignore_index).sum() if mode == "mean" else out

    loss.cross_entropy_1d = layer.cross_entropy_1d = falcon.cross_entropy_1d = cross_entropy_1d


_BATCH = {}


def batch_tokens(count, divided_by):
    """What the fix below needs and the model's forward cannot know: the counted targets of the whole batch
    (every micro-batch of every data-parallel rank), and the factor by which the pipeline schedule (micro-batch
    count) and the plugin's gradient average (data-parallel size) divide a micro-batch's loss. transformers
    passes the first as `num_items_in_batch`, which shardformer's forward takes in **kwargs and drops."""
    _BATCH.update(count=count, divided_by=divided_by)


def _colossalai_dist_ce_batch_mean():
    """Colossal-AI 0.5.0: shardformer's causal-LM loss (`dist_cross_entropy`) divides each micro-batch's summed
    loss by that micro-batch's own count of targets not ignored, on each data-parallel rank; the pipeline
    schedule then averages micro-batches and the plugin averages ranks, so with ignored targets (padding, masked
    prompts) the loss is a mean of means and its gradient depends on pp's micro-batches and on dp
    (docs/findings/colossalai-0.5.0-dist-cross-entropy-mean-per-microbatch.py). Sequence-parallel ranks, which
    it all-reduces, are counted together. Fix: the summed loss over the whole batch's count (transformers'
    num_items_in_batch), times the factor the schedule and the plugin divide by."""

    def fixed(original):
        def dist_cross_entropy(labels, logits, *args, **kwargs):
            # Its own count in every mode expressed here: under all_to_all it all-reduces the sequence chunks'
            # counts, which together are the rows' whole count (so every rank of the group takes the same branch).
            count = (labels[..., 1:] != -100).sum()
            if count == 0:
                return logits.sum() * 0.0  # nothing counted: a zero sum (its mean is 0 / 0)
            return original(labels, logits, *args, **kwargs) * count * (_BATCH["divided_by"] / _BATCH["count"])

        return dist_cross_entropy

    _wrap_dist_cross_entropy(fixed)


def _colossalai_mixtral_pipeline_loss_batch_mean():
    """Colossal-AI 0.5.0: the last pipeline stage of shardformer's Mixtral (MixtralPipelineForwards.
    mixtral_for_causal_lm_forward) computes the model's loss with a plain `CrossEntropyLoss()`: each micro-batch's
    mean over its own targets not ignored, which the schedule then averages over micro-batches and the plugin over
    data-parallel ranks. With ignored labels (padding, masked prompts) the loss and every gradient are a mean of
    means that depends on the micro-batching, and a micro-batch whose labels are all ignored makes the step's loss
    NaN (0 / 0): Llama's `dist_cross_entropy` form of the same (fix colossalai-dist-ce-batch-mean), in a forward
    that does not call it (docs/findings/colossalai-0.5.0-mixtral-pipeline-loss-mean-per-microbatch.py). Fix: the
    micro-batch's summed loss over the whole batch's count, times the factor the schedule and the plugin divide by."""
    from colossalai.shardformer.modeling import mixtral

    def batch_mean(loss_fct, logits, labels):
        count = (labels != loss_fct.ignore_index).sum()
        if count == 0:
            return logits.sum() * 0.0  # nothing counted: a zero sum (its mean is 0 / 0)
        return loss_fct(logits, labels) * count * (_BATCH["divided_by"] / _BATCH["count"])

    mixtral._shardfuzz_batch_mean = batch_mean
    _replace_in_method(mixtral.MixtralPipelineForwards, "mixtral_for_causal_lm_forward",
                       "loss = loss_fct(shift_logits, shift_labels)\n",
                       "loss = _shardfuzz_batch_mean(loss_fct, shift_logits, shift_labels)\n",
                       "colossalai-mixtral-pipeline-loss-batch-mean")


def _colossalai_falcon_loss_batch_mean():
    """Colossal-AI 0.5.0: shardformer's Falcon computes its causal-LM loss in its own forwards, not through
    `dist_cross_entropy`: the last pipeline stage (FalconPipelineForwards.falcon_for_causal_lm_forward,
    modeling/falcon.py:410-434) with a plain `CrossEntropyLoss()` or, under tensor parallelism with parallel_output,
    `cross_entropy_1d`; without a pipeline the tensor-parallel forward (get_lm_forward_with_dist_cross_entropy,
    :783-798) with `cross_entropy_1d`. Each is the mean over the micro-batch's (data-parallel rank's) own labels that
    are not ignored, which the schedule averages over micro-batches and the plugin over ranks: with ignored labels
    (padding, masked prompts) a mean of means, NaN where a micro-batch counts none. Llama's form of the same is fix
    colossalai-dist-ce-batch-mean, Mixtral's colossalai-mixtral-pipeline-loss-batch-mean; this code is Falcon's own
    (docs/findings/colossalai-0.5.0-falcon-loss-mean-per-microbatch.py). Fix: each micro-batch's summed loss over the
    whole batch's count, times the factor the schedule and the plugin divide by."""
    from colossalai.shardformer.modeling import falcon

    def batch_mean(labels, loss_fn, logits, *args, **kwargs):
        count = (labels != -100).sum()
        if count == 0:
            return logits.sum() * 0.0  # nothing counted: a zero sum (its mean is 0 / 0)
        return loss_fn(logits, *args, **kwargs) * count * (_BATCH["divided_by"] / _BATCH["count"])

    falcon._shardfuzz_batch_mean = batch_mean
    name = "colossalai-falcon-loss-batch-mean"
    _replace_in_method(falcon.FalconPipelineForwards, "falcon_for_causal_lm_forward", "loss = loss_fct(",
                       "loss = _shardfuzz_batch_mean(shift_labels, loss_fct, ", name)
    _patch_falcon_causal_lm_losses("loss = cross_entropy_1d(",
                                   "loss = _shardfuzz_batch_mean(shift_labels, cross_entropy_1d, ", name)


def _colossalai_falcon_empty_vocab_shard():
    """Colossal-AI 0.5.0: the padding of colossalai-empty-vocab-shard (VocabParallelLMHead1D returns a tensor-parallel
    rank whose vocabulary shard is all padding logits of width 0) met in Falcon's own causal-LM forwards, which
    flatten the shifted logits with `shift_logits.view(-1, new_vocab_size)` (modeling/falcon.py:421, :792) before
    `cross_entropy_1d`: "cannot reshape tensor of 0 elements into shape [-1, 0]" on that rank
    (docs/findings/colossalai-0.5.0-falcon-empty-vocab-shard-loss-crash.py). Fix: such a rank's logits take one column
    of -inf (no target falls in its range, its exp is 0 in the softmax's sum, its gradient 0)."""
    from colossalai.shardformer.modeling import falcon

    falcon._shardfuzz_a_column_where_none = _a_column_where_none
    _patch_falcon_causal_lm_losses(
        "new_vocab_size = shift_logits.shape[-1]",
        "shift_logits = _shardfuzz_a_column_where_none(shift_logits); new_vocab_size = shift_logits.shape[-1]",
        "colossalai-falcon-empty-vocab-shard")


def _colossalai_command_mask_without_flash_attention():
    """Colossal-AI 0.5.0: CommandPolicy replaces CohereAttention.forward in every layout with
    get_command_flash_attention_forward (policies/command.py:79-84), which forces `shard_config.enable_flash_attention`
    on and asserts the attention mask is ColoAttention's dict; the model forward that makes that dict is installed only
    with flash attention or sequence parallelism (:86-98; a pipeline's forward makes it too), so a Command under tensor
    or data parallelism alone fails at its first forward: "Flash Attention Error: attention_mask should be a dict."
    (docs/findings/colossalai-0.5.0-command-without-flash-attention-crash.py). Fix: without a pipeline, install that
    model forward whenever the policy did not."""
    from transformers.models.cohere.modeling_cohere import CohereModel

    from colossalai.shardformer.modeling.command import get_command_flash_attention_model_forward
    from colossalai.shardformer.policies.command import CommandPolicy

    original = CommandPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        config = self.shard_config
        if self.pipeline_stage_manager is None and not (config.enable_flash_attention or config.enable_sequence_parallelism):
            self.append_or_create_method_replacement(
                description={"forward": get_command_flash_attention_model_forward(config)}, policy=policy,
                target_key=CohereModel)
        return policy

    CommandPolicy.module_policy = module_policy


def _colossalai_command_sp_norm_grads():
    """Colossal-AI 0.5.0: under split_gather or ring sequence parallelism each rank's norms see its part of the
    sequence, so their weights' gradients are partial sums, which the plugin all-reduces only for parameters marked
    sp_partial_derived (the Llama policy's norm wrappers mark theirs); CommandPolicy replaces no norm ("CohereLayerNorm
    has no bias ... so we don't replace it", policies/command.py:57), so the input_layernorm and final norm weights are
    stepped by each rank's own part's gradient and the ranks' copies drift apart
    (docs/findings/colossalai-0.5.0-command-sequence-parallel-norm-grads-not-reduced.py). Fix: mark them."""
    from colossalai.shardformer.layer.utils import SeqParallelUtils
    from colossalai.shardformer.policies.command import CommandPolicy

    original = CommandPolicy.postprocess

    def postprocess(self):
        config = self.shard_config
        if config.enable_sequence_parallelism and config.sequence_parallelism_mode in ("split_gather", "ring"):
            for name, module in self.model.named_modules():
                # (a pipeline stage's norms of other stages have no weight; the query/key norms, which see whole
                # sequences and hold the rank's heads, are not partial)
                if (type(module).__name__ == "CohereLayerNorm" and module.weight is not None
                        and not name.endswith(("q_norm", "k_norm"))):
                    SeqParallelUtils.marked_as_sp_partial_derived_param(module.weight)
        return original(self)

    CommandPolicy.postprocess = postprocess


def _colossalai_command_qk_norm():
    """Colossal-AI 0.5.0: CommandPolicy's attention forward (get_command_flash_attention_forward, installed in every
    layout) never applies a Cohere model's query/key norms (`use_qk_norm`, Command R+'s q_norm / k_norm), so the model
    trained is another and the norms' weights get no gradient; nor does the policy shard those weights (one row per
    head) under tensor parallelism (docs/findings/colossalai-0.5.0-command-qk-norm-ignored.py). Fix: apply them where
    transformers does (after the projections' view into heads, before the rotary embedding), their weights sharded by
    head as q_proj and k_proj are under tensor parallelism, and under all_to_all sequence parallelism (whole weights,
    a rank's heads after the exchange) the rows of the rank's heads."""
    import torch
    import torch.distributed as dist
    from colossalai.shardformer.modeling import command
    from colossalai.shardformer.policies import command as policy
    from colossalai.tensor.d_tensor.api import shard_rowwise, sharded_tensor_to_existing_param

    def head_norm(norm, x, rows):  # CohereLayerNorm's forward on the weight's `rows`
        x32 = x.to(torch.float32)
        mean = x32.mean(-1, keepdim=True)
        y = (x32 - mean) * torch.rsqrt((x32 - mean).pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return (norm.weight.to(torch.float32)[rows] * y).to(x.dtype)

    def qk_norms(attn, q, k, sp_mode, sp_group):
        if sp_mode != "all_to_all":
            return attn.q_norm(q), attn.k_norm(k)
        rank = dist.get_rank(sp_group)
        return (head_norm(attn.q_norm, q, slice(rank * q.shape[2], (rank + 1) * q.shape[2])),
                head_norm(attn.k_norm, k, slice(rank * k.shape[2], (rank + 1) * k.shape[2])))

    command._shardfuzz_qk_norms = qk_norms
    _replace_in_function(command, "get_command_flash_attention_forward", [(
        "        query_states = query_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)\n"
        "        key_states = key_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)\n",
        "        query_states = query_states.view(bsz, q_len, -1, self.head_dim)\n"
        "        key_states = key_states.view(bsz, q_len, -1, self.head_dim)\n"
        "        if self.use_qk_norm:\n"
        "            query_states, key_states = _shardfuzz_qk_norms(self, query_states, key_states, sp_mode, sp_group)\n"
        "        query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)\n")],
        "colossalai-command-qk-norm")
    policy.get_command_flash_attention_forward = command.get_command_flash_attention_forward
    original = policy.CommandPolicy.postprocess

    def postprocess(self):
        config = self.shard_config
        if config.enable_tensor_parallelism:
            for module in self.model.modules():
                if type(module).__name__ == "CohereAttention" and module.config.use_qk_norm:
                    for norm in (module.q_norm, module.k_norm):
                        if norm.weight is None:  # (another pipeline stage's layer)
                            continue
                        sharded = shard_rowwise(norm.weight.data, config.tensor_parallel_process_group)
                        sharded_tensor_to_existing_param(sharded, norm.weight)
        return original(self)

    policy.CommandPolicy.postprocess = postprocess


def _patch_falcon_causal_lm_losses(old, new, fix):
    """One passage of the vocabulary-parallel loss replaced in both of shardformer's Falcon causal-LM forwards: the
    pipeline's and the tensor-parallel one (a factory the policy imports by name)."""
    from colossalai.shardformer.modeling import falcon
    from colossalai.shardformer.policies import falcon as policy

    _replace_in_method(falcon.FalconPipelineForwards, "falcon_for_causal_lm_forward", old, new, fix)
    _replace_in_function(falcon, "get_lm_forward_with_dist_cross_entropy", [(old, new)], fix)
    policy.get_lm_forward_with_dist_cross_entropy = falcon.get_lm_forward_with_dist_cross_entropy


def _wrap_dist_cross_entropy(fixed):
    """Replaces `dist_cross_entropy` where shardformer's causal-LM forwards call it (each model's module imports its own
    reference: Llama's, GPT-2's, and Mistral's, Qwen2's, OPT's and Command's, which colossalai-hybrid builds with
    `model.hf_model`)."""
    from colossalai.shardformer.modeling import command, gpt2, llama, mistral, opt, qwen2

    for module in (llama, gpt2, mistral, qwen2, opt, command):
        module.dist_cross_entropy = fixed(module.dist_cross_entropy)


def _colossalai_a2a_full_logits_shift():
    """Colossal-AI 0.5.0: with all_to_all (Ulysses) sequence parallelism and `parallel_output=False`, the last
    hidden states are gathered to the whole sequence, so `dist_cross_entropy` does not split the labels; it then
    shifts labels and logits "in the last rank without splitting" only (loss.py:190-194), and every other
    sequence-parallel rank pairs each position's logits with its own input's label instead of the next one's
    (docs/findings/colossalai-0.5.0-all-to-all-full-logits-labels-not-shifted.py). Fix: with whole-sequence
    logits every rank shifts both, as without sequence parallelism."""
    import torch

    def fixed(original):
        def dist_cross_entropy(labels, logits, shard_config, vocab_size, dtype, seq_dim=1):
            sp, mode = shard_config.sequence_parallel_size or 1, shard_config.sequence_parallelism_mode
            if sp > 1 and mode == "all_to_all" and logits.size(seq_dim) == labels.shape[-1]:
                shifted, kept = labels[..., 1:].contiguous(), logits[..., :-1, :].contiguous()
                loss = torch.nn.functional.cross_entropy(kept.view(-1, kept.size(-1)), shifted.view(-1), reduction="sum")
                return (loss / (shifted != -100).sum()).squeeze()
            return original(labels, logits, shard_config, vocab_size, dtype, seq_dim)

        return dist_cross_entropy

    _wrap_dist_cross_entropy(fixed)


def _colossalai_empty_vocab_shard():
    """Colossal-AI 0.5.0: VocabParallelLMHead1D pads the vocabulary to a multiple of 64 x tp and, with
    parallel_output=True (the plugin's default), returns each rank's valid columns only, so a tensor-parallel rank
    whose shard lies wholly in the padding returns logits of width 0 (vocabulary 16 under tp=2: 128 columns, rank 1's
    64 all padding; any vocabulary below 64 x tp x (tp - 1) can be one). The model's loss (`dist_cross_entropy`,
    loss.py:223) then fails on that rank: "cannot reshape tensor of 0 elements into shape [-1, 0]"
    (docs/findings/colossalai-0.5.0-empty-vocab-shard-loss-crash.py). Fix: such a rank takes one column of -inf
    (no target falls in its range, its exp is 0 in the softmax's sum, its gradient 0)."""
    def fixed(original):
        def dist_cross_entropy(labels, logits, shard_config, vocab_size, dtype, seq_dim=1):
            if shard_config.enable_tensor_parallelism and shard_config.parallel_output:
                logits = _a_column_where_none(logits)
            return original(labels, logits, shard_config, vocab_size, dtype, seq_dim)

        return dist_cross_entropy

    _wrap_dist_cross_entropy(fixed)


def _colossalai_gpt2_lm_head_gather():
    """Colossal-AI 0.5.0: GPT2LMHeadModelPolicy builds the LM head with "gather_output": False whatever
    parallel_output says, so with parallel_output=False each tensor-parallel rank returns its vocabulary shard as the
    logits and transformers' loss on them fails (docs/findings/colossalai-0.5.0-gpt2-lm-head-ignores-parallel-output-false.py).
    Fix: gather_output = not parallel_output, as the Llama policy has it."""
    from colossalai.shardformer.policies.gpt2 import GPT2LMHeadModelPolicy
    from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel

    original = GPT2LMHeadModelPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        for description in policy[GPT2LMHeadModel].sub_module_replacement or []:
            if description.suffix == "lm_head" and "gather_output" in (description.kwargs or {}):
                description.kwargs["gather_output"] = not self.shard_config.parallel_output
        return policy

    GPT2LMHeadModelPolicy.module_policy = module_policy


def _replace_in_method(cls, name, old, new, fix, requires=()):
    """Recompiles method `name` of `cls` (a static method stays one; `cls` may be a module, `name` one of its functions)
    with one passage of its released source replaced, in its module's globals: the upstream fix of a released function
    too long to copy. Raises if the released code is not what the fix was written against: `old` not there once, or a
    passage of `requires` (what the release with the bug has and earlier ones lack) not there."""
    import inspect
    import sys
    import textwrap

    static = isinstance(inspect.getattr_static(cls, name), staticmethod)
    # (A method another fix has already patched: its patched source, so that both fixes apply.)
    source = getattr(getattr(cls, name), "__patched_source__", None) or textwrap.dedent(inspect.getsource(getattr(cls, name)))
    if source.count(old) != 1 or not all(passage in source for passage in requires):
        raise RuntimeError(f"known fix {fix}: the released code it patches has changed")
    if static:
        source = source.replace("@staticmethod\n", "", 1)
    module = cls if inspect.ismodule(cls) else sys.modules[cls.__module__]
    namespace = {}
    exec(compile(source.replace(old, new), inspect.getsourcefile(module), "exec"), module.__dict__, namespace)
    namespace[name].__patched_source__ = ("@staticmethod\n" if static else "") + source.replace(old, new)
    setattr(cls, name, staticmethod(namespace[name]) if static else namespace[name])


def _colossalai_moe_dp_grad_scaler():
    """Colossal-AI 0.5.0: shardformer's expert-parallel MoE blocks (Mixtral's, DeepSeek's, DeepSeek-V3's) wrap each local
    expert in `DPGradScalerIn` / `DPGradScalerOut` (moe/_operation.py), which multiply the gradient into the expert's
    output by moe_dp_size / (the MoE data-parallel ranks that routed it a token) and divide it back on its input: an
    expert's weight gradients, averaged over the moe_dp group afterwards like any other, come out n / k times the
    single-device run's where k of the n ranks routed it tokens
    (docs/findings/colossalai-0.5.0-moe-expert-gradients-scaled-by-active-data-parallel-ranks.py). Fix: both
    scalers the identity (each rank's gradient is already its share of the average)."""
    from colossalai.moe import _operation

    def identity(ctx, *grad_outputs):
        return grad_outputs[0], None, None

    _operation.DPGradScalerIn.backward = staticmethod(identity)
    _operation.DPGradScalerOut.backward = staticmethod(identity)


def _colossalai_moe_amp_clip_groups():
    """Colossal-AI 0.5.0: MoeHybridParallelPlugin.configure builds ZeRO 0's fp16 / bf16 optimizer
    (HybridParallelAMPOptimizer) without its `pp_process_group` and `tp_process_group` (its fp32 optimizer and
    HybridParallelPlugin's AMP optimizer get both), so the optimizer takes pp and tp for 1: the gradient norm it clips
    by is each pipeline stage's and each tensor-parallel rank's local norm, never summed over the stages or the
    tensor-parallel shards; every stage clips by its own, smaller, norm and tensor-parallel replicas drift apart
    (docs/findings/colossalai-0.5.0-moe-amp-clipping-by-local-norm.py). Fix: pass both groups, as the other branch
    does."""
    from colossalai.booster.plugin.moe_hybrid_parallel_plugin import MoeHybridParallelPlugin

    indent = " " * 20  # (the dedented method's)
    old = f"{indent}max_norm=self.max_norm,\n{indent}**self.amp_config,\n"
    new = (f"{indent}max_norm=self.max_norm,\n{indent}pp_process_group=self.pp_group,\n"
           f"{indent}tp_process_group=self.tp_group,\n{indent}**self.amp_config,\n")
    _replace_in_method(MoeHybridParallelPlugin, "configure", old, new, "colossalai-moe-amp-clip-groups")


def _colossalai_moe_dp_sync_unrouted_experts():
    """Colossal-AI 0.5.0: without DDP or ZeRO (ZeRO 0 beside a pipeline) HybridParallelModule.sync_dp_grads
    all-reduces, over the data-parallel group, each parameter's gradient `if p.grad is not None`, a rank-local test.
    An MoE expert that a rank routed no token has no gradient there but has one on the ranks that routed it some:
    the ranks issue different sequences of all-reduces, which pair different experts' gradients (of one shape: a
    silent mix) or tensors of different sizes (gloo aborts, "op.preamble.length <= op.nbytes"), or leave a rank
    waiting (docs/findings/colossalai-0.5.0-moe-pipeline-dp-sync-skips-unrouted-experts.py). Fix: a trainable
    parameter without a gradient takes part with a zero one (its share of the average)."""
    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelModule

    old = "        if p.grad is not None:\n"  # (in the dedented method)
    new = "        if p.grad is None and p.requires_grad:\n            p.grad = torch.zeros_like(p)\n" + old
    _replace_in_method(HybridParallelModule, "sync_dp_grads", old, new, "colossalai-moe-dp-sync-unrouted-experts")


def _colossalai_moe_zero_clip_norm():
    """Colossal-AI 0.5.0: with ep > 1 the MoE plugin's ZeRO optimizer (MoeHybridParallelZeroOptimizer) keeps two
    gradient stores, the dense parameters' (over the data-parallel group) and the experts' (over moe_dp), and
    LowLevelZeroOptimizer.step adds their L2 norms (`norm_group += self._compute_grad_norm(...)`,
    zero/low_level/low_level_optim.py:572-575) instead of their squares; and the experts' norm is all-reduced over
    moe_dp (and tp, pp) only, never over the ep ranks that hold the other experts: every expert-parallel rank clips
    by its own, wrong, norm (docs/findings/colossalai-0.5.0-moe-zero-clip-norm-adds-store-norms.py). Fix: the
    stores' norms combined in quadrature, the experts' squared norm summed over their ep group."""
    import torch
    import torch.distributed as dist
    from colossalai.tensor.moe_tensor.api import get_ep_group, is_moe_tensor
    from colossalai.zero.low_level import low_level_optim

    def store_norm(opt, store, grads):
        norm = opt._compute_grad_norm(dp_pg=store.torch_pg, gradients=grads)
        experts = [p for p in opt.pg_to_param_list.get(store.torch_pg, ()) if is_moe_tensor(p)]
        ep = get_ep_group(experts[0]) if experts else None
        if ep is not None and dist.get_world_size(ep) > 1:
            squared = torch.tensor([float(norm) ** 2], dtype=torch.float64)
            dist.all_reduce(squared, group=ep)
            norm = squared.item() ** 0.5
        return norm

    low_level_optim._shardfuzz_store_norm = store_norm
    old = "norm_group += self._compute_grad_norm(dp_pg=grad_store.torch_pg, gradients=working_grads)\n"
    new = "norm_group = (norm_group**2 + _shardfuzz_store_norm(self, grad_store, working_grads) ** 2) ** 0.5\n"
    _replace_in_method(low_level_optim.LowLevelZeroOptimizer, "step", old, new, "colossalai-moe-zero-clip-norm")


def _colossalai_moe_unsharded_model_save():
    """Colossal-AI 0.5.0: MoECheckpointIO.pre_save_model (checkpoint_io/moe_checkpoint.py:686-722), which a whole
    (unsharded, `shard=False`) model checkpoint goes through, takes the state dict of the boosted wrapper, not of the
    model it wraps (HybridParallelCheckpointIO.save_unsharded_model unwraps first): every key carries the wrapper's
    `module.` prefix, and load_unsharded_model, which unwraps and forces strict=False, loads none of them: the run
    resumes from the freshly built model, silently. With ep > 1 it gathers each expert over the expert-parallel group
    on the ranks whose *global* data-parallel rank is 0 only (ep is a sub-axis of that group: the others never join,
    the save hangs), and would concatenate the ep ranks' i-th held experts along dim 0 under ep rank 0's name, where
    Mixtral's blocks keep their experts' global names (docs/findings/colossalai-0.5.0-moe-unsharded-checkpoint-save.py).
    Fix: the unwrapped model's state dict, and each ep group's MoE data-parallel rank 0 gathering its members'
    experts by name."""
    import torch.distributed as dist
    from colossalai.checkpoint_io.moe_checkpoint import MoECheckpointIO
    from colossalai.tensor.moe_tensor.api import is_moe_tensor

    def pre_save_model(self, model):
        model = model.unwrap()
        state_dict = model.state_dict()
        experts = {n: p.detach().cpu() for n, p in model.named_parameters() if ".experts." in n and is_moe_tensor(p)}
        if self.ep_size > 1 and self.moe_dp_rank == 0:
            out = [None] * self.ep_size if self.ep_rank == 0 else None
            dist.gather_object(experts, out, dst=dist.get_global_rank(self.ep_group, 0), group=self.ep_group)
            for held in out or ():
                state_dict.update(held)
        if self.pp_size > 1 and self.dp_rank == 0:
            out = [None] * self.pp_size if self.pp_rank == 0 else None
            dist.gather_object(state_dict, out, dst=dist.get_global_rank(self.pp_group, 0), group=self.pp_group)
            if self.pp_rank == 0:
                state_dict = {k: v for stage in out for k, v in stage.items()}
        dist.barrier()
        return state_dict

    MoECheckpointIO.pre_save_model = pre_save_model


def _colossalai_moe_unsharded_optimizer_ep_group():
    """Colossal-AI 0.5.0: MoECheckpointIO.load_unsharded_optimizer (checkpoint_io/moe_checkpoint.py:811-897, "Copied
    from colossalai.moe") appends, when ep > 1, an "ep extra group" holding the optimizer's last parameter group's
    parameters once more: 0.5.0's optimizers have no separate expert group, so every parameter of that group is in two
    groups and torch's optimizer steps it twice on every step after the resume, silently
    (docs/findings/colossalai-0.5.0-moe-unsharded-checkpoint-save.py). Fix: no extra group."""
    from colossalai.checkpoint_io.moe_checkpoint import MoECheckpointIO

    _replace_in_method(MoECheckpointIO, "load_unsharded_optimizer", "    if self.ep_size > 1:\n",
                       "    if False:  # (no extra expert group)\n", "colossalai-moe-unsharded-optimizer-ep-group")


def _colossalai_moe_pipeline_dp_sync_expert_group():
    """Colossal-AI 0.5.0: with ZeRO 0 beside a pipeline (where MoeHybridParallelPlugin runs no DDP, so its refusal of
    ep > 1 under DDP does not apply, and its message's hint suggests this very bypass), HybridParallelModule.
    sync_dp_grads averages every gradient over the plugin's whole data-parallel group (moe_dp x ep,
    booster/plugin/moe_hybrid_parallel_plugin.py:459), experts' included: each expert's gradient is averaged with the
    other ep ranks' *other* experts, silently (docs/findings/colossalai-0.5.0-moe-pipeline-dp-sync-averages-experts-
    over-ep.py). Fix: an expert's gradient averaged over its MoE block's moe_dp group."""
    from colossalai.booster.plugin import hybrid_parallel_plugin

    def dp_group_of(wrapper, p):
        if not hasattr(p, "ep_group"):
            return wrapper.dp_group
        groups = wrapper.__dict__.get("_shardfuzz_expert_dp_groups")
        if groups is None:
            groups = {id(q): m.moe_dp_group for m in wrapper.module.modules() if hasattr(m, "moe_dp_group")
                      for q in m.parameters() if hasattr(q, "ep_group")}
            wrapper.__dict__["_shardfuzz_expert_dp_groups"] = groups
        return groups.get(id(p), wrapper.dp_group)

    hybrid_parallel_plugin._shardfuzz_dp_group_of = dp_group_of
    cls, fix = hybrid_parallel_plugin.HybridParallelModule, "colossalai-moe-pipeline-dp-sync-expert-group"
    _replace_in_method(cls, "sync_dp_grads", "dist.all_reduce(p.grad, group=self.dp_group)",
                       "dist.all_reduce(p.grad, group=_shardfuzz_dp_group_of(self, p))", fix)
    _replace_in_method(cls, "sync_dp_grads", "p.grad.div_(self.dp_group.size())",
                       "p.grad.div_(_shardfuzz_dp_group_of(self, p).size())", fix)


def _colossalai_moe_clip_norm_over_ep():
    """Colossal-AI 0.5.0: with ZeRO 0 (beside a pipeline, the only place the MoE plugin runs ep > 1 without ZeRO) the
    plugin's optimizers (HybridParallelNaiveOptimizer, HybridParallelAMPOptimizer) compute the norm they clip by from
    this rank's gradients, all-reduced over tp and pp only: the other ep ranks' experts are never counted, so the norm
    is too small and differs between expert-parallel ranks
    (docs/findings/colossalai-0.5.0-moe-pipeline-dp-sync-averages-experts-over-ep.py). Fix: each expert's squared norm
    summed over its ep group before it is added."""
    import torch
    import torch.distributed as dist
    from colossalai.booster.plugin import hybrid_parallel_plugin as hpp

    def over_ep(param, exponentiated):
        group = getattr(param, "ep_group", None)
        if group is None or dist.get_world_size(group) == 1:
            return exponentiated
        total = torch.tensor([float(exponentiated)], dtype=torch.float64)
        dist.all_reduce(total, group=group)
        return total.item()

    hpp._shardfuzz_over_ep = over_ep
    old = "total_norm_exponentiated += grad_norm_exponentiated\n"
    new = "total_norm_exponentiated += _shardfuzz_over_ep(grad_to_param_mapping[id(grad)], grad_norm_exponentiated)\n"
    for cls in (hpp.HybridParallelNaiveOptimizer, hpp.HybridParallelAMPOptimizer):
        _replace_in_method(cls, "_compute_grad_norm", old, new, "colossalai-moe-clip-norm-over-ep")


def _colossalai_mixtral_tied_padded_logits():
    """Colossal-AI 0.5.0: MixtralPolicy pads a tied embedding's vocabulary to make_vocab_size_divisible_by
    (PaddingEmbedding) when there is no tensor parallelism, but MixtralForCausalLMPolicy leaves the LM head, which shares
    the padded weight, a plain Linear: the model returns logits over the padded vocabulary (64 columns for 13), its
    own loss fails to view them ("shape '[-1, 13]' is invalid"), and a loss on them counts the padding classes
    (docs/findings/colossalai-0.5.0-mixtral-tied-embeddings-padded-logits.py). Under tensor parallelism the same:
    the embedding a VocabParallelEmbedding1D padded to a multiple of 64 x tp, the head a Linear1D_Col over it
    (gather_output) with every padding column. Fix: the LM head a PaddingLMHead, or under tensor parallelism a
    VocabParallelLMHead1D gathering its output, as LlamaForCausalLMPolicy makes them (their forward cuts the padding
    off)."""
    from colossalai.shardformer.policies.mixtral import MixtralForCausalLMPolicy
    from transformers.models.mixtral.modeling_mixtral import MixtralForCausalLM

    _pad_tied_lm_head(MixtralForCausalLMPolicy, MixtralForCausalLM)


def _pad_tied_lm_head(policy_cls, causal_lm, head_kwargs=lambda policy: {}):
    """Makes `policy_cls` (a causal-LM policy whose model class is keyed `causal_lm` in its policy) pad a tied LM head
    as its embedding is padded: a PaddingLMHead, or under tensor parallelism a VocabParallelLMHead1D in place of its
    Linear1D_Col (with `head_kwargs(policy)` added), as LlamaForCausalLMPolicy makes them."""
    from colossalai.shardformer.layer import Linear1D_Col, PaddingLMHead, VocabParallelLMHead1D
    from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, SubModuleReplacementDescription

    original = policy_cls.module_policy

    def module_policy(self):
        policy = original(self)
        zbv = self.pipeline_stage_manager is not None and self.pipeline_stage_manager.use_zbv
        divisor = self.shard_config.make_vocab_size_divisible_by
        if self.tie_weight and self.shard_config.enable_tensor_parallelism:
            for d in policy[causal_lm].sub_module_replacement:
                if d.suffix == "lm_head" and d.target_module is Linear1D_Col:
                    d.target_module = VocabParallelLMHead1D
                    d.kwargs = {**d.kwargs, "make_vocab_size_divisible_by": divisor, **head_kwargs(self)}
        elif self.tie_weight and not zbv:
            head = SubModuleReplacementDescription(suffix="lm_head", target_module=PaddingLMHead, kwargs={
                "make_vocab_size_divisible_by": divisor})
            description = policy.setdefault(causal_lm, ModulePolicyDescription(sub_module_replacement=[]))
            description.sub_module_replacement = [*(description.sub_module_replacement or []), head]
        return policy

    policy_cls.module_policy = module_policy


def _colossalai_qwen2_lm_head_gather():
    """Colossal-AI 0.5.0: Qwen2ForCausalLMPolicy (policies/qwen2.py:421-433) makes the LM head a Linear1D_Col without
    `gather_output`, whatever parallel_output says: with parallel_output=False each tensor-parallel rank returns its
    vocabulary shard as the logits, and `dist_cross_entropy`, told the logits are whole, takes a plain cross-entropy
    over the shard (labels past the shard fail, "Target 12 is out of bounds"; the others are scored against another
    class) (docs/findings/colossalai-0.5.0-qwen2-lm-head-ignores-parallel-output-false.py). The GPT-2 policy had the
    same flaw (`colossalai-gpt2-lm-head-gather`). Fix: gather_output = not parallel_output, as the Llama and Mistral
    policies have it."""
    from colossalai.shardformer.layer import Linear1D_Col
    # (The policy's own key: the class's name where its import of transformers' Qwen2 classes fails, as on 4.51.)
    from colossalai.shardformer.policies.qwen2 import Qwen2ForCausalLM, Qwen2ForCausalLMPolicy

    original = Qwen2ForCausalLMPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        description = policy.get(Qwen2ForCausalLM)
        for d in (description.sub_module_replacement or []) if description else []:
            if d.suffix == "lm_head" and d.target_module is Linear1D_Col:
                d.kwargs = {**(d.kwargs or {}), "gather_output": not self.shard_config.parallel_output}
        return policy

    Qwen2ForCausalLMPolicy.module_policy = module_policy


def _colossalai_opt_untied_lm_head_bound():
    """Colossal-AI 0.5.0: OPTForCausalLMPolicy.postprocess (policies/opt.py:433-444) sets `lm_head.weight =
    model.decoder.embed_tokens.weight` under tensor parallelism without a pipeline, whether or not the model ties its
    embeddings: an OPT with its own LM head (`tie_word_embeddings=False`) silently loses it, and trains its input
    embedding as the output projection (docs/findings/colossalai-0.5.0-opt-untied-lm-head-bound-to-embedding.py).
    Fix: bind them only where the model tied them (the policy's own `tie_weight`, taken in preprocess)."""
    from colossalai.shardformer.policies.opt import OPTForCausalLMPolicy

    original = OPTForCausalLMPolicy.postprocess

    def postprocess(self):
        return original(self) if self.tie_weight else self.model

    OPTForCausalLMPolicy.postprocess = postprocess


def _colossalai_opt_interleaved_stage_indices():
    """Colossal-AI 0.5.0: the interleaved schedule hands each model chunk its layers from
    `stage_manager.stage_indices` (interleaved_pp.py:314), which each policy's `set_pipeline_forward` records (Llama's,
    GPT-2's, Mistral's, Qwen2's); OPTPolicy's (policies/opt.py:319-339) does not, though its get_held_layers lays out
    interleaved chunks, so an OPT under `pp_style="interleaved"` fails at its first forward ("'PipelineStageManager'
    object has no attribute 'stage_indices'";
    docs/findings/colossalai-0.5.0-opt-interleaved-pipeline-no-stage-indices-crash.py). Fix: record them as the Llama
    policy does."""
    from colossalai.shardformer.policies.opt import OPTPolicy

    _record_interleaved_stage_indices(OPTPolicy, lambda model: len(
        (model.decoder if model.__class__.__name__ == "OPTModel" else model.model.decoder).layers))


def _record_interleaved_stage_indices(policy_cls, layer_count):
    """`policy_cls.set_pipeline_forward` recording the interleaved chunks' layer ranges (`stage_indices`) first, as
    LlamaPolicy's does; `layer_count(model)`: the decoder layers of the policy's model."""
    original = policy_cls.set_pipeline_forward

    def set_pipeline_forward(self, model_cls, new_forward, policy):
        manager = self.pipeline_stage_manager
        if manager is not None and manager.is_interleave:
            manager.stage_indices = manager.get_stage_index(manager.distribute_layers(layer_count(self.model)))
        return original(self, model_cls, new_forward, policy)

    policy_cls.set_pipeline_forward = set_pipeline_forward


def _colossalai_falcon_interleaved_stage_indices():
    """Colossal-AI 0.5.0: the interleaved schedule hands each model chunk its layers from
    `stage_manager.stage_indices` (interleaved_pp.py:314), which FalconPolicy.set_pipeline_forward
    (policies/falcon.py:219-238) never records, though its get_held_layers lays out interleaved chunks: a Falcon under
    `pp_style="interleaved"` fails at its first forward ("'PipelineStageManager' object has no attribute
    'stage_indices'"; docs/findings/colossalai-0.5.0-falcon-interleaved-pipeline-no-stage-indices-crash.py), as the
    OPT's policy does (`colossalai-opt-interleaved-stage-indices`). Fix: record them as the Llama policy does."""
    from colossalai.shardformer.policies.falcon import FalconPolicy

    _record_interleaved_stage_indices(FalconPolicy, lambda model: len(
        (model if model.__class__.__name__ == "FalconModel" else model.transformer).h))


def _colossalai_tied_head_sharded_load():
    """Colossal-AI 0.5.0: a model with tied embeddings saved by HybridParallelCheckpointIO's sharded checkpoint from
    one pipeline stage holds the tied weight once, under the input embedding's key; loaded into several stages, the
    LM head on the last stage (its weight held under the head's own name there) is looked up by that name and, with
    `strict = False` hard-coded (checkpoint_io/hybrid_parallel_checkpoint_io.py:395), skipped in silence: the last
    stage keeps the fresh model's head (docs/findings/colossalai-0.5.0-tied-lm-head-not-loaded-into-pipeline-stage.py).
    The optimizer's state is keyed by the tied parameter's id and loads. Fix: where the checkpoint lacks the head's key
    and the model ties it, load the input embedding's tensor into the head, through the head module's own loading
    (padding, vocabulary shards)."""
    import os
    from pathlib import Path

    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as io

    original = io.HybridParallelCheckpointIO.load_sharded_model

    def load_sharded_model(self, model, checkpoint_index_file, *args, **kwargs):
        result = original(self, model, checkpoint_index_file, *args, **kwargs)
        inner = model.unwrap()
        head, embedding = inner.get_output_embeddings(), inner.get_input_embeddings()
        if not getattr(inner.config, "tie_word_embeddings", False) or head is None or head.weight is None:
            return result
        names = {id(module): name for name, module in inner.named_modules()}
        head_key, embedding_key = names[id(head)] + ".weight", names[id(embedding)] + ".weight"
        index = io.CheckpointIndexFile.from_file(checkpoint_index_file)
        if head_key in index.weight_map or embedding_key not in index.weight_map:
            return result
        path = Path(os.path.join(index.root_path, index.weight_map[embedding_key]))
        tensor = io.load_shard_state_dict(path, "safetensors" in Path(checkpoint_index_file).name)[embedding_key]
        io.load_state_dict_into_model(inner, {head_key: tensor}, missing_keys=[], strict=False, load_sub_module=True)
        model.update_master_params()
        return result

    io.HybridParallelCheckpointIO.load_sharded_model = load_sharded_model


def _colossalai_mistral_pipeline_checkpoint_kwargs():
    """Colossal-AI 0.5.0: the Mistral's pipeline forward (MistralForwards.mistral_model_forward,
    shardformer/modeling/mistral.py:137-147) passes each decoder layer's inputs to `_gradient_checkpointing_func` as
    keyword arguments, which the re-entrant torch.utils.checkpoint (transformers' default for
    gradient_checkpointing_enable) refuses: a Mistral under a pipeline with activation checkpointing fails at its first
    forward ("Unexpected keyword arguments: attention_mask,position_ids,...";
    docs/findings/colossalai-0.5.0-mistral-pipeline-checkpoint-keyword-arguments-crash.py). The Llama's, Qwen2's and
    Mixtral's copies pass them positionally. Fix: pass them positionally, in the decoder layer's order."""
    from colossalai.shardformer.modeling.mistral import MistralForwards

    original = MistralForwards.mistral_model_forward
    order = ("attention_mask", "position_ids", "past_key_value", "output_attentions", "use_cache", "cache_position",
             "position_embeddings")

    def mistral_model_forward(self, *args, **kwargs):
        checkpoint = getattr(self, "_gradient_checkpointing_func", None)
        if checkpoint is None:
            return original(self, *args, **kwargs)

        def positional(layer, hidden_states, **named):
            return checkpoint(layer, hidden_states, *(named.pop(k) for k in order), **named)

        self._gradient_checkpointing_func = positional
        try:
            return original(self, *args, **kwargs)
        finally:
            self._gradient_checkpointing_func = checkpoint

    MistralForwards.mistral_model_forward = staticmethod(mistral_model_forward)


def _colossalai_qwen2_tied_padded_logits():
    """Colossal-AI 0.5.0: Qwen2Policy pads a tied embedding's vocabulary to a multiple of make_vocab_size_divisible_by
    (64 by default; PaddingEmbedding, or under tensor parallelism VocabParallelEmbedding1D to a multiple of 64 x tp)
    while Qwen2ForCausalLMPolicy leaves the LM head that shares the padded weight a plain Linear (a Linear1D_Col under
    tensor parallelism): the logits carry every padding class, each a logit of 0 that the softmax counts, so the loss
    and every gradient are wrong whenever the vocabulary is padded (a 16-token vocabulary with dp 2: the loss 1.1 %
    off; a 151,936-token one from tp 4 on), and across pipeline stages the tied weights' all-reduce pairs the padded
    embedding with the unpadded head (gloo aborts, "512 vs 128")
    (docs/findings/colossalai-0.5.0-qwen2-tied-embeddings-padded-logits.py). The Mixtral policy had the same flaw
    (`colossalai-mixtral-tied-padded-logits`). Fix: with tied embeddings the LM head a PaddingLMHead, or under tensor
    parallelism a VocabParallelLMHead1D (gathering its output unless parallel_output), as LlamaForCausalLMPolicy makes
    them (their forward cuts the padding off)."""
    # (The policy's own key: the class's name where its import of transformers' Qwen2 classes fails, as on 4.51.)
    from colossalai.shardformer.policies.qwen2 import Qwen2ForCausalLM, Qwen2ForCausalLMPolicy

    _pad_tied_lm_head(Qwen2ForCausalLMPolicy, Qwen2ForCausalLM,
                      lambda policy: {"gather_output": not policy.shard_config.parallel_output})


def _colossalai_gpt2_pipeline_loss_unbound():
    """Colossal-AI 0.5.0: GPT2PipelineForwards.gpt2_lmhead_model_forward assigns `loss` only `if labels is not None`
    (modeling/gpt2.py:414) and returns it anyway, so the last pipeline stage raises UnboundLocalError whenever the
    model is called without labels (a criterion on the logits, or inference)
    (docs/findings/colossalai-0.5.0-gpt2-pipeline-forward-without-labels-crash.py). The policy installs the same
    forward under tensor parallelism with parallel_output=True (the plugin's default, policies/gpt2.py:414), where it
    fails the same way without a pipeline. Fix: `loss = None` first."""
    from colossalai.shardformer.modeling import gpt2

    anchor = "\n    lm_logits = self.lm_head(hidden_states)\n"  # (in the dedented method)
    _replace_in_method(gpt2.GPT2PipelineForwards, "gpt2_lmhead_model_forward", anchor, anchor + "    loss = None\n",
                       "colossalai-gpt2-pipeline-loss-unbound")


def _colossalai_clip_norm_customized_tensors():
    """Colossal-AI 0.5.0: HybridParallelPlugin's gradient norm (for clipping; all three of its optimizers) divides
    the squared norm of every parameter that is not `is_distributed_tensor` by tp_size before summing over the
    tensor-parallel group, taking it for a replica; GPT-2's fused column-parallel weights (c_attn, c_fc) are
    sharded as *customized* distributed tensors, so their shards count as a mean instead of a sum and the norm is
    too small (docs/findings/colossalai-0.5.0-clip-grad-norm-gpt2-fused-shards-undercounted.py). Fix: count a
    customized distributed tensor as sharded too."""
    from colossalai.booster.plugin import hybrid_parallel_plugin
    from colossalai.tensor.d_tensor import is_customized_distributed_tensor, is_distributed_tensor

    hybrid_parallel_plugin.is_distributed_tensor = lambda t: is_distributed_tensor(t) or is_customized_distributed_tensor(t)


def _colossalai_empty_grad_norm_collective():
    """Colossal-AI 0.5.0: each of HybridParallelPlugin's three optimizers computes the clipping norm in
    `_compute_grad_norm`, which returns 0.0 at once when the rank holds no gradient, before the all-reduces over
    the tensor- and pipeline-parallel (ZeRO: data-parallel) groups that every other rank enters: a pipeline stage
    without a trainable parameter (a stage holding no layer, or only frozen ones) skips them, and the others wait
    forever (docs/findings/colossalai-0.5.0-grad-norm-early-return-skips-collective.py). Fix: a rank without
    gradients takes part with a zero contribution."""
    import torch
    from colossalai.booster.plugin import hybrid_parallel_plugin as hpp

    def zero():
        z = torch.zeros(1, dtype=torch.float32)
        z.shardfuzz_zero_norm = True
        return z

    for cls in (hpp.HybridParallelNaiveOptimizer, hpp.HybridParallelAMPOptimizer):
        def pairs_norm(self, pairs, norm_type=2, _real=cls._compute_grad_norm):
            return _real(self, pairs if pairs else [(zero(), zero())], norm_type)

        cls._compute_grad_norm = pairs_norm

    def zero_norm(self, dp_pg, gradients, norm_type=2, _real=hpp.HybridParallelZeroOptimizer._compute_grad_norm):
        return _real(self, dp_pg, gradients if gradients else [zero()], norm_type)

    hpp.HybridParallelZeroOptimizer._compute_grad_norm = zero_norm

    # Under tp the ZeRO optimizer's norm looks each gradient's parameter up by the gradient's id: the zero stands for
    # itself (a parameter that is not distributed, so its zero is divided by tp_size, and shared by no stage).
    def param_id_for_grad(self, grad, _real=hpp.HybridParallelZeroOptimizer.get_param_id_for_grad):
        return id(grad) if getattr(grad, "shardfuzz_zero_norm", False) else _real(self, grad)

    hpp.HybridParallelZeroOptimizer.get_param_id_for_grad = param_id_for_grad


def _deepspeed_zero3_predivide_world():
    """DeepSpeed 0.19.8: ZeRO-3 without reduce-scatter (`"reduce_scatter": false`) with a
    `gradient_predivide_factor` f divides every gradient by f and by the world size W before the reduction and
    multiplies by f after it only when f != W (stage3.py:1872-1883, and :1922-1935 without contiguous gradients;
    ZeRO-1/2 divide by f alone, where that skip is right): with f == W every gradient is divided by W twice
    (docs/findings/deepspeed-0.19.8-zero3-predivide-factor-equal-to-world-size.py). Fix: multiply by f whenever
    f != 1, as the ZeRO-1/2 arithmetic amounts to."""
    import torch.distributed as dist
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    for name in ("_DeepSpeedZeroOptimizer_Stage3__avg_scatter_contiguous_grads",
                 "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads"):
        original = getattr(Stage3, name)

        def avg_scatter(self, *args, _original=original):
            partitions = _original(self, *args)
            f = self.gradient_predivide_factor
            if self.postscale_gradients and f != 1.0 and f == dist.get_world_size(self.dp_process_group):
                for p in partitions:
                    p.mul_(f)
            return partitions

        setattr(Stage3, name, avg_scatter)


def _deepspeed_sparse_predivide():
    """DeepSpeed 0.19.8: DeepSpeedEngine.sparse_allreduce (a sparse gradient: nn.Embedding(sparse=True), ZeRO
    stage 0) scales the values by f / W before its all-gather sum when `gradient_predivide_factor` f is set and
    never divides by f, where the dense all-reduce divides by f before and multiplies by f / W after (engine.py
    :3963-3965 against :3807-3813): sparse gradients come out f times the average
    (docs/findings/deepspeed-0.19.8-sparse-gradient-predivide-factor.py). Fix: divide by f first."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    original = DeepSpeedEngine.sparse_allreduce

    def sparse_allreduce(self, sparse, dp_group, dp_world_size=None):
        f = self.gradient_predivide_factor()
        if self.gradient_average and self.postscale_gradients() and f != 1.0:
            sparse.values = sparse.values / f
        return original(self, sparse, dp_group, dp_world_size)

    DeepSpeedEngine.sparse_allreduce = sparse_allreduce


def _deepspeed_sparse_clip():
    """DeepSpeed 0.19.8: the engine's fp32 gradient clipping (deepspeed.runtime.utils.clip_grad_norm_, ZeRO stage
    0 without bf16 / fp16) scales each gradient by `p.grad.data.mul_(clip_coef)`; on a sparse gradient the
    in-place product lands on the `.data` alias only, so sparse embedding gradients are never clipped while the
    norm counts them (docs/findings/deepspeed-0.19.8-sparse-gradient-not-clipped.py). Fix: scale sparse gradients
    themselves by the same coefficient."""
    import deepspeed.runtime.engine as engine

    original = engine.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, norm_type=2, mpu=None):
        parameters = [p for p in ([parameters] if hasattr(parameters, "grad") else parameters) if p.grad is not None]
        total_norm = original(parameters, max_norm, norm_type=norm_type, mpu=mpu)
        coef = min(1.0, float(max_norm) / (float(total_norm) + 1e-6))
        for p in parameters:
            if p.grad.is_sparse:
                p.grad = p.grad * coef
        return total_norm

    engine.clip_grad_norm_ = clip_grad_norm_


def _deepspeed_round_robin_hp_link():
    """DeepSpeed 0.19.8: with `round_robin_gradients`, ZeRO-1/2 lay the flat buffer out in round-robin order, but
    `_link_all_hp_params` passes the layout's offsets to `link_hp_params` only when some parameter is padded; with
    none padded, the fragments of the fp32 partition and of the reduced gradients are assigned in model order, so
    `safe_get_full_grad` / `safe_get_full_fp32_param` (and everything built on the hp mapping) read another
    parameter's fragment, or raise a size mismatch (docs/findings/deepspeed-0.19.8-round-robin-hp-mapping.py).
    Fix: pass the round-robin offsets whenever the order is round robin."""
    import deepspeed.comm as dist
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from deepspeed.utils import link_hp_params

    def _link_all_hp_params(self):
        if self.cpu_offload:
            self._get_offload_gradient_dict()
        for i, _ in enumerate(self.optimizer.param_groups):
            group = self.real_dp_process_group[i]
            partition_id = dist.get_rank(group=group)
            partition_size = self.bit16_groups_flat[i].numel() // dist.get_world_size(group=group)
            param_offsets = None
            if self.round_robin_gradients or any(self.round_robin_bit16_padding[i]):
                offset_by_param = {id(p): o for p, o in zip(self.round_robin_bit16_groups[i],
                                                            self.round_robin_bit16_offsets[i])}
                param_offsets = [offset_by_param[id(p)] for p in self.bit16_groups[i]]
            link_hp_params(lp_param_list=self.bit16_groups[i], flat_hp_partition=self.single_partition_of_fp32_groups[i],
                           gradient_dict=self.averaged_gradients, offload_gradient_dict=self.offload_gradient_dict,
                           use_offload=self.cpu_offload, param_group_index=i,
                           partition_start=partition_id * partition_size, partition_size=partition_size,
                           dp_group=group, param_offsets=param_offsets)

    DeepSpeedZeroOptimizer._link_all_hp_params = _link_all_hp_params


def _deepspeed_zero3_universal_step_per_sub_group():
    """DeepSpeed 0.19.8 (found 2026-12-06 through `train.checkpoint_layout` universal): ZeRO-3's universal checkpoint
    loader (`load_hp_checkpoint_state_from_checkpoint_dir_stage3`) reads one `step` from the checkpoint and sets that
    object as the state of every optimizer sub-group (`sub_group_size`); torch's Adam keeps `step` as a tensor it
    increments in place, so each step after the resume advances the count once per sub-group and every sub-group's
    update is bias-corrected for the wrong step: silently wrong training whenever a rank's partition spans more than
    one sub-group (docs/findings/deepspeed-0.19.8-zero3-universal-checkpoint-shared-step-across-sub-groups.py).
    Fix: each sub-group its own copy."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    _replace_in_method(DeepSpeedZeroOptimizer_Stage3, "load_hp_checkpoint_state_from_checkpoint_dir_stage3",
                       "self.optimizer.state[fp32_param]['step'] = state_step",
                       "self.optimizer.state[fp32_param]['step'] = (state_step.clone() if torch.is_tensor(state_step)"
                       " else state_step)",
                       "deepspeed-zero3-universal-step-per-sub-group")


def _deepspeed_zero3_universal_param_group_hyperparameters():
    """DeepSpeed 0.19.8 (found 2026-12-06 by campaign 296, `train.checkpoint_layout` universal): ZeRO-3's universal
    checkpoint loader (`load_hp_checkpoint_state_from_checkpoint_dir_stage3`) sets every optimizer parameter group's
    hyperparameters from the checkpoint's first group ("Generally, the hyperparameters of each parameter should be
    the same"), so a run with groups that differ (no weight decay on norms and biases, the usual recipe; per-group
    learning rates) resumes with the first group's weight decay and learning rate everywhere: silently wrong
    training (docs/findings/deepspeed-0.19.8-zero3-universal-checkpoint-first-param-group-everywhere.py). ZeRO-1/2's
    universal loader and DeepSpeed's own checkpoints keep each group's. Fix: each group its own saved group."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    _replace_in_method(DeepSpeedZeroOptimizer_Stage3, "load_hp_checkpoint_state_from_checkpoint_dir_stage3",
                       "for param_group in self.optimizer.param_groups:\n"
                       "        # Generally, the hyperparameters of each parameter should be the same, we can obtain from any "
                       "parameter.\n"
                       "        for key, value in optim_sd[OPTIMIZER_STATE_DICT][\"param_groups\"][0].items():",
                       "for group_index, param_group in enumerate(self.optimizer.param_groups):\n"
                       "        for key, value in optim_sd[OPTIMIZER_STATE_DICT][\"param_groups\"][group_index].items():",
                       "deepspeed-zero3-universal-param-group-hyperparameters")


def _deepspeed_zero3_universal_autotp_from_bare_tensors():
    """DeepSpeed 0.19.8 (found 2026-12-06 through `train.resume_parallel` with other degrees): ds_to_universal writes
    a ZeRO-3 checkpoint without tensor parallelism as bare tensors (`merge_zero3_slices` saves `slices[0]`), one with
    AutoTP as `{"param": tensor}` dicts (`merge_tp_slices`), and ZeRO-3's universal loader (`load_hp_checkpoint_state`)
    cuts a parameter's tensor-parallel shard out of the full one only from a dict: a plain ZeRO-3 run resumed under
    AutoTP, the universal checkpoint's purpose, partitions every sharded layer's whole weight over the data-parallel
    ranks and overruns the rank's flat partition ("start + length exceeds dimension size")
    (docs/findings/deepspeed-0.19.8-zero3-universal-checkpoint-into-autotp-whole-weights.py). Fix: resolve the shard
    for a bare tensor as for a dict."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    _replace_in_method(DeepSpeedZeroOptimizer_Stage3, "load_hp_checkpoint_state",
                       "if param is not None and isinstance(ckpt_dict, dict):",
                       "if param is not None and (isinstance(ckpt_dict, dict) or torch.is_tensor(ckpt_dict)):",
                       "deepspeed-zero3-universal-autotp-from-bare-tensors")


def _deepspeed_zero12_checkpoint_round_robin_order():
    """DeepSpeed 0.19.8 (found 2026-12-06 through `train.resume_parallel`): ZeRO-1/2 lay each parameter group's flat
    partitions out in round-robin order under `round_robin_gradients` and in model order otherwise, and their own
    checkpoint stores the flat fp32 partitions and optimizer states without the order; `_load_legacy_checkpoint`
    refuses a changed parameter-alignment layout but copies a changed order verbatim, so a run resumed with the
    option toggled trains every parameter from another parameter's master weights and moments, silently
    (docs/findings/deepspeed-0.19.8-zero12-checkpoint-round-robin-order-loaded-verbatim.py). Fix: the state dict
    records the order; a load into another order moves each parameter's slice of the saved flat state (every rank's
    partition, gathered from its rank) to its offset in the current layout. (The script's `--fixed` refuses such a
    load instead, as DeepSpeed refuses another alignment layout; this fix lets the case's run go on.)"""
    import torch
    import deepspeed.comm as dist
    from deepspeed.checkpoint.constants import (BASE_OPTIMIZER_STATE, PARAM_ALIGNMENT_PADDINGS,
                                                SINGLE_PARTITION_OF_FP32_GROUPS)
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    key = "shardfuzz_round_robin_indices"
    state_dict, load = DeepSpeedZeroOptimizer.state_dict, DeepSpeedZeroOptimizer._load_legacy_checkpoint

    def with_order(self):
        return {**state_dict(self), key: [list(ix) for ix in self.round_robin_bit16_indices]}

    def offsets(order, paddings, numels):
        out, at = {}, 0
        for k, pad in zip(order, paddings):
            out[k], at = at, at + numels[k] + pad
        return out

    def moved(self, i, pieces, saved_order, saved_padding):
        numels = [p.numel() for p in self.bit16_groups[i]]
        full, size = torch.cat([t.reshape(-1) for t in pieces]), pieces[0].numel()
        out = torch.zeros(size * len(pieces), dtype=full.dtype)
        old = offsets(saved_order, saved_padding, numels)
        new = offsets(self.round_robin_bit16_indices[i], self.round_robin_bit16_padding[i], numels)
        for k, n in enumerate(numels):
            out[new[k]:new[k] + n] = full[old[k]:old[k] + n]
        rank = dist.get_rank(group=self.real_dp_process_group[i])
        return out[rank * size:(rank + 1) * size]

    def every_ranks(self, i, t):
        # (The engine reads only this rank's file of a rigid checkpoint: the others' partitions come from their ranks.)
        out = [None] * dist.get_world_size(group=self.real_dp_process_group[i])
        torch.distributed.all_gather_object(out, t, group=self.real_dp_process_group[i])
        return out

    def _load_legacy_checkpoint(self, state_dict_list, load_optimizer_states=True, load_from_fp32_weights=False):
        sd = state_dict_list[dist.get_rank(group=self.dp_process_group)]
        saved = sd.get(key)
        if saved is not None and saved != [list(ix) for ix in self.round_robin_bit16_indices] and \
                isinstance(sd[BASE_OPTIMIZER_STATE], dict) and not self.has_moe_layers:
            for i in range(len(self.bit16_groups)):
                padding = sd[PARAM_ALIGNMENT_PADDINGS][i]
                size = self.single_partition_of_fp32_groups[i].numel()
                fp32 = sd[SINGLE_PARTITION_OF_FP32_GROUPS][i]  # (saved without the group's trailing padding)
                fp32 = torch.cat([fp32.reshape(-1), fp32.new_zeros(size - fp32.numel())])
                sd[SINGLE_PARTITION_OF_FP32_GROUPS][i] = moved(self, i, every_ranks(self, i, fp32), saved[i], padding)
                state = sd[BASE_OPTIMIZER_STATE]["state"].get(i, {})
                for name in sorted(state):
                    if torch.is_tensor(state[name]) and state[name].dim() > 0:
                        state[name] = moved(self, i, every_ranks(self, i, state[name]), saved[i], padding)
            sd[PARAM_ALIGNMENT_PADDINGS] = self.round_robin_bit16_padding
        return load(self, state_dict_list, load_optimizer_states, load_from_fp32_weights)

    DeepSpeedZeroOptimizer.state_dict = with_order
    DeepSpeedZeroOptimizer._load_legacy_checkpoint = _load_legacy_checkpoint


def _deepspeed_zero2_accumulation_last_micro_batch():
    """DeepSpeed 0.17.6 to 0.18.2 (introduced by deepspeedai/DeepSpeed#7509, fixed by #7665 in 0.18.3; reported as
    #7718): ZeRO-1/2 without offload keep only the last micro-batch's gradient under gradient accumulation.
    `independent_gradient_partition_epilogue` starts a fresh accumulation whenever `averaged_gradients[i]` is unset,
    which since #7509 is so at every micro-batch but the boundary, so each micro-batch overwrites `all_grad_tensors`
    (docs/findings/deepspeed-0.17.6-zero2-accumulation-keeps-last-micro-batch.py). Fix (#7665's line): test the
    accumulator itself."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    _replace_in_method(DeepSpeedZeroOptimizer, "independent_gradient_partition_epilogue",
                       "if not i in self.averaged_gradients or self.averaged_gradients[i] is None:",
                       "if i not in self.all_grad_tensors or self.all_grad_tensors[i] is None:",
                       "deepspeed-zero2-accumulation-last-micro-batch",
                       requires=("self.all_grad_tensors[i] = ",))  # #7509's accumulator (0.16.9 has the line, not it)


def _deepspeed_pipeline_micro_batch_gradients_summed():
    """DeepSpeed up to 0.18 (#7773): the pipeline engine sums a step's micro-batch gradients instead of averaging them.
    Its last stage backpropagates through `DeepSpeedEngine.backward`, whose `_backward_prologue` divides the loss by the
    gradient-accumulation steps only where `enable_backward_allreduce` is set, which the pipeline engine (reducing
    itself) clears: every stage's gradients come out the micro-batch count times too large
    (docs/findings/deepspeed-0.17.6-pipeline-gradients-summed-over-micro-batches.py). Fix: the last stage's loss divided
    by the micro-batch count before its backward, as later releases' scaling of the last stage's output gradients
    (`_backward_prologue_per_tensor`) does; those releases need nothing."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    if "_backward_prologue_per_tensor" in vars(PipelineEngine):
        return
    original = PipelineEngine._exec_backward_pass

    def exec_backward_pass(self, buffer_id):
        if not (self.is_last_stage() and self.gradient_accumulation_steps() > 1):
            return original(self, buffer_id)
        loss = self.loss
        self.loss = loss / self.gradient_accumulation_steps()
        try:
            return original(self, buffer_id)
        finally:
            self.loss = loss

    # (The engine runs schedule instructions through its class's `_INSTRUCTION_MAP`, built with the methods.)
    from deepspeed.runtime.pipe import schedule

    PipelineEngine._exec_backward_pass = exec_backward_pass
    PipelineEngine._INSTRUCTION_MAP[schedule.BackwardPass] = exec_backward_pass

def _deepspeed_offload_accumulation_middle_micro_batches():
    """DeepSpeed 0.15.x to 0.18.x (introduced by deepspeedai/DeepSpeed#6550, fixed by #7967, in 0.19.0): ZeRO-1/2 with
    the optimizer offloaded to the CPU drop every micro-batch but the first and the last under gradient accumulation
    of 3 or more. `async_accumulate_grad_in_cpu_via_gpu` adds the CPU accumulator into a later micro-batch's gradient
    but copies the sum back only at micro-batch 0, so micro-batch 2 starts again from micro-batch 0's gradient
    (docs/findings/deepspeed-0.17.6-zero2-offload-accumulation-drops-middle-micro-batches.py). Fix (#7967's): copy
    back at every micro-batch."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    _replace_in_method(DeepSpeedZeroOptimizer, "async_accumulate_grad_in_cpu_via_gpu",
                       "if self.micro_step_id > 0:\n        accumulate_gradients()\n    else:\n        copy_gradients_to_cpu()",
                       "if self.micro_step_id > 0:\n        accumulate_gradients()\n    copy_gradients_to_cpu()",
                       "deepspeed-offload-accumulation-middle-micro-batches")


def _deepspeed_cpu_bucket_type_strings():
    """DeepSpeed before 0.19.8 (since #2677, 2023; fixed by deepspeedai/DeepSpeed#8382): on the CPU accelerator,
    ZeRO-1/2 without contiguous gradients never all-reduce them. `split_half_float_double` buckets gradients by
    legacy type strings built from the device name ("torch.cpu.FloatTensor"), which no CPU tensor reports
    ("torch.FloatTensor"), so every bucket is empty and each rank steps its partition on its own local gradient
    (docs/findings/deepspeed-0.17.6-cpu-non-contiguous-gradients-never-reduced.py). Fix (#8382's): bucket by dtype."""
    import torch
    from deepspeed.runtime.zero import stage_1_and_2

    def split_half_float_double(tensors):
        buckets = []
        for dtype in (torch.half, torch.float, torch.double, torch.bfloat16):
            bucket = [t for t in tensors if t.dtype == dtype and t.layout == torch.strided]
            if bucket:
                buckets.append(bucket)
        return buckets

    stage_1_and_2.split_half_float_double = split_half_float_double


def _deepspeed_zero3_hpz_secondary_after_load():
    """DeepSpeed before 0.18.3 (reported as deepspeedai/DeepSpeed#7606 on 0.16.9, fixed by #7707): ZeRO-3 with ZeRO++
    hierarchical partitioning (`zero_hpz_partition_size` > 1) gathers parameters from their secondary partition,
    which `load_checkpoint` never refreshes: the first step after loading runs on the weights the engine was built
    with (docs/findings/deepspeed-0.17.6-zero3-hpz-stale-secondary-partition-after-load.py). Fix (#7707's):
    `checkpoint_event_epilogue` drops the secondary partitions."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    original = DeepSpeedZeroOptimizer_Stage3.checkpoint_event_epilogue

    def checkpoint_event_epilogue(self):
        self.invalidate_secondary_tensor()
        original(self)

    DeepSpeedZeroOptimizer_Stage3.checkpoint_event_epilogue = checkpoint_event_epilogue


def _deepspeed_autotp_hpz_data_parallel_groups():
    """DeepSpeed 0.19.8 (found by shardfuzz): ZeRO-3's hierarchical partitioning (ZeRO++ hpZ,
    `zero_hpz_partition_size` > 1) beside AutoTP training builds its secondary-partition groups from consecutive
    global ranks (`groups._create_zero_param_parallel_group`, which its own TODO says assumes no model parallelism),
    while AutoTP's tensor-parallel ranks are the consecutive ones: a secondary partition then mixes the shards of
    different tensor-parallel ranks and the forward computes with them
    (docs/findings/deepspeed-0.19.8-autotp-zero3-hpz-groups-cross-tensor-parallel-ranks.py). Fix: the groups cut from
    each rank's data-parallel ranks."""
    import deepspeed.comm as dist
    from deepspeed.utils import groups

    original = groups._create_zero_param_parallel_group

    def create_zero_param_parallel_group(group_size):
        tp_group = groups._TENSOR_MODEL_PARALLEL_GROUP
        if tp_group is None:
            return original(group_size)
        world, rank = dist.get_world_size(), dist.get_rank()
        tp = dist.get_world_size(group=tp_group)
        size = min(group_size, world // tp)
        for t in range(tp):  # (every rank creates every group, in the same order)
            data_parallel_ranks = list(range(t, world, tp))
            for i in range(0, len(data_parallel_ranks), size):
                ranks = data_parallel_ranks[i:i + size]
                group = dist.new_group(ranks)
                if rank in ranks:
                    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = group

    groups._create_zero_param_parallel_group = create_zero_param_parallel_group


def _deepspeed_async_column_parallel_noncontiguous_grad():
    """DeepSpeed 0.19.8 (found by shardfuzz): with AutoTP's `tp_overlap_comm`, a column-parallel layer's backward
    (`AsyncColumnParallel.backward`, module_inject/layers.py:281) flattens its output gradient and input with `.view`,
    which fails on a non-contiguous gradient: an attention projection whose output is viewed per head and transposed
    gets one as soon as a micro-batch has two sequences ("view size is not compatible with input tensor's size and
    stride") (docs/findings/deepspeed-0.19.8-autotp-overlap-comm-noncontiguous-grad-crash.py). Fix: `reshape`, as
    apex's equivalent layer does since NVIDIA/apex#1573; the arithmetic otherwise unchanged. A rank whose shard has
    no columns (fewer kv heads than tp) runs the released backward, which fails there with `view` as `reshape`
    would (another bug, not this fix's)."""
    import deepspeed.comm as dist
    from deepspeed.module_inject.layers import AsyncColumnParallel

    released = AsyncColumnParallel.backward

    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        if grad_output.numel() == 0 or input.numel() == 0:
            return released(ctx, grad_output)
        grad_input = grad_output.matmul(weight)
        handle = dist.all_reduce(grad_input.contiguous(), group=ctx.group, async_op=True)
        grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(input.reshape(-1, input.shape[-1]))
        grad_bias = grad_output.sum(0) if ctx.use_bias else None
        handle.wait()
        return None, grad_input, grad_weight, grad_bias

    AsyncColumnParallel.backward = staticmethod(backward)


def _deepspeed_autoep_folding_norm_every_tp_lane():
    """DeepSpeed 0.19.8 (found by shardfuzz): with AutoEP folded onto AutoTP's ranks (both degrees > 1) the tensor-parallel
    ranks hold different routed experts, but the global gradient norm ZeRO-1/2 (`get_grad_norm_direct`) and the engine
    without ZeRO (`runtime.utils.clip_grad_norm_`) clip by counts a parameter on model-parallel rank 0 only unless it is
    marked model parallel, and AutoEP's experts are not: the experts of every other tensor-parallel rank are left out of
    the norm (docs/findings/deepspeed-0.19.8-autoep-autotp-folding-clip-norm-drops-experts-of-other-tp-lanes.py). Fix:
    the routed experts counted on every tensor-parallel rank (marked tensor-model-parallel while the norm is computed)."""
    from deepspeed.moe.utils import is_moe_param
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from deepspeed.utils import groups

    def counted_on_every_tp_rank(original, params_of):
        def run(self, *args, **kwargs):
            no_tp = getattr(groups, "_TENSOR_MODEL_PARALLEL_GROUP", None) is None
            if no_tp or groups.get_tensor_model_parallel_world_size() <= 1:
                return original(self, *args, **kwargs)
            experts = [p for p in params_of(self) if is_moe_param(p) and not getattr(p, "tensor_model_parallel", False)]
            for p in experts:
                p.tensor_model_parallel = True
            try:
                return original(self, *args, **kwargs)
            finally:
                for p in experts:
                    del p.tensor_model_parallel

        return run

    DeepSpeedZeroOptimizer.scaled_global_norm = counted_on_every_tp_rank(
        DeepSpeedZeroOptimizer.scaled_global_norm, lambda opt: [p for group in opt.bit16_groups for p in group])
    DeepSpeedEngine.clip_fp32_gradients = counted_on_every_tp_rank(
        DeepSpeedEngine.clip_fp32_gradients, lambda engine: list(engine.module.parameters()))


def _torch_rms_norm_half_overflow():
    """torch 2.5.1 (and other releases before the fused CPU kernel that accumulates in float32; reported as
    pytorch/pytorch#133085 / #134106, 2024-08): `F.rms_norm` on a float16 input squares it in float16, so any element
    above 256 in magnitude makes the mean square inf and the whole row 0 (a single-device bug, which every f16 case of
    our torch model with large activations meets on such a torch: colossalai-zero at dp 1 alike)
    (docs/findings/torch-2.5.1-rms-norm-float16-overflow.py). Fix: the norm of a float16 input computed in float32."""
    import torch
    import torch.nn.functional as F

    original = F.rms_norm

    def rms_norm(input, normalized_shape, weight=None, eps=None):
        if input.dtype != torch.float16:
            return original(input, normalized_shape, weight, eps)
        w = None if weight is None else weight.float()
        return original(input.float(), normalized_shape, w, eps).to(torch.float16)

    F.rms_norm = rms_norm


def _torch_fsdp1_summon_grads_zeros_dtype():
    """torch 2.15 (and every release since `summon_full_params(with_grads=True)`, pytorch/pytorch#85738):
    FlatParamHandle.unshard_grad all-gathers the flat gradient's shards, and a rank whose shard has no gradient (its
    part of the flat parameter holds only frozen parameters, or parameters the step did not use) contributes
    `torch.zeros(flat_param._sharded_size, device=...)`: float32 whatever the gradients' dtype. With bfloat16 or float16
    gradients the ranks' all-gather inputs differ in size: gloo aborts the process ("Received data size doesn't match
    expected size"). pytorch/pytorch#112717 (2023, closed) fixed the output buffer's dtype, not these zeros
    (docs/findings/torch-2.15-fsdp1-summon-full-params-grads-zeros-dtype.py). Fix: the zeros in the flat parameter's
    dtype."""
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    _replace_in_method(FlatParamHandle, "unshard_grad",
                       "sharded_grad = torch.zeros(flat_param._sharded_size, device=self.device)",
                       "sharded_grad = torch.zeros(flat_param._sharded_size, device=self.device, dtype=flat_param.dtype)",
                       "torch-fsdp1-summon-grads-zeros-dtype")


def _torch_fsdp1_mixed_precision_reentrant_hook():
    """torch 2.15 (and 2.5.1): FSDP1 registers a unit's post-backward hook once, on the AccumulateGrad node of the first
    forward run with gradients enabled (`_register_post_backward_hook`: "already_registered"), and with parameter mixed
    precision each unshard changes the flat parameter's dtype (`.data` swapped between the float32 shard and the low-
    precision unsharded copy), which gives every later forward a new AccumulateGrad node. Under re-entrant activation
    checkpointing the first forward with gradients is the backward's first recomputation, that of the *last* use: its
    hook reduces that use's gradient, and the earlier uses, recomputed afterwards, accumulate into nodes without a hook
    and are never reduced (docs/findings/torch-2.15-fsdp1-mixed-precision-reentrant-reused-unit-gradient.py). Fix: a
    forward run inside a backward (a re-entrant recomputation) hooks its own AccumulateGrad node as well when it is not
    the registered one."""
    import functools

    import torch
    from torch.distributed.fsdp import _runtime_utils

    released = _runtime_utils._register_post_backward_hook

    # (Run eagerly as FSDP1's own runtime functions are: Dynamo, compiling a model wrapped in FSDP1, would otherwise trace
    # this function, a user-code frame, with fake tensors in place of the flat parameters.)
    @torch._dynamo.disable
    def _register_post_backward_hook(state, handle):
        released(state, handle)
        if handle is None or not torch.is_grad_enabled() or torch._C._current_graph_task_id() == -1:
            return
        flat_param = handle.flat_param
        registered = getattr(flat_param, "_post_backward_hook_state", None)
        if registered is None or not flat_param.requires_grad:  # (a frozen unit's state holds a reshard-only hook)
            return
        acc_grad = flat_param.expand_as(flat_param).grad_fn.next_functions[0][0]
        if acc_grad is not registered[0]:
            acc_grad.register_hook(functools.partial(_runtime_utils._post_backward_hook, state, handle))

    _runtime_utils._register_post_backward_hook = _register_post_backward_hook


def _torch_fsdp1_frozen_recomputed_unit_views():
    """torch 2.15: FSDP1 with `use_orig_params=True` unregisters the parameters of a frozen unit whose forward is
    recomputed in the backward (re-entrant activation checkpointing) after running more than once per step (shared
    blocks): the recomputation's pre-forward sets each view on its module as a plain tensor (the BACKWARD_PRE branch of
    `FlatParamHandle._use_unsharded_views(as_params=False)`), which the post-backward hook would register again as
    parameters, but a frozen unit has no gradient and no post-backward hook; the final callback's `_catch_all_reshard`
    then finds the flat parameter on its local shard (NO_SHARD: always) and returns without restoring the views. From
    then on `model.parameters()`, state dicts and `summon_full_params` miss them (a checkpoint saved after the step
    cannot be loaded: "FSDP assumes ... is in the state_dict") (docs/findings/torch-2.15-fsdp1-frozen-recomputed-unit-
    parameters-unregistered.py). Fix: the catch-all also restores the views of a handle whose parameters are no longer
    registered."""
    from torch.distributed.fsdp import _runtime_utils

    released = _runtime_utils._catch_all_reshard

    def _catch_all_reshard(state):
        released(state)
        handle = state._handle
        if handle is not None and handle._use_orig_params and any(
                name not in module._parameters for name, module, _ in handle.flat_param._param_infos):
            handle._use_sharded_views()

    _runtime_utils._catch_all_reshard = _catch_all_reshard


def _torch_fsdp1_clip_grad_norm_float64():
    """torch 2.15: FSDP1's `clip_grad_norm_` with a sharded strategy computes each rank's norm by
    `_get_grad_norm`, which asks `torch.linalg.vector_norm(grad, dtype=torch.float32)` of every gradient: for float64
    gradients that raises "the dtype of the input (Double) should be convertible without narrowing to the specified
    dtype (Float)", so clipping a float64 model crashes (NO_SHARD takes torch.nn.utils.clip_grad_norm_ and works)
    (docs/findings/torch-2.15-fsdp1-clip-grad-norm-float64-crash.py). Fix: the norm in float32, or in float64 where a
    gradient is float64."""
    import torch
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp

    def _get_grad_norm(params, norm_type, zero, device):
        grads = [param.grad for param in params if param.grad is not None]
        if not grads:
            return zero
        dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
        norms = [torch.linalg.vector_norm(g.detach(), norm_type, dtype=dtype) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms), norm_type, dtype=dtype).to(device=device)

    fsdp._get_grad_norm = _get_grad_norm


def _torch_dcp_inert_optim_state_init():
    """torch 2.15 (and 2.5.1): `get_state_dict` materialises an optimizer's lazy state (`_init_optim_state`,
    torch/distributed/checkpoint/state_dict.py) with a step of zero gradients at a learning rate of 0, on the live
    optimizer. That step is not inert: Adam's and AdamW's step count advances to 1, so a checkpoint taken before the
    first step (a seed checkpoint) resumes, and the live run goes on, with the first real update bias-corrected as step
    2 (pytorch#164929, open; docs/findings/torch-2.15-dcp-state-dict-before-first-step-advances-adam.py), and an
    Adam's coupled weight decay fills its moments. And it returns early when a parameter holds a gradient, so an
    optimizer whose first step a loss scaler skipped saves no state that its fresh loader's template asks for
    (docs/findings/torch-2.15-dcp-checkpoint-before-first-optimizer-step-unloadable.py). Fix: the gradients set aside
    and put back, the weight decay zero as well as the learning rate, and every step count back to zero after."""
    from torch.distributed.checkpoint import state_dict

    def init_optim_state(optim):
        if not optim.state:
            _materialise_optimizer_state_inertly(optim, lambda p: p.requires_grad)

    state_dict._init_optim_state = init_optim_state


def _materialise_optimizer_state_inertly(optim, stepped):
    """An optimizer's lazy state (Adam's moments and step counts) created without training anything: one step over
    zero gradients for the parameters `stepped(p)` selects (none for the others) at learning rate and weight decay 0,
    then every step count back to zero and each parameter's gradient as it was. (torch's DCP and megatron each
    materialise the state with such a step, but leave it counted.)"""
    import torch

    params = [p for group in optim.param_groups for p in group["params"]]
    grads = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p) if stepped(p) else None
    kept = [{k: g[k] for k in ("lr", "weight_decay") if k in g} for g in optim.param_groups]
    for group in optim.param_groups:
        if "lr" in group:
            group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
        if "weight_decay" in group:
            group["weight_decay"] = 0.0
    optim.step()
    for group, k in zip(optim.param_groups, kept):
        group.update(k)
    for s in optim.state.values():
        if "step" in s:
            s["step"] = torch.zeros_like(s["step"]) if isinstance(s["step"], torch.Tensor) else 0
    for p, g in zip(params, grads):
        p.grad = g


def _torch_dsd_broadcast_from_rank0_set_state_dict():
    """torch 2.15: `set_state_dict` with `broadcast_from_rank0` hangs where the ranks other than 0 hand in empty state
    dicts, as that option asks ("rank0 should receive a full state_dict and will broadcast the tensors ... Other ranks
    will receive the tensors"): it decides `optim_only=not model_state_dict` on each rank, so rank 0 loads the model
    (broadcasting its tensors) and the others skip it and wait elsewhere
    (docs/findings/torch-2.15-dsd-set-state-dict-broadcast-from-rank0-hang.py). Fix: under `broadcast_from_rank0` the
    ranks follow rank 0's decision, loading the optimizer's state dict and then the model's as rank 0 does."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import state_dict

    original = state_dict.set_state_dict

    def set_state_dict(model, optimizers, *, model_state_dict, optim_state_dict, options=None):
        if options is not None and options.broadcast_from_rank0:
            loads_model = [bool(model_state_dict)]
            dist.broadcast_object_list(loads_model, src=0)
            if loads_model[0] and not model_state_dict:
                state_dict.set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
                return state_dict.set_model_state_dict(model, model_state_dict, options=options)
        return original(model, optimizers, model_state_dict=model_state_dict, optim_state_dict=optim_state_dict,
                        options=options)

    state_dict.set_state_dict = set_state_dict


def _torch_fsdp1_cpu_flat_param_freed_by_offload():
    """torch 2.5.1 (pytorch#188989, fixed since): `FlatParamHandle.to_cpu`, which FSDP1's full state dict enters with
    `offload_to_cpu` (the state-dict API's `cpu_offload=True`, `summon_full_params(offload_to_cpu=True)`), moves the
    unsharded flat parameter to the CPU and frees the unsharded one. On a model that is on the CPU already the move is
    no copy, so it frees the very storage the parameter views keep using: rank 0's full checkpoint of a FULL_SHARD or
    SHARD_GRAD_OP model is killed by SIGSEGV in the state-dict hook's `clone()`
    (docs/findings/torch-2.5.1-fsdp1-full-state-dict-cpu-offload-segfault.py). Fix: as later releases do, nothing is
    moved or freed where the flat parameter is on the CPU."""
    import contextlib

    from torch.distributed.fsdp._flat_param import FlatParamHandle

    original = FlatParamHandle.to_cpu

    @contextlib.contextmanager
    def to_cpu(self):
        if self.flat_param.device.type == "cpu":
            yield
            return
        with original(self):
            yield

    FlatParamHandle.to_cpu = to_cpu

def _torch_fsdp1_full_optim_state_cpu_alias():
    """torch 2.15: FSDP1's full optimizer state dict (`FSDP.optim_state_dict` under FULL_STATE_DICT, and the state-dict
    API's `get_state_dict(..., full_state_dict=True, cpu_offload=True)`) of a model on the CPU (`device_id` cpu) gives
    every state the values of the last one gathered: `_allgather_orig_param_states` all-gathers each state (`exp_avg`,
    then `exp_avg_sq`) into one reused buffer, and `_unflatten_orig_param_states` keeps views of it, copied only
    without offloading (`value.detach().clone()`); offloaded it takes `value.cpu()`, no copy on the CPU, so the next
    all-gather overwrites it. Adam's `exp_avg` is saved as its `exp_avg_sq`, and the resumed run diverges silently
    (docs/findings/torch-2.15-fsdp1-cpu-full-optim-state-dict-moments-aliased.py). Fix: the offloaded state a copy."""
    import torch
    from torch.distributed.fsdp import _optim_utils

    original = _optim_utils._unflatten_orig_param_states

    def unflatten_orig_param_states(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload):
        original(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload)
        if cpu_offload and not shard_state:
            for states in output_states.values():
                value = states.get(state_name)
                if torch.is_tensor(value) and value.dim() > 0:
                    states[state_name] = value.clone()

    _optim_utils._unflatten_orig_param_states = unflatten_orig_param_states


def _torch_dsd_full_optim_state_without_tensors():
    """torch 2.15: `set_state_dict` / `set_optimizer_state_dict` with `full_state_dict=True` cannot load the state of an
    optimizer that holds no tensor state (SGD without momentum: its state is empty): `_load_optim_state_dict` takes
    the device to distribute the full state to from the optimizer's own state tensors of at least one dimension, finds
    none, and raises "Expected device to be set" (state_dict.py:1146-1157), where the model's path falls back to the
    process group's device; past it, the empty state flattens to nothing and the unflattened dict has no "state"
    (KeyError in `Optimizer.load_state_dict`) (docs/findings/torch-2.15-dsd-full-optim-state-sgd-device-unset.py).
    Found by campaign 290 (torch-fsdp2, 46 of its crashes: SGD with `train.checkpoint_layout` gathered). Fix: the same
    fallback, and the state key kept."""
    from torch.distributed.checkpoint import state_dict

    unflatten = "optim_state_dict = _unflatten_state_dict(\n                flatten_local_osd, local_osd_mapping\n            )"
    _replace_in_function(state_dict, "_load_optim_state_dict", [
        ('raise AssertionError("Expected device to be set")', "device = dist.distributed_c10d._get_pg_default_device()"),
        # (an empty state flattens to nothing and comes back without its key)
        (unflatten, unflatten + "\n            optim_state_dict.setdefault(_STATE, {})"),
    ], "torch-dsd-full-optim-state-without-tensors")


def _replace_in_function(module, name, replacements, fix):
    """`_replace_in_method` for a function of `module` (its decorators kept), each (old, new) of `replacements`."""
    import inspect
    import textwrap

    # (A function another fix has already patched: its patched source, so that both fixes apply.)
    source = getattr(getattr(module, name), "__patched_source__", None) or textwrap.dedent(
        inspect.getsource(getattr(module, name)))
    for old, new in replacements:
        if source.count(old) != 1:
            raise RuntimeError(f"known fix {fix}: the released code it patches has changed")
        source = source.replace(old, new)
    namespace = {}
    exec(compile(source, inspect.getsourcefile(module), "exec"), module.__dict__, namespace)
    namespace[name].__patched_source__ = source
    setattr(module, name, namespace[name])


def _torch_dcp_load_unheld_sharded_tensor():
    """torch 2.15: a torch.distributed.checkpoint of an FSDP1 model and optimizer (`get_state_dict`, sharded) cannot be
    loaded where a parameter's first dimension splits into fewer torch.chunk pieces than there are ranks (FSDP1's
    sharded state dict chunks each parameter along dim 0: the last ranks get a ShardedTensor with no local shard):
    "Missing key in checkpoint state_dict: optim.param_groups." DefaultLoadPlanner.set_up_planner drops such a
    ShardedTensor (`_flatten_sharded_tensors`: `if len(shards) == 0: return`), create_local_plan then finds the
    checkpoint's keys of it missing, takes the checkpoint for a pre-2.4 one and flattens the state dict by the 2.3
    rules, under which `optim.param_groups` is one leaf the checkpoint does not have
    (docs/findings/torch-2.15-fsdp1-dcp-load-rank-without-chunk-crash.py). Fix: keep such a ShardedTensor in the
    flattened state dict (it plans no read: it has no local chunk)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.checkpoint._traverse import set_element, traverse_state_dict

    drop_unheld = default_planner._flatten_sharded_tensors

    def flatten_sharded_tensors(state_dict):
        out = drop_unheld(state_dict)

        def keep(path, value):
            if isinstance(value, ShardedTensor) and not value.local_shards():
                set_element(out, path, value)

        traverse_state_dict(state_dict, keep)
        return out

    default_planner._flatten_sharded_tensors = flatten_sharded_tensors


def _torch_compile_async_collective_input_grad():
    """torch 2.15: a compiled module whose input is the local tensor of a DTensor redistributed by a functional
    collective (an AsyncCollectiveTensor: `to_local()` of a vocabulary-parallel embedding's output under tensor
    parallelism, as torchtitan compiles its blocks after an embedding in RowwiseParallel) gets no gradient to that
    input: AOTAutograd resolves AsyncCollectiveTensor inputs with `trigger_wait()`, whose result has no autograd
    history, so `_ToTorchTensor.backward` receives None; the engine then hands the redistribution's backward a plain
    zero tensor, and it fails with "'Tensor' object has no attribute '_local_tensor'"; under FSDP2 beside tensor
    parallelism (blocks compiled before fully_shard) the loss is silent: the embedding's gradient is zero
    (docs/findings/torch-2.15-compile-tp-async-collective-input-gradient-lost.py). Fix: `to_local()` waits for an
    AsyncCollectiveTensor itself, so the compiled module's input is a plain tensor with its autograd edge."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import _api

    to_local = _api._ToTorchTensor.forward

    def forward(ctx, input, grad_placements):
        local = input._local_tensor
        if isinstance(local, AsyncCollectiveTensor):
            input = type(input)(local.trigger_wait(), input._spec, requires_grad=False)
        return to_local(ctx, input, grad_placements)

    _api._ToTorchTensor.forward = staticmethod(forward)


def _torch_ddp_compile_first_bucket_cap():
    """torch 2.15: `torch.compile` of a DistributedDataParallel module with `bucket_cap_mb` below 1 MiB fails at its
    first forward: Dynamo builds its DDPOptimizer from the module's `bucket_bytes_cap` alone, DDPOptimizer takes the
    first bucket's cap as `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB) and asserts "First bucket should be
    smaller/equal to other buckets to get comms warmed up ASAP", where DDP itself (its BucketCapacityConfig) caps the
    first bucket at the given size (docs/findings/torch-2.15-ddp-compile-bucket-below-1-mib-crash.py). Fix: the first
    bucket's cap no larger than the other buckets'."""
    import torch.distributed as dist
    from torch._dynamo.backends import distributed

    init = distributed.DDPOptimizer.__init__

    def __init__(self, bucket_bytes_cap, backend_compile_fn, first_bucket_cap=None):
        if first_bucket_cap is None:
            first_bucket_cap = min(dist._DEFAULT_FIRST_BUCKET_BYTES, bucket_bytes_cap)
        init(self, bucket_bytes_cap, backend_compile_fn, first_bucket_cap)

    distributed.DDPOptimizer.__init__ = __init__


def _torch_fsdp2_reentrant_reused_module():
    """torch 2.15: FSDP2 (`fully_shard`) loses a gradient of a module that runs more than once per step under
    re-entrant activation checkpointing (shared blocks, `model.layer_passes` > 1 with use_reentrant=True), silently:
    the first recomputation's nested backward reduces and reshards the module's parameters, and the second
    recomputation finds the FSDPState still in PRE_BACKWARD, where `_pre_forward` unshards the parameters again but
    returns before registering the post-backward hook. That use's gradient stays on the unsharded parameters, is
    never reduce-scattered, and the module is left unsharded (plain Parameters) after backward
    (docs/findings/torch-2.15-fsdp2-reentrant-checkpoint-reused-module-gradient-lost.py). Fix: in that branch, the
    groups it had to unshard register their post-backward hook, as a first forward does."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    original = FSDPState._pre_forward

    def _pre_forward(self, module, args, kwargs):
        if self._training_state != TrainingState.PRE_BACKWARD:
            return original(self, module, args, kwargs)
        resharded = [g for g in self._fsdp_param_groups if not g.is_unsharded]
        args, kwargs = original(self, module, args, kwargs)
        for group in resharded:
            args, kwargs = group._register_post_backward_hook(args, kwargs)
        return args, kwargs

    FSDPState._pre_forward = _pre_forward


def _deepspeed_zero3_reused_param_copy():
    """DeepSpeed 0.19.8: ZeRO-3 runs a parameter's reduction once per re-entrant checkpoint phase and gives every
    phase of a backward "copy semantics" (stage3.py: `partition_grads` copies the reduced partition over the
    buffer while `micro_step_id == 0`). A parameter used in two checkpointed phases (shared blocks,
    `model.layer_passes` > 1 with use_reentrant=True) is reduced twice, and the second copy overwrites the first
    phase's gradient, silently, whenever the two reductions fall in different buckets (in one bucket
    `__reduce_and_partition_ipg_grads` asserts instead)
    (docs/findings/deepspeed-0.19.8-zero3-reentrant-checkpoint-reused-param-gradient-overwritten.py). Fix: a
    parameter reduced again within the backward has the partition written so far added to its new one first."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    partition_grads, clear_backward_seen_flag = Stage3.partition_grads, Stage3.clear_backward_seen_flag

    def written(self):
        return self.__dict__.setdefault("_reduced_this_backward", set())

    def partition(self, params, grads):
        if self.micro_step_id == 0:
            buffers = self._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition
            grads = [g + buffers[p.ds_id].narrow(0, 0, g.numel()).view(g.shape).to(g.dtype) if p.ds_id in written(self) else g
                     for p, g in zip(params, grads)]
        written(self).update(p.ds_id for p in params)
        return partition_grads(self, params, grads)

    def clear_seen(self):
        written(self).clear()
        return clear_backward_seen_flag(self)

    Stage3.partition_grads, Stage3.clear_backward_seen_flag = partition, clear_seen


def _torch_pipelining_ddp_metadata_inference():
    """PyTorch 2.15: a pipeline stage wrapped in DDP fails its second schedule step with DDP's reducer asserting
    "rebuilt parameter indices size is not same as original model parameters size": the first step's runtime shape
    inference (`_forward_metadata_inference`) calls the DDP module outside `no_sync()`, preparing the reducer for a
    backward the inference never runs, so the gradient-ready order is recorded twice
    (docs/findings/torch-2.15-pipelining-ddp-stage-metadata-inference-assert.py). Fix: that forward under `no_sync()`,
    as the stage's every other forward."""
    import contextlib

    from torch.distributed.pipelining import stage
    from torch.nn.parallel import DistributedDataParallel

    original = stage.PipelineStage._forward_metadata_inference

    def forward_metadata_inference(self, *args, **kwargs):
        ddp = isinstance(self.submod, DistributedDataParallel)
        with self.submod.no_sync() if ddp else contextlib.nullcontext():
            return original(self, *args, **kwargs)

    stage.PipelineStage._forward_metadata_inference = forward_metadata_inference


def _torch_pipelining_fsdp_split_backward_unshard():
    """PyTorch 2.15: under a zero-bubble schedule (the backward split into input- and weight-gradient parts) the last
    stage's FSDP2 parameters get no gradient with `reshard_after_forward=True`: `stage_backward_input` collects the
    weights it will later differentiate from `submod.parameters()` before its autograd call, when the last stage,
    whose loss backward follows its forward at once, still holds the resharded DTensor parameters (not in the graph; the
    pre-backward unshard has not run): no parameter group, an empty weight backward, every gradient of the stage None,
    and the optimizer silently skips them (docs/findings/torch-2.15-pipelining-zero-bubble-fsdp-last-stage-no-grad.py).
    Fix: the stage's FSDP2 modules unsharded before the input-gradient backward, as FSDP's pre-backward hook would."""
    _unshard_stage_before("input")


def _unshard_stage_before(backward_type):
    """Pipeline stages unshard their FSDP2 modules before each backward part of kind `backward_type` ("input" or
    "weight" of a split backward): the two FSDP2 pipelining fixes, one kind each."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import stage

    original = stage._PipelineStageBase.backward_maybe_with_nosync

    def backward_maybe_with_nosync(self, kind, bwd_kwargs, last_backward=False):
        if kind == backward_type:
            for module in self.submod.modules():
                if isinstance(module, FSDPModule):
                    module.unshard()
        return original(self, kind, bwd_kwargs, last_backward)

    stage._PipelineStageBase.backward_maybe_with_nosync = backward_maybe_with_nosync


def _torch_pipelining_fsdp_weight_backward_unshard():
    """PyTorch 2.15: under the interleaved zero-bubble schedule with three or more stages per rank, a stage's forward of a
    later micro-batch can fall between its input- and weight-gradient steps (stage 3: I1, W0, F2, W1); FSDP2 reshards
    the stage after that forward (`reshard_after_forward=True`), and the weight step then finds other parameter objects
    than the input step recorded (KeyError on an AccumulateGrad node in `stage_backward_weight`) or freed storage
    (docs/findings/torch-2.15-pipelining-interleaved-zero-bubble-fsdp-three-stages-crash.py). Fix: the stage's FSDP2
    modules unsharded before the weight-gradient step too (FSDP2 unshards into the same parameter objects)."""
    _unshard_stage_before("weight")


def _torch_pipelining_ddp_split_backward_reduce():
    """PyTorch 2.15: under a zero-bubble schedule a stage wrapped in DDP never reduces its weight gradients over the
    data-parallel ranks: `stage_backward_weight` computes them with `torch.autograd.grad` and adds them to `.grad`
    itself, so DDP's reducer, which all-reduces a gradient when its accumulation hook fires, never sees them (the
    stage prepares the reducer for the last weight backward all the same); every rank steps with its own local
    gradient and the replicas part (docs/findings/torch-2.15-pipelining-zero-bubble-ddp-weight-grads-unreduced.py).
    Fix: after the last weight backward of a DDP stage, its gradients averaged over DDP's process group."""
    import torch.distributed as dist
    from torch.distributed.pipelining import stage
    from torch.nn.parallel import DistributedDataParallel

    original = stage._PipelineStageBase.backward_maybe_with_nosync

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
        result = original(self, backward_type, bwd_kwargs, last_backward)
        if isinstance(self.submod, DistributedDataParallel) and backward_type == "weight" and last_backward:
            group = self.submod.process_group
            for p in self.submod.module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=group)
                    p.grad.div_(dist.get_world_size(group))
        return result

    stage._PipelineStageBase.backward_maybe_with_nosync = backward_maybe_with_nosync


def _torch_ddp_static_graph_no_sync():
    """PyTorch 2.15: DDP(static_graph=True) with gradient accumulation under no_sync() asserts
    `expect_autograd_hooks_` in Reducer::finalize_backward at the first backward: _DDPSink.backward enqueues the
    static graph's one-shot delayed all-reduce on a backward inside no_sync(), where _post_forward never called
    prepare_for_backward (pytorch/pytorch#143580, open; fix proposed in PR #187732;
    docs/findings/torch-2.15-ddp-static-graph-no-sync.py). Fix (that PR's Python part): enqueue it on a syncing
    backward only. Partial: the PR's C++ part (the reducer's hook counts) cannot be patched here, and without it the
    step after the first is not all-reduced, so no case passes with this fix; it shows that silent half."""
    from torch.autograd import Variable
    from torch.nn.parallel import distributed

    def backward(ctx, *grad_outputs):
        ddp = ctx.ddp_weakref()
        if ddp.static_graph and not ddp._static_graph_delay_allreduce_enqueued and ddp.require_backward_grad_sync:
            Variable._execution_engine.queue_callback(ddp.reducer._delay_all_reduce)
            ddp._static_graph_delay_allreduce_enqueued = True
        return (None, *grad_outputs)

    distributed._DDPSink.backward = staticmethod(backward)


def _colossalai_ce1d_empty_vocab_shard():
    """Colossal-AI 0.5.0: cross_entropy_1d (layer/loss.py:55, DistCrossEntropy.forward) takes the maximum over the
    rank's vocabulary columns first, so a tensor-parallel rank whose shard of a padded vocabulary is all padding
    (VocabParallelLMHead1D returns the valid columns only: width 0) fails there, "max(): Expected reduction dim 1 to
    have non-zero size", before the loss's collectives (vocabulary 13 under tp=2 with make_vocab_size_divisible_by
    13: 26 rows, rank 1's 13 all padding). The same padding as colossalai-empty-vocab-shard's, met by the
    vocabulary-parallel loss itself (docs/findings/colossalai-0.5.0-cross-entropy-1d-empty-vocab-shard-crash.py).
    Fix: such a rank's logits take one column of -inf (no target falls in its range, its exp is 0 in the sum, its
    gradient 0)."""
    from colossalai.shardformer import layer
    from colossalai.shardformer.layer import loss

    original = loss.cross_entropy_1d

    def cross_entropy_1d(vocab_logits, labels, *args, **kwargs):
        return original(_a_column_where_none(vocab_logits), labels, *args, **kwargs)

    loss.cross_entropy_1d = layer.cross_entropy_1d = cross_entropy_1d


def _a_column_where_none(logits):
    """A rank's vocabulary-shard logits, with one column of -inf where the shard holds no column (all padding)."""
    if logits.size(-1) > 0:
        return logits
    import torch

    return torch.cat([logits, torch.full((*logits.shape[:-1], 1), float("-inf"), dtype=logits.dtype)], -1)


def _colossalai_zero2_sp_accumulated_sync():
    """Colossal-AI 0.5.0: HybridParallelZeroOptimizer.backward all-reduces the sequence-parallel partial gradients
    (norms, row-parallel biases: `_sync_sp_grads`) after every backward, over the gradients ZeRO-2 has accumulated so
    far (its partitioned gradient store adds each micro-batch in place), so with gradient accumulation every earlier
    micro-batch's already-reduced share is multiplied by tp again (ZeRO-2 refuses `no_sync`, so accumulation always
    syncs; ZeRO-0 and -1 are right)
    (docs/findings/colossalai-0.5.0-zero2-sequence-parallel-accumulation-grads-reduced-again.py). Fix: after each
    sync, take back (tp - 1) times what the gradient held after the previous sync."""
    import ctypes

    import torch.distributed as dist
    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelZeroOptimizer
    from colossalai.shardformer.layer.utils import SeqParallelUtils

    original = HybridParallelZeroOptimizer._sync_sp_grads

    def sp_grads(self):
        out = []
        for group_id in range(self.num_param_groups):
            for grad in self.get_working_grads_by_group_id(group_id):
                param = ctypes.cast(self.get_param_id_for_grad(grad), ctypes.py_object).value
                if SeqParallelUtils.is_sp_partial_derived_param(param):
                    out.append(grad)
        return out

    def _sync_sp_grads(self):
        original(self)
        if not self.require_grad_sync:
            return
        tp, synced = dist.get_world_size(self.tp_pg), getattr(self, "_synced_sp_grads", {})
        now = {}
        for grad in sp_grads(self):
            before = synced.get(id(grad))
            if before is not None and before[0] is grad:
                grad.sub_(before[1] * (tp - 1))
            now[id(grad)] = (grad, grad.detach().clone())
        self._synced_sp_grads = now

    HybridParallelZeroOptimizer._sync_sp_grads = _sync_sp_grads


def _colossalai_overlap_allgather_nd():
    """Colossal-AI 0.5.0: with `overlap_allgather` (LowLevelZeroPlugin's or HybridParallelPlugin's) the ZeRO optimizer
    gathers each updated parameter after the step with `all_gather_into_flat_tensor_nd(..., async_op=True)`
    (zero/low_level/_utils.py:215). On a two-level data-parallel mesh (LowLevelZeroPlugin's `extra_dp_size` > 1) that
    runs one all-gather per level and issues the second, which sends the first's output, without waiting for the
    first; it returns the second's handle only. So the outer gather sends partitions the inner one has not written
    yet, and the ranks' working parameters disagree after the step (docs/findings/
    colossalai-0.5.0-overlap-allgather-two-level-mesh-stale-parameters.py). Fix: wait for each level's gather before
    issuing the next (the last one stays asynchronous)."""
    import numpy as np
    import torch.distributed as dist
    from colossalai.zero.low_level import _utils, low_level_optim
    from colossalai.zero.low_level.bookkeeping import tensor_bucket

    original = _utils.all_gather_into_flat_tensor_nd

    def all_gather_into_flat_tensor_nd(output_tensor, input_tensor, group, async_op=False):
        if not async_op or isinstance(group, dist.ProcessGroup):
            return original(output_tensor, input_tensor, group, async_op)
        sizes, ranks = [dist.get_world_size(pg) for pg in group], [dist.get_rank(pg) for pg in group]
        handle = None
        for i, pg in list(enumerate(group))[::-1]:
            if handle is not None:
                handle.wait()
            out = output_tensor
            if i > 0:
                out = output_tensor.chunk(int(np.prod(sizes[:i])))[int(np.ravel_multi_index(ranks[:i], sizes[:i]))]
            handle = dist.all_gather_into_tensor(out, input_tensor, group=pg, async_op=True)
            input_tensor = out
        return handle

    for module in (_utils, low_level_optim, tensor_bucket):
        module.all_gather_into_flat_tensor_nd = all_gather_into_flat_tensor_nd


def _colossalai_pp_sp_causal_mask():
    """Colossal-AI 0.5.0: on a later pipeline stage under sequence parallelism (`split_gather`, `ring` or `all_to_all`,
    without flash attention) LlamaPipelineForwards.llama_model_forward (modeling/llama.py:101-146) takes cache_position
    over the whole sequence (seq_length times sp_size) but builds the causal mask with
    `self._update_causal_mask(attention_mask, hidden_states, cache_position, ...)` from the hidden states it received,
    the rank's chunk of the sequence: transformers' `_prepare_4d_causal_attention_mask_with_cache_position` fails with
    "The size of tensor a (2) must match the size of tensor b (4)" (the first stage builds the mask before splitting)
    (docs/findings/colossalai-0.5.0-pipeline-sequence-parallel-causal-mask-crash.py). Fix: the mask is built for the
    whole sequence (the shape taken from a stand-in of cache_position's length)."""
    from transformers.models.llama.modeling_llama import LlamaModel

    original = LlamaModel._update_causal_mask

    def _update_causal_mask(self, attention_mask, input_tensor, cache_position, *args, **kwargs):
        if cache_position is not None and input_tensor.dim() == 3 and input_tensor.shape[1] != cache_position.shape[0]:
            input_tensor = input_tensor.new_empty(input_tensor.shape[0], cache_position.shape[0], input_tensor.shape[2])
        return original(self, attention_mask, input_tensor, cache_position, *args, **kwargs)

    LlamaModel._update_causal_mask = _update_causal_mask


def _colossalai_coloparam_inplace_ce_grad():
    """Colossal-AI 0.5.0: with `overlap_allgather` (or `use_fp8`) HybridParallelPlugin turns every parameter into a
    ColoParameter, so every tensor computed from one is a ColoTensor, and ColoTensor.__torch_function__
    (tensor/colo_tensor.py:6-11, :84-85) runs `add_`, `sub_`, `mul_` and `div_` out of place. DistCrossEntropy.backward
    (shardformer/layer/loss.py:136) scales the gradient with `grad_logits.mul_(grad_output...)` and drops the result:
    the vocabulary-parallel loss's gradient (tp > 1 with `parallel_output`, the plugin's default) is never multiplied
    by the incoming gradient, so every gradient comes out times the count of labels the mean divides by (14 in the
    script), or off by the loss's scale (docs/findings/colossalai-0.5.0-colotensor-inplace-mul-cross-entropy-grad.py).
    Fix: the loss's function runs on a plain tensor view of its ColoTensor input (the autograd graph is kept)."""
    import torch
    from colossalai.shardformer import layer
    from colossalai.shardformer.layer import loss

    original = loss.cross_entropy_1d

    def cross_entropy_1d(vocab_logits, labels, *args, **kwargs):
        with torch._C.DisableTorchFunction():
            plain = vocab_logits.as_subclass(torch.Tensor)
        return original(plain, labels, *args, **kwargs)

    loss.cross_entropy_1d = layer.cross_entropy_1d = cross_entropy_1d


def _colossalai_zero_stateless_optimizer_checkpoint():
    """Colossal-AI 0.5.0: LowLevelZeroOptimizer.state_dict_shard (zero/low_level/low_level_optim.py:872-884), which
    LowLevelZeroPlugin's sharded `booster.save_optimizer` calls, reads `self.optim.state_dict()["state"][i]` for every
    parameter index i; an optimizer that keeps no state for a parameter (SGD without momentum, or any optimizer
    before its first step or after an overflow skipped it) has no entry there, and saving fails with `KeyError: 0`.
    Its unsharded `state_dict` skips such parameters (`if param not in self.optim.state: continue`)
    (docs/findings/colossalai-0.5.0-zero-sharded-optimizer-checkpoint-stateless-keyerror.py). Fix: a parameter
    without state is saved with an empty one, as torch's own optimizer checkpoints have it."""
    from colossalai.zero.low_level.low_level_optim import LowLevelZeroOptimizer

    original = LowLevelZeroOptimizer.state_dict_shard

    def state_dict_shard(self, *args, **kwargs):
        inner = self.optim.state_dict

        def with_every_index():
            out = inner()
            count = sum(len(g["params"]) for g in out["param_groups"])
            out["state"] = {i: out["state"].get(i, {}) for i in range(count)}
            return out

        self.optim.state_dict = with_every_index
        try:
            yield from original(self, *args, **kwargs)
        finally:
            del self.optim.state_dict

    LowLevelZeroOptimizer.state_dict_shard = state_dict_shard


def _colossalai_padded_detached_param_save():
    """Colossal-AI 0.5.0: HybridParallelCheckpointIO._model_sharder (checkpoint_io/hybrid_parallel_checkpoint_io.py:
    112-115) saves each parameter as `gather_distributed_param(param)`, which is `param.detach()` for one that is not
    tensor-parallel, and unpads it with `to_unpadded_tensor` when it is a padded tensor. A vocabulary padded to
    `make_vocab_size_divisible_by` without tensor parallelism (PaddingEmbedding / PaddingLMHead: tp 1, or sequence
    parallelism's all_to_all) is such a parameter, and its hijacked `detach` copies the padding attributes onto the
    copy but not the saved original methods, so `_hijack_back_detach_and_clone` raises `AttributeError: 'Tensor'
    object has no attribute '_unpad_detach'`: a sharded `save_model` fails on every rank
    (docs/findings/colossalai-0.5.0-hybrid-checkpoint-padded-vocabulary-crash.py). The unsharded save
    (`save_model(..., shard=False)`: `model.state_dict()`, ParallelModule's `_save_to_state_dict`) fails the same way
    (found 2026-12-06 through `train.checkpoint_layout` gathered). Fix: a detached copy is unpadded by slicing it,
    wherever it is unpadded."""
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as io
    from colossalai.shardformer.layer import parallel_module

    original = io.to_unpadded_tensor

    def to_unpadded_tensor(ptensor):
        if io.is_padded_tensor(ptensor) and not hasattr(ptensor, "_unpad_detach"):
            keep = [slice(None)] * ptensor.dim()
            keep[ptensor._padding_dim] = slice(None, ptensor._origin_length)
            return ptensor.data[tuple(keep)]
        return original(ptensor)

    io.to_unpadded_tensor = parallel_module.to_unpadded_tensor = to_unpadded_tensor


def _colossalai_padded_vocab_optimizer_save():
    """Colossal-AI 0.5.0: HybridParallelCheckpointIO gathers a tensor-parallel parameter's optimizer states over the
    tp group where `search_tp_partition_dim(current_shape, original_shape, tp)` (checkpoint_io/utils.py:107-132) finds
    the dimension along which the shard is shorter than the parameter's shape before sharding, and asserts that shape
    is tp times the shard's. A vocabulary padded to `make_vocab_size_divisible_by` x tp is longer than tp shards of
    the unpadded shape, so with a vocabulary longer than one shard that is not already a multiple of it (130 over tp 2,
    GPT-2's 50257 with the default padding to 64) a sharded `save_optimizer` (and its load) fails on every rank with
    "The parameter isn't evenly distributed among tensor parallel group"
    (docs/findings/colossalai-0.5.0-hybrid-checkpoint-padded-vocabulary-crash.py). Fix: the padded vocabulary's
    dimension is the partition dimension (the gathered states are then unpadded by the code that follows, and padded
    before slicing on load)."""
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as io

    original = io.search_tp_partition_dim

    def search_tp_partition_dim(current_shape, original_shape, tp_size):
        for dim, length in enumerate(original_shape):
            if length > current_shape[dim]:
                if tp_size * current_shape[dim] > length:
                    return dim
                break
        return original(current_shape, original_shape, tp_size)

    io.search_tp_partition_dim = search_tp_partition_dim


def _colossalai_gpt2_empty_stage_dtype():
    """Colossal-AI 0.5.0: GPT-2's pipeline forward builds the attention mask in `_get_attention_mask`
    (shardformer/modeling/gpt2.py:104-105) with `torch.finfo(self.dtype)`, the dtype of the stage's first parameter. A
    stage that holds none (more pipeline stages than blocks: `distribute_layers` gives a stage between the embedding's
    and the head's no block, as it does for Llama, whose forward takes the dtype from its hidden states and runs) has
    dtype None, and every such stage fails with "finfo(): argument 'type' ... must be torch.dtype, not NoneType"
    (docs/findings/colossalai-0.5.0-gpt2-pipeline-stage-without-blocks-crash.py). Fix: the mask in the hidden states'
    dtype (the stage's compute dtype, which `self.dtype` is wherever the stage holds a parameter)."""
    from colossalai.shardformer.modeling import gpt2

    _replace_in_method(gpt2, "_get_attention_mask", "attention_mask.to(dtype=self.dtype)",
                       "attention_mask.to(dtype=hidden_states.dtype)", "colossalai-gpt2-empty-stage-dtype")
    _replace_in_method(gpt2, "_get_attention_mask", "torch.finfo(self.dtype)", "torch.finfo(hidden_states.dtype)",
                       "colossalai-gpt2-empty-stage-dtype")


def _colossalai_empty_stage_checkpoint_load():
    """Colossal-AI 0.5.0: HybridParallelCheckpointIO.load_sharded_model raises "No weigth is loaded into the model"
    when no checkpoint file was loaded (checkpoint_io/hybrid_parallel_checkpoint_io.py:447-450), which is also the
    case of a pipeline stage that holds no parameter and no buffer (more stages than blocks: a stage between the
    embedding's and the head's), so a sharded checkpoint cannot be loaded into such a layout, though a fresh run of it
    trains (docs/findings/colossalai-0.5.0-hybrid-checkpoint-load-into-stage-without-parameters.py). Fix: a stage
    asked for nothing loads nothing (its missing keys are none)."""
    from colossalai.checkpoint_io.hybrid_parallel_checkpoint_io import HybridParallelCheckpointIO

    anchor = "\n    if len(missing_keys) == 0:\n"  # (in the dedented method)
    _replace_in_method(HybridParallelCheckpointIO, "load_sharded_model", anchor,
                       "\n    if not loaded_file and not missing_file_keys:\n        missing_keys.append([])" + anchor,
                       "colossalai-empty-stage-checkpoint-load")


def _colossalai_fused_qkv_optimizer_state():
    """Colossal-AI 0.5.0: HybridParallelCheckpointIO writes a fused column-parallel parameter's optimizer states in its
    shards' order, not the parameter's. Its weights it gathers with the layer's own `gather_fn` (GPT-2's `c_attn`,
    GPT2FusedLinearConv1D_Col: rank r holds [q_r | k_r | v_r], the whole is [q | k | v]); its Adam moments
    `gather_from_sharded_optimizer_state` concatenates over the tp group (checkpoint_io/hybrid_parallel_checkpoint_io.py
    :1061-1065), so the saved states run [q_0 k_0 v_0 q_1 k_1 v_1], and `shard_from_complete_optimizer_state` (:1110-
    1126) cuts the loaded ones into equal slices. The two cancel only for the same tp degree: a run resumed under
    another one (or into a model without tp) steps every q, k and v column with another column's moments, silently
    (docs/findings/colossalai-0.5.0-hybrid-fused-qkv-optimizer-state-tp-order.py). Fix: the layer's gather_fn gathers
    the states as it gathers the weights; on load each rank's slice of a fused state is the layer's `shard_fn` of the
    whole one (the states are put in the shards' order that the equal slicing expects)."""
    import torch
    import torch.distributed as dist
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as io

    cls = io.HybridParallelCheckpointIO
    old = """            if partition_dim is not None:
                gather_tensor = [torch.zeros_like(v) for _ in range(tp_size)]"""
    new = """            if partition_dim is not None and getattr(param, "gather_fn", None) is not None:
                v = param.gather_fn(v)
            elif partition_dim is not None:
                gather_tensor = [torch.zeros_like(v) for _ in range(tp_size)]"""
    _replace_in_method(cls, "gather_from_sharded_optimizer_state", old, new, "colossalai-fused-qkv-optimizer-state")

    def in_shard_order(state, param, tp_group, original_shape):
        """A fused parameter's complete states as its shards concatenated (what the equal slicing expects)."""
        tp = dist.get_world_size(tp_group)
        dim = io.search_tp_partition_dim(param.shape, original_shape, tp)
        if getattr(param, "shard_fn", None) is None or dim is None:
            return state
        out = dict(state)
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":
                mine = param.shard_fn(v.to(param.device)).contiguous()
                pieces = [torch.empty_like(mine) for _ in range(tp)]
                dist.all_gather(pieces, mine, group=tp_group)
                out[k] = torch.cat(pieces, dim=dim).to(v.device)
        return out

    io._shardfuzz_in_shard_order = in_shard_order
    old = """            new_states[param] = self.shard_from_complete_optimizer_state(
                state,"""
    new = """            new_states[param] = self.shard_from_complete_optimizer_state(
                _shardfuzz_in_shard_order(state, working_param, self.tp_group, original_shape),"""
    _replace_in_method(cls, "load_states_into_optimizer", old, new, "colossalai-fused-qkv-optimizer-state")


#: Which of the two megatron label-smoothing fixes are on: they patch the same forward, so either alone or both.
_MEGATRON_SMOOTHING = {"global_vocab": False, "log_softmax": False}


def _megatron_smoothing_forward():
    """Installs megatron-core 0.19.2's `_VocabParallelCrossEntropy` with its label-smoothing path as released but
    for the fixes `_MEGATRON_SMOOTHING` turns on; the backward as released, given the vocabulary size used."""
    import torch
    from megatron.core.tensor_parallel import cross_entropy as ce

    if getattr(ce._VocabParallelCrossEntropy, "shardfuzz_fixed", False):
        return
    released, vp, fix = ce._VocabParallelCrossEntropy, ce.VocabParallelCrossEntropy, _MEGATRON_SMOOTHING
    SUM, MAX = torch.distributed.ReduceOp.SUM, torch.distributed.ReduceOp.MAX

    class Fixed(torch.autograd.Function):
        shardfuzz_fixed = True

        @staticmethod
        def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0, tp_group=None):
            if tp_group is None:
                tp_group = ce.get_tensor_model_parallel_group()
            logits, logits_max = vp.calculate_logits_max(vocab_parallel_logits)
            torch.distributed.all_reduce(logits_max, op=MAX, group=tp_group)
            smooth_from_logits = label_smoothing > 0 and fix["log_softmax"]
            logit_sum = logits.sum(dim=-1) if smooth_from_logits else None  # (before the in-place exp)
            partition, rank, world = logits.size()[-1], ce.get_pg_rank(tp_group), ce.get_pg_size(tp_group)
            start, end = ce.VocabUtility.vocab_range_from_per_partition_vocab_size(partition, rank, world)
            target_mask, masked_target_1d, predicted, sum_exp, exp_logits = vp.calculate_predicted_logits(
                logits, target, logits_max, start, end)
            torch.distributed.all_reduce(predicted, op=SUM, group=tp_group)
            torch.distributed.all_reduce(sum_exp, op=SUM, group=tp_group)
            exp_logits, loss = vp.calculate_cross_entropy_loss(exp_logits, predicted, sum_exp)
            vocab_size = partition * world if fix["global_vocab"] else partition
            if label_smoothing > 0:
                smoothing = label_smoothing * vocab_size / (vocab_size - 1)
                if smooth_from_logits:  # log p = x - max - log(sum exp): no log of an underflowed probability
                    log_prob_sum = logit_sum - partition * (logits_max + torch.log(sum_exp))
                else:
                    log_prob_sum = torch.log(exp_logits).sum(dim=-1)
                if fix["global_vocab"]:
                    torch.distributed.all_reduce(log_prob_sum, op=SUM, group=tp_group)
                loss = (1.0 - smoothing) * loss - smoothing * log_prob_sum / vocab_size
            ctx.label_smoothing, ctx.vocab_size = label_smoothing, vocab_size
            ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
            return loss

        backward = released.backward

    ce._VocabParallelCrossEntropy = Fixed


def _megatron_vocab_parallel_label_smoothing():
    """megatron-core 0.19.2: `vocab_parallel_cross_entropy` with `label_smoothing` > 0 takes the rank's vocabulary
    shard for the whole vocabulary (cross_entropy.py:158-176, :191-200): the smoothing coefficient from the shard's
    size and the mean log-probability over the shard only, never all-reduced, so under tensor parallelism every
    rank's loss differs and each non-target logit's gradient is off by α / (V_shard - 1) - α / (V - 1)
    (docs/findings/megatron-core-0.19.2-vocab-parallel-label-smoothing-local-vocab.py; upstream NVIDIA/Megatron-LM
    #737, #7464, open). Fix: the global vocabulary's size, and its log-probabilities' sum all-reduced over the
    tensor-parallel group."""
    _MEGATRON_SMOOTHING["global_vocab"] = True
    _megatron_smoothing_forward()


def _megatron_label_smoothing_log_underflow():
    """megatron-core 0.19.2: `vocab_parallel_cross_entropy`'s label smoothing takes `torch.log` of the softmax
    probabilities (cross_entropy.py:174), so a probability that underflows to 0 in fp32 (a logit more than about 104
    below the row's largest) makes the smoothed loss infinite and the step NaN, at any tensor-parallel size, where
    torch's log-softmax stays finite (docs/findings/megatron-core-0.19.2-label-smoothing-log-of-underflowed-softmax.py;
    upstream: named in the unmerged PRs NVIDIA/Megatron-LM#5522 and #7466). Fix: the log-probabilities' sum from the
    logits, Σ x - V (max + log Σ exp)."""
    _MEGATRON_SMOOTHING["log_softmax"] = True
    _megatron_smoothing_forward()


def _megatron_gathered_logits_language_model_loss():
    """megatron-core 0.19.2: GPTModel builds its output layer with `gather_output=not parallel_output`
    (gpt_model.py:280), and given labels its forward returns `compute_language_model_loss` (:794), which always
    calls the vocabulary-parallel cross-entropy (language_module.py:194): with `parallel_output=False` under tensor
    parallelism every rank's whole-vocabulary logits are taken for its shard, so the all-reduced sum of exponentials
    counts the vocabulary tp times and only the first rank finds the target: the loss is the right one plus log(tp)
    and the target's gradient is lost (docs/findings/megatron-core-0.19.2-gpt-gathered-logits-loss-plus-log-tp.py;
    upstream: finding 2 of NVIDIA/Megatron-LM#7452, open). Fix: gathered logits take the whole-vocabulary loss."""
    import torch.nn.functional as F
    from megatron.core.models.common.language_module.language_module import LanguageModule

    released = LanguageModule.compute_language_model_loss

    def compute_language_model_loss(self, labels, logits):
        if getattr(self, "parallel_output", True):
            return released(self, labels, logits)
        s, b, v = logits.shape
        loss = F.cross_entropy(logits.float().reshape(-1, v), labels.t().reshape(-1), reduction="none")
        return loss.view(s, b).t().contiguous()

    LanguageModule.compute_language_model_loss = compute_language_model_loss


def _megatron_partial_distopt_grad_sync_twice():
    """megatron-core 0.19.2: with several distributed-optimizer instances `start_grad_sync` runs synchronously and
    leaves `grad_reduce_handle` None (param_and_grad_buffer.py:676-679, :779); on a pipeline stage whose schedule
    starts the reduction itself (`config.grad_sync_func`, every stage but the first under Megatron-LM's default
    `align_grad_reduce`) `is_first_batch` is never cleared, so `finish_grad_sync` starts it again every iteration and
    the guard (:603-606, "no-op if ... already dispatched") tests the handle: the gradients are scaled and reduced
    twice (docs/findings/megatron-core-0.19.2-partial-distopt-overlapped-grads-reduced-twice-on-later-pipeline-stages.py).
    Fix: with several instances, a second start of the same iteration (until the bucket group's reset) is a no-op."""
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

    start, reset = _ParamAndGradBucketGroup.start_grad_sync, _ParamAndGradBucketGroup.reset

    def start_grad_sync(self, *args, **kwargs):
        if self.ddp_config.num_distributed_optimizer_instances > 1:
            if getattr(self, "_shardfuzz_started", False):
                return None
            self._shardfuzz_started = True
        return start(self, *args, **kwargs)

    def reset_(self):
        self._shardfuzz_started = False
        return reset(self)

    _ParamAndGradBucketGroup.start_grad_sync, _ParamAndGradBucketGroup.reset = start_grad_sync, reset_


#: colossalai-moe runs HybridParallelPlugin's subclass and shardformer too: the plugin's and shardformer's fixes apply to it.
COLOSSALAI_HYBRID = ("colossalai-hybrid", "colossalai-moe")
COLOSSALAI_SHARDFORMER = ("colossalai-tp", *COLOSSALAI_HYBRID)

#: name -> (the targets it concerns, the fix)
def _megatron_moe_expert_bias_sequence_parallel():
    """megatron-core 0.19.2: RowParallelLinear marks its bias `sequence_parallel` under sequence parallelism, experts'
    too (MoE with `add_bias_linear`, which megatron allows at expert-tensor-parallel size 1 only). An expert's fc2
    bias is added to the tokens dispatched to it, not to a sequence chunk, and its gradient is reduced over the
    expert-data-parallel group by DDP; finalize_model_grads (`_allreduce_non_tensor_model_parallel_grads`) sums every
    `sequence_parallel` gradient over the tensor-parallel group as well, adding another rank's expert bias gradient to
    it (docs/findings/megatron-core-0.19.2-moe-expert-bias-grad-summed-over-tp.py). Fix: an expert's bias is not
    marked."""
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    original = RowParallelLinear.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.is_expert and self.bias is not None:
            self.bias.sequence_parallel = False

    RowParallelLinear.__init__ = init


def _megatron_moe_expert_bias_inplace_view():
    """megatron-core 0.19.2: an expert MLP with a bias adds it in place, `output += output_bias * per_token_scale`
    (transformer/mlp.py:354), to its fc2's output. Without expert parallelism (ep 1; biases need expert-tensor-parallel
    size 1) the fc2, a RowParallelLinear, does not take the experts' explicit communication path
    (`explicit_expert_comm` needs a group larger than one or ep > 1) and returns the output of its reduction over a
    group of one, which megatron's autograd function hands back as its input: autograd refuses the in-place add to
    that view, so every training step with MoE biases at ep 1 crashes
    (docs/findings/megatron-core-0.19.2-moe-expert-bias-grad-summed-over-tp.py, `--ep 1`). Fix: experts' fc2 always
    takes the explicit path (what it does at ep > 1; the reduction over one rank is the identity)."""
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    original = RowParallelLinear.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.is_expert:
            self.explicit_expert_comm = True

    RowParallelLinear.__init__ = init


def _megatron_moe_aux_loss_per_token_counted():
    """megatron-core 0.19.2: under `calculate_per_token_loss` the router pre-multiplies the MoE auxiliary loss by its
    own token count x the tensor/context-parallel size (`attach_and_log_load_balancing_loss`), to cancel
    finalize_model_grads's division by the global count the loss functions return; tokens the loss mask leaves out but
    the router routes are in the first and not in the second, so the auxiliary gradient grows by tokens / counted
    tokens (docs/findings/megatron-core-0.19.2-moe-aux-loss-per-token-loss-masked-tokens.py). Fix: pre-multiply by
    the counted tokens finalize divides by over the factor the schedule and DDP divide by (micro-batches x dp), as
    the router's comment states its target (`batch_tokens`, from the target: the model's forward cannot know them)."""
    from megatron.core.transformer.moe.router import TopKRouter

    original = TopKRouter.attach_and_log_load_balancing_loss

    def attach(self, *args, **kwargs):
        if self.calculate_per_token_loss:
            kwargs["valid_token_count"] = _BATCH["count"] / _BATCH["divided_by"] / self.tp_cp_group.size()
        return original(self, *args, **kwargs)

    TopKRouter.attach_and_log_load_balancing_loss = attach


def _megatron_moe_router_gemm_without_te():
    """megatron-core 0.15.3 without Transformer Engine: moe_utils imports `te_general_gemm` inside a `try` that sets
    only HAVE_TE = False when Transformer Engine is missing, and RouterGatingLinearFunction then tests
    `te_general_gemm is not None`: every MoE router forward raises "NameError: name 'te_general_gemm' is not defined"
    (fixed by 0.19.2, whose import fallback defines it; docs/findings/megatron-core-0.15.3-moe-router-te-general-gemm-
    undefined-without-te.py). Fix: the name defined as None where it is missing."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _megatron_distopt_legacy_checkpoint_state_copy():
    """megatron-core 0.15.3 and 0.19.2: a distributed-optimizer checkpoint in the legacy format (`save_parameter_state`
    beside the optimizer's state dict) cannot be loaded where megatron runs torch's Adam (no Apex or TE): its
    `load_state_dict` gives every parameter's state a `step` tensor, and `_set_main_param_and_optimizer_states` copies
    into every tensor of that state, looking each up among the checkpoint's `param`, `exp_avg`, `exp_avg_sq`
    (KeyError: 'step'); with fp32 parameters its first copy, into the main parameter (a view of the model's parameter),
    runs outside torch.no_grad() and fails ("a view of a leaf Variable that requires grad is being used in an in-place
    operation") (docs/findings/megatron-core-0.19.2-distopt-legacy-checkpoint-unloadable-without-te.py). The fp32 copy
    fails alike loading megatron's distributed checkpoint (`torch_dist`, `load_parameter_state_from_dp_reshardable`;
    docs/findings/megatron-core-0.19.2-distopt-torch-dist-resume-without-te.py). Fix: the copies under
    torch.no_grad(), of the tensors the checkpoint has."""
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states

    def set_main_param_and_optimizer_states(self, model_param, tensors):
        if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            return original(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        destinations = {"param": main_param, **self.optimizer.state[main_param]}
        with torch.no_grad():
            for key, value in tensors.items():
                if isinstance(value, torch.Tensor) and isinstance(destinations.get(key), torch.Tensor):
                    destinations[key].copy_(value)

    DistributedOptimizer._set_main_param_and_optimizer_states = set_main_param_and_optimizer_states


def _megatron_distopt_shared_step_after_load():
    """megatron-core 0.15.3 and 0.19.2: `DistributedOptimizer.load_state_dict`, where megatron runs torch's Adam (no
    Apex or TE), gives every parameter's state the same `step` tensor (its HybridDeviceOptimizer branch clones it per
    parameter), and torch's Adam advances it once per parameter: after loading, a rank whose shard holds n parameters
    counts n steps per step, and every update is bias-corrected for the wrong step, silently (behind the load crash of
    `megatron-distopt-legacy-checkpoint-state-copy`;
    docs/findings/megatron-core-0.19.2-distopt-legacy-checkpoint-unloadable-without-te.py `--fixed-copy`). Fix: a step
    tensor of its own for every parameter."""
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer.load_state_dict

    def load_state_dict(self, state_dict):
        original(self, state_dict)
        for state in self.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()

    DistributedOptimizer.load_state_dict = load_state_dict


def _megatron_distopt_empty_optimizer_state_dict():
    """megatron-core 0.15.3 and 0.19.2: where megatron runs torch's Adam (no Apex or TE), the state dict of a
    distributed optimizer holding no parameters (the expert-parallel one of a pipeline stage without MoE layers, which
    megatron builds with an empty parameter group rather than as a stub; or, on megatron-ddp, campaign 295, a
    data-parallel rank whose slice of every bucket holds no parameter) asserts one step count among none
    (`state_dict`, and `load_state_dict` likewise), so such a model cannot be checkpointed; the Apex / TE branch
    allows none (docs/findings/megatron-core-0.19.2-distopt-checkpoint-before-first-step-or-on-a-dense-stage.py
    `--dense-stage`). Fix: such an optimizer's state dict is its parameter groups and loss scaler only."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    state_dict, load_state_dict = DistributedOptimizer.state_dict, DistributedOptimizer.load_state_dict

    def empty(self):
        return not self.is_stub_optimizer and not any(g["params"] for g in self.optimizer.param_groups)

    def state_dict_of_empty(self):
        if not empty(self):
            return state_dict(self)
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        scaler = {"grad_scaler": self.grad_scaler.state_dict()} if self.grad_scaler else {}
        return {"optimizer": {"param_groups": groups}} | scaler

    def load_state_dict_of_empty(self, saved):
        if not empty(self):
            return load_state_dict(self, saved)
        if self.grad_scaler and "grad_scaler" in saved:
            self.grad_scaler.load_state_dict(saved["grad_scaler"])

    DistributedOptimizer.state_dict, DistributedOptimizer.load_state_dict = state_dict_of_empty, load_state_dict_of_empty


def _megatron_distopt_checkpoint_before_first_step():
    """megatron-core 0.15.3 and 0.19.2: the distributed optimizer cannot checkpoint before its first step (a seed
    checkpoint, or a first fp16 step its loss scaler skipped) where megatron runs torch's Adam: the inner optimizer
    has no state yet, so `get_parameter_state_dp_zero` (the legacy format's `save_parameter_state`) reads a missing
    `exp_avg` (KeyError) and `state_dict` asserts one step count among none
    (docs/findings/megatron-core-0.19.2-distopt-checkpoint-before-first-step-or-on-a-dense-stage.py). The same
    assertion stops every resume from megatron's default distributed checkpoint (`torch_dist`): the fresh optimizer's
    `sharded_state_dict(is_loading=True)` calls `state_dict` before anything is loaded
    (docs/findings/megatron-core-0.19.2-distopt-torch-dist-resume-without-te.py). Fix: before
    either, the state materialised inertly (a step over zero gradients at learning rate and weight decay 0, the step
    counts back to zero after), as the fresh optimizer's `load_state_dict` materialises it."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    def materialised(method):
        def call(self, *args, **kwargs):
            if not self.optimizer.state and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
                _materialise_optimizer_state_inertly(self.optimizer, lambda _p: True)
            return method(self, *args, **kwargs)

        return call

    DistributedOptimizer.get_parameter_state_dp_zero = materialised(DistributedOptimizer.get_parameter_state_dp_zero)
    DistributedOptimizer.state_dict = materialised(DistributedOptimizer.state_dict)


def _megatron_sgd_torch_dist_load_init_state():
    """megatron-core 0.19.2: an SGD optimizer (`optimizer='sgd'`: megatron's FP32Optimizer or
    Float16OptimizerWithFloat16Params, the distributed optimizer being Adam-family only) cannot be resumed from megatron's
    default distributed checkpoint: `get_megatron_optimizer` builds it with `init_state_fn=None` (only Adam and Lion get
    one), and `sharded_state_dict(..., is_loading=True)`, which Megatron-LM's `load_checkpoint` calls on the fresh
    optimizer, calls `self.init_state_fn(self.optimizer, self.config)`: TypeError: 'NoneType' object is not callable
    (docs/findings/megatron-core-0.19.2-non-distributed-optimizer-torch-dist-resume.py). Fix: an SGD optimizer's state initialised
    as torch's SGD would hold it (a zero momentum buffer per parameter where the momentum is not 0; nothing else)."""
    import torch
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    def init_sgd_state(opt, config=None):
        for group in opt.param_groups:
            if group.get("momentum", 0) != 0:
                for p in group["params"]:
                    opt.state[p].setdefault("momentum_buffer", torch.zeros_like(p.data))

    original = MegatronOptimizer.__init__

    def init(self, optimizer, *args, **kwargs):
        original(self, optimizer, *args, **kwargs)
        if getattr(self, "init_state_fn", False) is None and isinstance(optimizer, torch.optim.SGD):
            self.init_state_fn = init_sgd_state

    MegatronOptimizer.__init__ = init


def _megatron_torch_dist_checkpoint_before_first_step():
    """megatron-core 0.19.2: megatron's non-distributed optimizers (FP32Optimizer, Float16OptimizerWithFloat16Params)
    write a distributed checkpoint (`torch_dist`) taken before their first step (a seed checkpoint, or a first fp16
    step its loss scaler skipped) that they cannot load: the inner optimizer has no state yet, so `sharded_state_dict`
    writes none, while the fresh optimizer's `sharded_state_dict(..., is_loading=True)` first runs `init_state_fn`
    (Adam's moments) and asks the checkpoint for them: "optimizer.state.exp_avg.<param> from model not in state dict"
    (docs/findings/megatron-core-0.19.2-non-distributed-optimizer-torch-dist-resume.py `--adam-seed`).
    Fix: before such a save, the state materialised inertly (a step over zero gradients at learning rate and weight
    decay 0, the step counts back to zero after), and its step count of 0 saved (`sharded_state_dict` saves the common
    step only `if step:`)."""
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params, FP32Optimizer

    for cls in (FP32Optimizer, Float16OptimizerWithFloat16Params):
        original = cls.sharded_state_dict

        def sharded_state_dict(self, model_sharded_state_dict, is_loading=False, *args, _original=original,
                               **kwargs):
            inner = getattr(self, "optimizer", None)
            fresh = not is_loading and inner is not None and not inner.state and self.init_state_fn is not None
            if fresh:
                _materialise_optimizer_state_inertly(inner, lambda _p: True)
            state = _original(self, model_sharded_state_dict, is_loading, *args, **kwargs)
            steps = [s["step"] for s in inner.state.values() if "step" in s] if fresh else []
            saved = state["optimizer"]["state"] if "optimizer" in state else state["state"]  # (FP32Optimizer's is flat)
            if steps and "common_step" not in saved:
                # (its `if step:` drops a step count of 0, which the load then misses: KeyError 'step')
                saved["common_step"] = steps[0]
            return state

        cls.sharded_state_dict = sharded_state_dict


def _dp_reshardable_buckets(state):
    """The per-bucket lists of a distributed optimizer's `dp_reshardable` parameter state (its integer keys are
    gradient buffers, each holding a list of buckets per dtype; the others are metadata)."""
    for key, per_dtype in state.items():
        if isinstance(key, int):
            for buckets in per_dtype.values():
                yield from buckets


def _megatron_distopt_dp_reshardable_bucket_padding():
    """megatron-core 0.19.2: the distributed optimizer cannot write megatron's default distributed checkpoint
    (`torch_dist`, its state `dp_reshardable`) where the padding it writes around a data-parallel rank's parameters
    does not fit the bucket's unpadded size. `sharded_param_state_dp_reshardable` covers each rank's slice of a bucket
    with its parameters and the gaps between them, each gap a ShardedTensor piece of the tensor of the bucket's
    unpadded size; the gap after the slice's last parameter runs to the end of the slice even where the unpadded size
    ends inside it (the alignment padding before the next bucket's first parameter counts into it, the padding to a
    data-parallel multiple does not): torch's planner refuses the piece ("Failed to validate global plan ... out of
    bounds chunk"); and a slice holding no parameter at all stops the save first ("empty bucket encountered").
    Both met by campaign 289 on fp16 pipeline stages whose buckets hold a few small parameters
    (docs/findings/megatron-core-0.19.2-distopt-dp-reshardable-bucket-padding.py). Fix: each gap ends at the unpadded
    size, and a slice without parameters is one padding entry of length 0, from which the function's own gap filling
    covers it (the loader skips padding)."""
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    anchor = """                    if (
                        next_param_start != cur_param_end
                        and world_param_end < gbuf_world_numel_unpadded
                    ):"""  # (as the method's dedented source has it)
    from megatron.core.dist_checkpointing import ShardedTensor

    clipped = ("                    next_param_start = min(next_param_start, gbuf_world_numel_unpadded"
               " - data_parallel_rank * gbuf_local_numel)\n" + anchor)
    _replace_in_method(DistributedOptimizer, "sharded_param_state_dp_reshardable", anchor, clipped,
                       "megatron-distopt-dp-reshardable-bucket-padding")
    original = DistributedOptimizer.get_parameter_state_dp_reshardable

    def get_parameter_state_dp_reshardable(self):
        state = original(self)
        for bucket in _dp_reshardable_buckets(state):
            if not bucket:
                empty = {k: torch.empty(0, dtype=self._get_state_key_dtype(k))
                         for k in ("param",) + tuple(self.optimizer_state_keys)}
                bucket.append({**empty, "gbuf_local_start": 0, "gbuf_local_end": 0, "padding": True})
        return state

    DistributedOptimizer.get_parameter_state_dp_reshardable = get_parameter_state_dp_reshardable
    sharded = DistributedOptimizer.sharded_param_state_dp_reshardable

    def sharded_param_state_dp_reshardable(self, *args, **kwargs):
        state = sharded(self, *args, **kwargs)
        for bucket in _dp_reshardable_buckets(state):
            for tensors in bucket:  # (a piece of length 0 covers nothing: the planner may find it out of bounds)
                for name in [n for n, v in tensors.items() if isinstance(v, ShardedTensor) and v.data.numel() == 0]:
                    del tensors[name]
        return state

    DistributedOptimizer.sharded_param_state_dp_reshardable = sharded_param_state_dp_reshardable


def _megatron_distopt_fully_reshardable_bucket_padding():
    """megatron-core 0.19.2: the distributed optimizer's `fully_reshardable` checkpoint (the format Megatron-LM writes
    for a run resuming into another layout, `--dist-ckpt-optim-fully-reshardable`) misplaces the state of every
    parameter after a buffer's first padded bucket. `get_parameter_state_dp_zero` packs each buffer's buckets one after
    another with each bucket's end padding stripped, but `sharded_param_state_fully_reshardable` slices every
    parameter's state out of (and, loading, into) that packed tensor at its `param_index_map` offsets, which count the
    padding: such a parameter is written from the wrong offset (its tail past the end zero-filled, "param range exceeds
    unpadded buffer ... data corruption") and read back into whatever the new layout puts there, so a run resumed
    under other tensor- or data-parallel degrees trains from corrupted weights and moments. Found with a tied
    embedding over pipeline stages (its own bucket) and with small buckets, resumed from dp 2 into tp 2
    (docs/findings/megatron-core-0.19.2-distopt-fully-reshardable-bucket-padding.py). Fixed upstream by
    NVIDIA/Megatron-LM#5077 (merged 2026-05-31, not in the 0.19.2 release): the padding stripped before the
    parameter's bucket is subtracted from its offsets."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    old = "                    state_ten = world_tensors[state_key][param_world_start:param_world_end]\n"
    new = ("                    _stripped = sum(b.grad_data.numel() - b.numel_unpadded\n"
           "                                    for b in buffer.buckets[:buffer.param_index_map[model_param][2]])\n"
           "                    state_ten = world_tensors[state_key][param_world_start - _stripped:"
           "param_world_end - _stripped]\n")
    _replace_in_method(DistributedOptimizer, "sharded_param_state_fully_reshardable", old, new,
                       "megatron-distopt-fully-reshardable-bucket-padding")


def _megatron_distopt_dp_reshardable_step_overwritten():
    """megatron-core 0.15.3 and 0.19.2: loading megatron's default distributed checkpoint (`torch_dist`, the distributed
    optimizer's state `dp_reshardable`) where megatron runs torch's Adam (no Apex or TE) puts back the fresh
    optimizer's own step count in place of the checkpoint's: `sharded_param_state_dp_reshardable` keeps each
    parameter's `step` as a LocalNonpersistentObject (the live tensor, not read from the checkpoint), `load_state_dict`
    sets the checkpoint's step, and `load_parameter_state_from_dp_reshardable` then copies the non-persistent one over
    it (`_set_main_param_and_optimizer_states`), where the fully-reshardable and model-space loaders skip `step`; every
    update after a resume is bias-corrected as if training had just begun, silently
    (docs/findings/megatron-core-0.19.2-distopt-torch-dist-resume-without-te.py; a review comment on a fork's port of
    the `step` special case, radixark/Megatron-LM#69, describes the same reset under `--optimizer-cpu-offload`). Fix:
    the dp_reshardable loader skips `step` as the others do."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer.load_parameter_state_from_dp_reshardable

    def load_parameter_state_from_dp_reshardable(self, state_dict):
        for bucket in _dp_reshardable_buckets(state_dict):
            for tensors in bucket:
                tensors.pop("step", None)
        return original(self, state_dict)

    DistributedOptimizer.load_parameter_state_from_dp_reshardable = load_parameter_state_from_dp_reshardable


def _megatron_chained_optimizer_rank0_common_step():
    """megatron-core 0.19.2: megatron's distributed checkpoint keeps an optimizer's non-tensor state (its parameter
    groups, and its step count: the groups' `step` for the distributed optimizer, the state's `common_step` for the
    others) as common state, written by global rank 0 and read by every rank, wherever that state is not wrapped in
    ShardedObjects per model-parallel group: the non-distributed optimizers in the default format, the distributed one
    in `fully_reshardable`. Every pipeline stage thus resumes with stage 0's. Where stage 0 has no MoE layer its
    expert-parallel optimizer is empty and has no step to write, so a stage with experts loads its expert optimizer
    without one: KeyError: 'step' (torch's Adam `__setstate__`, or the distributed optimizer's `load_state_dict`
    without Apex / TE; with them, read from the code, the expert step count restarts silently)
    (docs/findings/megatron-core-0.19.2-rank0-optimizer-common-state-on-every-stage.py). Fix: before they are written,
    the chained optimizer's sub-optimizers without a step take the chain's (as `_synchronize_steps` aligns the
    others)."""
    import copy

    from megatron.core.optimizer.optimizer import ChainedOptimizer

    original = ChainedOptimizer.sharded_state_dict

    def torch_style(sub):
        # (a sub-optimizer's torch-style dict: its groups, and for the non-distributed ones its state)
        inner = sub.get("optimizer", sub) if isinstance(sub, dict) else None
        return inner if isinstance(inner, dict) and isinstance(inner.get("param_groups"), list) else None

    def sharded_state_dict(self, model_sharded_state_dict, is_loading=False, **kwargs):
        state = original(self, model_sharded_state_dict, is_loading, **kwargs)
        subs = state.values() if len(self.chained_optimizers) > 1 else [state]
        inners = [i for i in map(torch_style, subs) if i is not None]
        group_steps = [g["step"] for i in inners for g in i["param_groups"] if "step" in g]
        common = [i["state"]["common_step"] for i in inners if "common_step" in (i.get("state") or {})]
        for inner in inners:
            for g in inner["param_groups"] if group_steps else []:
                g.setdefault("step", group_steps[0])
            if common and isinstance(inner.get("state"), dict) and "common_step" not in inner["state"]:
                inner["state"]["common_step"] = copy.deepcopy(common[0])
        return state

    ChainedOptimizer.sharded_state_dict = sharded_state_dict


def _megatron_moe_pad_to_capacity_above_tokens():
    """megatron-core 0.19.2: the all-to-all token dispatcher cannot pad expert inputs to a capacity above the rank's
    token count (`moe_pad_expert_input_to_capacity` with `moe_expert_capacity_factor` over experts / top_k, or few
    tokens per rank): `permute`'s drop-and-pad branch keeps the first `capacity` of each expert's argsorted token
    indices, which are only as many as the tokens, then views them as [experts, capacity]: "shape '[E, C]' is invalid
    for input of size E x tokens". The router's own token-drop code (`apply_router_token_dropping`) handles the case
    ("No need to drop tokens if capacity exceeds the number of tokens"); the dispatcher does not (campaign 200, again
    289 and 293; docs/findings/megatron-core-0.19.2-moe-pad-to-capacity-above-tokens-permute-crash.py). Fix: the dispatcher's capacity at
    most the rank's token count (an expert receives each token once at most: nothing more is dropped, only fewer
    zero-weighted padding rows computed)."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    old = """            capacity_factor=self.moe_expert_capacity_factor,
        )
        self.num_out_tokens = self.capacity * self.num_experts"""  # (in the dedented method)
    new = """            capacity_factor=self.moe_expert_capacity_factor,
        )
        self.capacity = min(self.capacity, routing_map.size(0))
        self.num_out_tokens = self.capacity * self.num_experts"""
    _replace_in_method(MoEAlltoAllTokenDispatcher, "preprocess", old, new, "megatron-moe-pad-to-capacity-above-tokens")


def _megatron_tp_attributes_without_initialization():
    """megatron-core 0.15.3: ColumnParallelLinear, RowParallelLinear and VocabParallelEmbedding mark their weight
    `tensor_model_parallel` (with its partition dim) only inside the initialisation they skip under
    `perform_initialization=False` (a model loaded from a checkpoint or built to receive weights), so the
    optimizer's gradient norm counts those weights' shards on tensor-parallel rank 0 only
    (`param_is_not_tensor_parallel_duplicate`): under tp > 1 the norm is too small and clipping scales every
    gradient wrong. Known upstream (NVIDIA-NeMo/Megatron-Bridge#992 keeps initialisation on as a workaround);
    0.19.2 sets the attributes either way (docs/findings/megatron-core-0.15.3-tp-attributes-unset-without-
    initialization-clip-norm.py). Fix: the attributes set where the layer left them unset."""
    from megatron.core.tensor_parallel import layers

    for cls, dim in ((layers.ColumnParallelLinear, 0), (layers.RowParallelLinear, 1),
                     (layers.VocabParallelEmbedding, 0)):
        def init(self, *args, _original=cls.__init__, _dim=dim, **kwargs):
            _original(self, *args, **kwargs)
            weight = getattr(self, "weight", None)
            if weight is not None and not hasattr(weight, "tensor_model_parallel"):
                layers.set_tensor_model_parallel_attributes(weight, True, _dim, 1)

        cls.__init__ = init


def _megatron_moe_position_drop_topk_ties():
    """megatron-core 0.19.2: the `position` token-drop policy ("tokens at the end of each batch will be dropped")
    picks each expert's kept tokens with `torch.topk(routing_map.int(), k=capacity, dim=0, sorted=False)`: every
    routed token ties at 1, and which of the ties topk returns is unspecified (on the CPU not the earliest), so it
    keeps arbitrary tokens, not the first (docs/findings/megatron-core-0.19.2-moe-position-drop-policy-topk-ties.py).
    Fix: the first `capacity` tokens of an order without ties, routed tokens before the others, each by position
    (with `pad_to_capacity` the others pad the expert's slots, as megatron's own mask does)."""
    import torch
    from megatron.core.transformer.moe import moe_utils, router

    original = moe_utils.apply_router_token_dropping

    def dropping(routing_probs, routing_map, router_topk, capacity_factor, drop_policy="probs",
                 pad_to_capacity=False):
        tokens, experts = routing_map.shape
        capacity = moe_utils.get_capacity(tokens * router_topk, experts, capacity_factor)
        if drop_policy != "position" or capacity > tokens:
            return original(routing_probs, routing_map, router_topk, capacity_factor, drop_policy, pad_to_capacity)
        # Routed tokens before the others, each in position order: the first `capacity` of this order.
        order = routing_map.long() * (tokens + 1) + (tokens - torch.arange(tokens)).unsqueeze(1)
        kept = torch.zeros_like(routing_map).scatter(0, torch.topk(order, k=capacity, dim=0).indices, True)
        final = kept if pad_to_capacity else torch.logical_and(routing_map, kept)
        return routing_probs * final, final

    moe_utils.apply_router_token_dropping = router.apply_router_token_dropping = dropping


def _deepspeed_moe_top1_no_rts_topk_ties():
    """deepspeed 0.19.8: top-1 gating without random token selection (`use_rts=False`) picks each expert's kept tokens
    with `torch.topk(mask1, k=capacity, dim=0)` on the 0/1 routing mask: every routed token ties at 1, and which ties
    topk returns is unspecified (on the CPU not the earliest), so an expert keeps arbitrary tokens where GShard's policy,
    which the locations DeepSpeed counts by position follow, keeps the first
    (docs/findings/deepspeed-0.19.8-moe-top1-no-rts-topk-ties.py). Fix: random token selection's scores replaced by
    ones that fall with the token's position, so topk takes the earliest routed tokens."""
    import torch
    from deepspeed.moe import sharded_moe

    original = sharded_moe.top1gating

    def gating(logits, capacity_factor, min_capacity, used_token=None, noisy_gate_policy=None, drop_tokens=True,
               use_rts=True, *rest, **kwargs):
        if use_rts or not drop_tokens:
            return original(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy, drop_tokens, use_rts,
                            *rest, **kwargs)
        tokens, device = logits.shape[0], logits.device

        def by_position(shape):
            return ((tokens - torch.arange(tokens, device=device)).float() / tokens).unsqueeze(1).expand(shape)

        saved = sharded_moe.exp_selection_uniform_map.get(device)
        sharded_moe.exp_selection_uniform_map[device] = by_position
        try:
            return original(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy, drop_tokens, True,
                            *rest, **kwargs)
        finally:
            if saved is None:
                sharded_moe.exp_selection_uniform_map.pop(device, None)
            else:
                sharded_moe.exp_selection_uniform_map[device] = saved

    sharded_moe.top1gating = gating


def _colossalai_hybrid_ddp_beside_zero():
    """Colossal-AI 0.5.0: HybridParallelPlugin.configure wraps the model in torch's DDP wherever dp_size and pp_size are
    1 (`use_ddp = (dp > 1 and pp == 1 and zero_stage == 0) or (dp == 1 and pp == 1)`), whatever the ZeRO stage, so at
    one data-parallel rank DDP's reducer and HybridParallelZeroOptimizer's gradient hooks both take the gradients:
    under ZeRO 2 with gradient accumulation and two parameter groups the LM head's gradient comes out wrong (silent;
    found by campaign 311, docs/findings/colossalai-0.5.0-hybrid-ddp-beside-zero-at-dp1.py). Fix: no DDP where the
    plugin runs ZeRO (the first clause's own condition)."""
    from colossalai.booster.plugin import hybrid_parallel_plugin as hpp

    configure, module_init = hpp.HybridParallelPlugin.configure, hpp.HybridParallelModule.__init__
    zero = {"on": False}

    def configure_fixed(self, *args, **kwargs):
        zero["on"] = self.zero_stage > 0
        try:
            return configure(self, *args, **kwargs)
        finally:
            zero["on"] = False

    def init_fixed(self, *args, **kwargs):
        if zero["on"]:
            kwargs["use_ddp"] = False
        return module_init(self, *args, **kwargs)

    hpp.HybridParallelPlugin.configure, hpp.HybridParallelModule.__init__ = configure_fixed, init_fixed


FIXES = {
    "colossalai-row-bias-sp": (COLOSSALAI_SHARDFORMER, _colossalai_row_bias_sp),
    "colossalai-ring-gather": (COLOSSALAI_SHARDFORMER, _colossalai_ring_gather),
    "colossalai-narrow-linear-sp": (COLOSSALAI_SHARDFORMER, _colossalai_narrow_linear_sp),
    "colossalai-interleaved-metadata": (COLOSSALAI_HYBRID, _colossalai_interleaved_metadata),
    "colossalai-interleaved-metadata-requires-grad": (COLOSSALAI_HYBRID, _colossalai_interleaved_metadata_requires_grad),
    "colossalai-frozen-shared-param-sync": (COLOSSALAI_HYBRID, _colossalai_frozen_shared_param_sync),
    "colossalai-hybrid-ddp-beside-zero": (COLOSSALAI_HYBRID, _colossalai_hybrid_ddp_beside_zero),
    "colossalai-ce-mean-nonzero": (("colossalai-tp", "colossalai-hybrid"), _colossalai_ce_mean_nonzero),
    "colossalai-ce1d-empty-vocab-shard": (("colossalai-tp",), _colossalai_ce1d_empty_vocab_shard),
    # (These three wrap dist_cross_entropy; the batch mean rescales whatever computes the micro-batch's mean.)
    "colossalai-a2a-full-logits-shift": (COLOSSALAI_HYBRID, _colossalai_a2a_full_logits_shift),
    "colossalai-empty-vocab-shard": (COLOSSALAI_HYBRID, _colossalai_empty_vocab_shard),
    "colossalai-dist-ce-batch-mean": (COLOSSALAI_HYBRID, _colossalai_dist_ce_batch_mean),
    "colossalai-gpt2-lm-head-gather": (COLOSSALAI_HYBRID, _colossalai_gpt2_lm_head_gather),
    "colossalai-qwen2-lm-head-gather": (("colossalai-hybrid",), _colossalai_qwen2_lm_head_gather),
    "colossalai-qwen2-tied-padded-logits": (("colossalai-hybrid",), _colossalai_qwen2_tied_padded_logits),
    "colossalai-opt-untied-lm-head-bound": (("colossalai-hybrid",), _colossalai_opt_untied_lm_head_bound),
    "colossalai-opt-interleaved-stage-indices": (("colossalai-hybrid",), _colossalai_opt_interleaved_stage_indices),
    "colossalai-falcon-interleaved-stage-indices": (("colossalai-hybrid",), _colossalai_falcon_interleaved_stage_indices),
    "colossalai-mistral-pipeline-checkpoint-kwargs": (("colossalai-hybrid",),
                                                      _colossalai_mistral_pipeline_checkpoint_kwargs),
    "colossalai-gpt2-pipeline-loss-unbound": (COLOSSALAI_HYBRID, _colossalai_gpt2_pipeline_loss_unbound),
    "colossalai-moe-dp-grad-scaler": (("colossalai-moe",), _colossalai_moe_dp_grad_scaler),
    "colossalai-mixtral-tied-padded-logits": (("colossalai-moe",), _colossalai_mixtral_tied_padded_logits),
    "colossalai-moe-amp-clip-groups": (("colossalai-moe",), _colossalai_moe_amp_clip_groups),
    "colossalai-moe-unsharded-model-save": (("colossalai-moe",), _colossalai_moe_unsharded_model_save),
    "colossalai-moe-unsharded-optimizer-ep-group": (("colossalai-moe",), _colossalai_moe_unsharded_optimizer_ep_group),
    "colossalai-moe-zero-clip-norm": (("colossalai-moe",), _colossalai_moe_zero_clip_norm),
    "colossalai-moe-dp-sync-unrouted-experts": (("colossalai-moe",), _colossalai_moe_dp_sync_unrouted_experts),
    "colossalai-moe-pipeline-dp-sync-expert-group": (("colossalai-moe",), _colossalai_moe_pipeline_dp_sync_expert_group),
    "colossalai-moe-clip-norm-over-ep": (("colossalai-moe",), _colossalai_moe_clip_norm_over_ep),
    "colossalai-mixtral-pipeline-loss-batch-mean": (("colossalai-moe",), _colossalai_mixtral_pipeline_loss_batch_mean),
    "colossalai-falcon-loss-batch-mean": (("colossalai-hybrid",), _colossalai_falcon_loss_batch_mean),
    "colossalai-falcon-empty-vocab-shard": (("colossalai-hybrid",), _colossalai_falcon_empty_vocab_shard),
    "colossalai-command-mask-without-flash-attention": (("colossalai-hybrid",),
                                                        _colossalai_command_mask_without_flash_attention),
    "colossalai-command-sp-norm-grads": (("colossalai-hybrid",), _colossalai_command_sp_norm_grads),
    "colossalai-command-qk-norm": (("colossalai-hybrid",), _colossalai_command_qk_norm),
    "colossalai-clip-norm-customized-tensors": (COLOSSALAI_HYBRID, _colossalai_clip_norm_customized_tensors),
    "colossalai-empty-grad-norm-collective": (COLOSSALAI_HYBRID, _colossalai_empty_grad_norm_collective),
    "colossalai-zero2-sp-accumulated-sync": (COLOSSALAI_HYBRID, _colossalai_zero2_sp_accumulated_sync),
    "colossalai-overlap-allgather-nd": (("colossalai-zero", *COLOSSALAI_HYBRID), _colossalai_overlap_allgather_nd),
    "colossalai-pp-sp-causal-mask": (COLOSSALAI_HYBRID, _colossalai_pp_sp_causal_mask),
    "colossalai-coloparam-inplace-ce-grad": (COLOSSALAI_HYBRID, _colossalai_coloparam_inplace_ce_grad),
    "colossalai-padded-detached-param-save": (COLOSSALAI_HYBRID, _colossalai_padded_detached_param_save),
    "colossalai-fused-qkv-optimizer-state": (COLOSSALAI_HYBRID, _colossalai_fused_qkv_optimizer_state),
    "colossalai-padded-vocab-optimizer-save": (COLOSSALAI_HYBRID, _colossalai_padded_vocab_optimizer_save),
    "colossalai-gpt2-empty-stage-dtype": (COLOSSALAI_HYBRID, _colossalai_gpt2_empty_stage_dtype),
    "colossalai-empty-stage-checkpoint-load": (COLOSSALAI_HYBRID, _colossalai_empty_stage_checkpoint_load),
    # (after the fix above, which rewrites the method this one wraps)
    "colossalai-tied-head-sharded-load": (COLOSSALAI_HYBRID, _colossalai_tied_head_sharded_load),
    "colossalai-zero-stateless-optimizer-checkpoint": (("colossalai-zero",), _colossalai_zero_stateless_optimizer_checkpoint),
    "deepspeed-unfused-init-step": (("deepspeed-zero",), _deepspeed_unfused_init_step),
    "deepspeed-pipeline-micro-batch-gradients-summed": (("deepspeed-pp",), _deepspeed_pipeline_micro_batch_gradients_summed),
    "deepspeed-pipeline-clip-all-stages": (("deepspeed-pp",), _deepspeed_pipeline_clip_all_stages),
    "deepspeed-zero1-pipeline-group-norm": (("deepspeed-pp",), _deepspeed_zero1_pipeline_group_norm),
    "deepspeed-bf16-pipeline-frozen-tied-weight": (("deepspeed-pp",), _deepspeed_bf16_pipeline_frozen_tied_weight),
    "deepspeed-dualpipev-frozen-first-stage": (("deepspeed-pp",), _deepspeed_dualpipev_frozen_first_stage),
    "deepspeed-bf16-pipeline-checkpoint-load": (("deepspeed-pp",), _deepspeed_bf16_pipeline_checkpoint_load),
    "deepspeed-cpu-checkpointing-input-kept": (("deepspeed-zero", "deepspeed-pp"), _deepspeed_cpu_checkpointing_input_kept),
    "deepspeed-zero3-predivide-world": (("deepspeed-zero",), _deepspeed_zero3_predivide_world),
    "deepspeed-sparse-predivide": (("deepspeed-zero",), _deepspeed_sparse_predivide),
    "deepspeed-sparse-clip": (("deepspeed-zero",), _deepspeed_sparse_clip),
    "deepspeed-round-robin-hp-link": (("deepspeed-zero",), _deepspeed_round_robin_hp_link),
    "deepspeed-zero3-universal-step-per-sub-group": (("deepspeed-zero",), _deepspeed_zero3_universal_step_per_sub_group),
    "deepspeed-zero12-checkpoint-round-robin-order": (("deepspeed-zero",), _deepspeed_zero12_checkpoint_round_robin_order),
    "deepspeed-zero3-universal-autotp-from-bare-tensors": (("deepspeed-zero",),
                                                           _deepspeed_zero3_universal_autotp_from_bare_tensors),
    "deepspeed-zero3-universal-param-group-hyperparameters": (("deepspeed-zero",),
                                                              _deepspeed_zero3_universal_param_group_hyperparameters),
    "deepspeed-ulysses-mesh-gradient-group": (("deepspeed-zero",), _deepspeed_ulysses_mesh_gradient_group),
    "deepspeed-zero3-reduce-scatter-sequence-parallel": (("deepspeed-zero",),
                                                         _deepspeed_zero3_reduce_scatter_sequence_parallel),
    "deepspeed-sequence-parallel-unit-model-parallel-rank": (("deepspeed-zero",),
                                                             _deepspeed_sequence_parallel_unit_model_parallel_rank),
    "deepspeed-zero1-moe-noncontiguous-expert-group": (("deepspeed-zero",), _deepspeed_zero1_moe_noncontiguous_expert_group),
    "deepspeed-moe-fp32-clip-norm-average": (("deepspeed-zero",), _deepspeed_moe_fp32_clip_norm_average),
    "deepspeed-predivide-sequence-parallel": (("deepspeed-zero",), _deepspeed_predivide_sequence_parallel),
    "dtensor-found-inf-placements": (("torch-tp", "torch-fsdp2"), _dtensor_found_inf_placements),
    "torch-sequence-parallel-requires-grad": (("torch-tp", "torch-fsdp2", "torch-pp"),
                                              _torch_sequence_parallel_requires_grad),
    "torch-ddp-static-graph-no-sync": (("torch-ddp",), _torch_ddp_static_graph_no_sync),
    "torch-pipelining-ddp-metadata-inference": (("torch-pp",), _torch_pipelining_ddp_metadata_inference),
    "torch-pipelining-fsdp-split-backward-unshard": (("torch-pp",), _torch_pipelining_fsdp_split_backward_unshard),
    "torch-pipelining-ddp-split-backward-reduce": (("torch-pp",), _torch_pipelining_ddp_split_backward_reduce),
    "torch-pipelining-split-backward-frozen-input": (("torch-pp",), _torch_pipelining_split_backward_frozen_input),
    "torch-pipelining-fsdp-weight-backward-unshard": (("torch-pp",), _torch_pipelining_fsdp_weight_backward_unshard),
    "torch-fsdp2-reentrant-reused-module": (("torch-fsdp2",), _torch_fsdp2_reentrant_reused_module),
    "torch-fsdp1-summon-grads-zeros-dtype": (("torch-fsdp1",), _torch_fsdp1_summon_grads_zeros_dtype),
    "torch-fsdp1-clip-grad-norm-float64": (("torch-fsdp1",), _torch_fsdp1_clip_grad_norm_float64),
    "torch-fsdp1-frozen-recomputed-unit-views": (("torch-fsdp1",), _torch_fsdp1_frozen_recomputed_unit_views),
    "torch-fsdp1-mixed-precision-reentrant-hook": (("torch-fsdp1",), _torch_fsdp1_mixed_precision_reentrant_hook),
    "torch-dcp-load-unheld-sharded-tensor": (("torch-fsdp1",), _torch_dcp_load_unheld_sharded_tensor),
    "torch-dcp-inert-optim-state-init": (("torch-tp", "torch-fsdp2", "torch-fsdp1", "torch-pp"),
                                         _torch_dcp_inert_optim_state_init),
    "torch-fsdp1-cpu-flat-param-freed-by-offload": (("torch-fsdp1",), _torch_fsdp1_cpu_flat_param_freed_by_offload),
    "torch-fsdp1-full-optim-state-cpu-alias": (("torch-fsdp1",), _torch_fsdp1_full_optim_state_cpu_alias),
    "torch-dsd-full-optim-state-without-tensors": (("torch-tp", "torch-fsdp2", "torch-fsdp1"), _torch_dsd_full_optim_state_without_tensors),
    "torch-dsd-broadcast-from-rank0-set-state-dict": (("torch-tp", "torch-fsdp2", "torch-fsdp1"), _torch_dsd_broadcast_from_rank0_set_state_dict),
    "torch-compile-async-collective-input-grad": (("torch-tp", "torch-fsdp2", "torch-pp"),
                                                  _torch_compile_async_collective_input_grad),
    "torch-ddp-compile-first-bucket-cap": (("torch-ddp",), _torch_ddp_compile_first_bucket_cap),
    "torch-dtensor-inf-norm-empty-shard": (("torch-tp", "torch-fsdp2", "torch-pp"), _torch_dtensor_inf_norm_empty_shard),
    "torch-fsdp1-sharded-scaler-scalar-found-inf": (("torch-fsdp1",), _torch_fsdp1_sharded_scaler_scalar_found_inf),
    "torch-fsdp2-int-reshard-submesh": (("torch-fsdp2",), _torch_fsdp2_int_reshard_submesh),
    "torch-fsdp2-world-size-one-divides-twice": (("torch-fsdp2",), _torch_fsdp2_world_size_one_divides_twice),
    "torch-ddp-tp-local-parameters": (("torch-pp",), _torch_ddp_tp_local_parameters),
    "deepspeed-zero3-reused-param-copy": (("deepspeed-zero",), _deepspeed_zero3_reused_param_copy),
    "deepspeed-moe-top1-no-rts-topk-ties": (("deepspeed-zero",), _deepspeed_moe_top1_no_rts_topk_ties),
    "deepspeed-zero2-accumulation-last-micro-batch": (("deepspeed-zero",), _deepspeed_zero2_accumulation_last_micro_batch),
    "deepspeed-cpu-bucket-type-strings": (("deepspeed-zero",), _deepspeed_cpu_bucket_type_strings),
    "deepspeed-offload-accumulation-middle-micro-batches": (("deepspeed-zero",),
                                                            _deepspeed_offload_accumulation_middle_micro_batches),
    "deepspeed-zero3-hpz-secondary-after-load": (("deepspeed-zero",), _deepspeed_zero3_hpz_secondary_after_load),
    "deepspeed-autotp-hpz-data-parallel-groups": (("deepspeed-zero",), _deepspeed_autotp_hpz_data_parallel_groups),
    "deepspeed-async-column-parallel-noncontiguous-grad": (("deepspeed-zero",),
                                                           _deepspeed_async_column_parallel_noncontiguous_grad),
    "deepspeed-autoep-folding-norm-every-tp-lane": (("deepspeed-zero",), _deepspeed_autoep_folding_norm_every_tp_lane),
    "torch-rms-norm-half-overflow": (("torch-tp", "torch-fsdp2", "torch-fsdp1", "torch-ddp", "colossalai-tp",
                                      "colossalai-zero"),
                                     _torch_rms_norm_half_overflow),
    "megatron-vocab-parallel-label-smoothing": (("megatron-tp",), _megatron_vocab_parallel_label_smoothing),
    "megatron-label-smoothing-log-underflow": (("megatron-tp",), _megatron_label_smoothing_log_underflow),
    "megatron-gathered-logits-language-model-loss": (("megatron-tp",), _megatron_gathered_logits_language_model_loss),
    "megatron-partial-distopt-grad-sync-twice": (("megatron-tp",), _megatron_partial_distopt_grad_sync_twice),
    "megatron-moe-expert-bias-sequence-parallel": (("megatron-tp",), _megatron_moe_expert_bias_sequence_parallel),
    "megatron-moe-expert-bias-inplace-view": (("megatron-tp",), _megatron_moe_expert_bias_inplace_view),
    "megatron-moe-aux-loss-per-token-counted": (("megatron-tp",), _megatron_moe_aux_loss_per_token_counted),
    "megatron-moe-position-drop-topk-ties": (("megatron-tp",), _megatron_moe_position_drop_topk_ties),
    "megatron-moe-router-gemm-without-te": (("megatron-tp",), _megatron_moe_router_gemm_without_te),
    "megatron-tp-attributes-without-initialization": (("megatron-tp",), _megatron_tp_attributes_without_initialization),
    "megatron-distopt-legacy-checkpoint-state-copy": (("megatron-ddp", "megatron-tp"), _megatron_distopt_legacy_checkpoint_state_copy),
    "megatron-distopt-checkpoint-before-first-step": (("megatron-ddp", "megatron-tp"), _megatron_distopt_checkpoint_before_first_step),
    "megatron-distopt-shared-step-after-load": (("megatron-ddp", "megatron-tp"), _megatron_distopt_shared_step_after_load),
    "megatron-distopt-empty-optimizer-state-dict": (("megatron-ddp", "megatron-tp"), _megatron_distopt_empty_optimizer_state_dict),
    "megatron-torch-dist-checkpoint-before-first-step": (("megatron-ddp", "megatron-tp"), _megatron_torch_dist_checkpoint_before_first_step),
    "megatron-sgd-torch-dist-load-init-state": (("megatron-ddp", "megatron-tp"), _megatron_sgd_torch_dist_load_init_state),
    "megatron-distopt-dp-reshardable-bucket-padding": (("megatron-ddp", "megatron-tp"), _megatron_distopt_dp_reshardable_bucket_padding),
    "megatron-distopt-dp-reshardable-step-overwritten": (("megatron-ddp", "megatron-tp"), _megatron_distopt_dp_reshardable_step_overwritten),
    "megatron-distopt-fully-reshardable-bucket-padding": (("megatron-ddp", "megatron-tp"), _megatron_distopt_fully_reshardable_bucket_padding),
    "megatron-chained-optimizer-rank0-common-step": (("megatron-tp",), _megatron_chained_optimizer_rank0_common_step),
    "megatron-moe-pad-to-capacity-above-tokens": (("megatron-tp",), _megatron_moe_pad_to_capacity_above_tokens),
}


#: The fixes this process has applied: each patches once (a patch that wraps would otherwise wrap twice when a
#: target's start-up reaches apply() through two paths).
_APPLIED = set()


def requested():
    return [n for n in os.environ.get(ENV, "").split(",") if n]


def concerning(target):
    """The requested fixes that concern `target`, in the table's order."""
    wanted = requested()
    return [name for name, (targets, _) in FIXES.items() if name in wanted and target in targets]


def apply(target):
    """Applies the requested fixes that concern `target`, in the table's order whatever the request's (an
    unknown name is our error, raised)."""
    unknown = [n for n in requested() if n not in FIXES]
    if unknown:
        raise KeyError(f"{ENV}: unknown fix {unknown[0]!r} (known: {', '.join(sorted(FIXES))})")
    for name in concerning(target):
        if name not in _APPLIED:
            FIXES[name][1]()
            _APPLIED.add(name)
