"""The framework mutants of `scripts/bench/mutants/run.py`: realistic one-edit bugs in code that runs only on the
sharded path (never in the single-device reference), of the kinds real sharding bugs take.

Fixed on 2026-11-26, before the first measurement, from a reading of the installed sources (torch 2.15.0,
megatron-core and deepspeed of `requirements/main.txt`); none was chosen by whether shardfuzz would see it.
MUTANTS: name -> (target, module, exact old text (must occur once), new text, what the edit breaks).
"""

MUTANTS = {
    'dt-mm-contract-replicate': (
        'torch-dtensor',
        'torch.distributed.tensor._ops._matrix_ops',
        '        placement_list = [Partial()]\n        for input_dim in input_dims:\n            input_contracting_dim',
        '        placement_list = [Replicate()]\n        for input_dim in input_dims:\n            input_contracting_dim',
        'einsum/mm strategy with the contracting dim sharded: output Replicate instead of Partial (a missing reduction)',
    ),
    'dt-transpose-shard-dim': (
        'torch-dtensor',
        'torch.distributed.tensor._ops._matrix_ops',
        'strategies.append([_ShardingPlaceholder(1), _ShardingPlaceholder(0)])',
        'strategies.append([_ShardingPlaceholder(0), _ShardingPlaceholder(0)])',
        'aten.t strategy: output Shard(0) for input Shard(0) (Shard on the wrong dim)',
    ),
    'dt-sum-reduce-op-max': (
        'torch-dtensor',
        'torch.distributed.tensor._ops._math_ops',
        '    aten.sum.dim_IntList: "sum",',
        '    aten.sum.dim_IntList: "max",',
        'sum over a sharded dim leaves Partial(max) instead of Partial(sum) (wrong reduce op)',
    ),
    'dt-partition-nodiv': (
        'torch-dtensor',
        'torch.distributed.tensor.placement_types',
        '        if self.reduce_op == "sum":\n            return tensor / num_chunks',
        '        if self.reduce_op == "sum":\n            return tensor',
        'Replicate -> Partial(sum) keeps the whole value on every rank instead of value / n (a doubled reduction)',
    ),
    'dt-embed-mask-offbyone': (
        'torch-dtensor',
        'torch.distributed.tensor.placement_types',
        'tensor >= local_offset_on_dim + local_shard_size',
        'tensor > local_offset_on_dim + local_shard_size',
        '_MaskPartial masks ids >= offset + size as `>`: the first id of the next vocab shard counts twice (off-by-one at a shard boundary)',
    ),
    'dt-view-flatten-strided': (
        'torch-dtensor',
        'torch.distributed.tensor._ops._view_ops',
        '        if p.dim == input_start_idx:\n            output_placement: Placement = Shard(tgt_shard_dim)',
        '        if p.dim >= input_start_idx:\n            output_placement: Placement = Shard(tgt_shard_dim)',
        'flatten of a tensor sharded on a non-leading dim gives plain Shard instead of _StridedShard (wrong output placement)',
    ),
    'tp-rowwise-no-reduce': (
        'torch-tp',
        'torch.distributed.tensor.parallel.style',
        '        # 2. to shard -> reduce_scatter\n        if outputs.placements != output_layouts:\n            outputs = outputs.redistribute(placements=output_layouts, async_op=True)',
        '        # 2. to shard -> reduce_scatter\n        if outputs.placements != output_layouts:\n            outputs = DTensor.from_local(outputs.to_local(), device_mesh, output_layouts, run_check=False)',
        'RowwiseParallel relabels its Partial output without reducing it (a missing all-reduce / reduce-scatter)',
    ),
    'tp-loss-sumexp-max': (
        'torch-tp',
        'torch.distributed.tensor.parallel.loss',
        'shifted_sumexp, reduceOp=c10d.ReduceOp.SUM.name, group=(mesh, mesh_dim)',
        'shifted_sumexp, reduceOp=c10d.ReduceOp.MAX.name, group=(mesh, mesh_dim)',
        'loss_parallel all-reduces the shifted sum of exponentials with MAX instead of SUM (wrong reduce op)',
    ),
    'mg-ce-target-mask-offbyone': (
        'megatron-tp',
        'megatron.core.tensor_parallel.cross_entropy',
        'target_mask = (target < vocab_start_index) | (target >= vocab_end_index)',
        'target_mask = (target <= vocab_start_index) | (target >= vocab_end_index)',
        "vocab-parallel cross-entropy masks the target equal to the shard's first id (off-by-one at a shard boundary)",
    ),
    'mg-colpar-dgrad-reduce-max': (
        'megatron-tp',
        'megatron.core.tensor_parallel.layers',
        'handle = torch.distributed.all_reduce(grad_input, group=tp_group, async_op=True)',
        'handle = torch.distributed.all_reduce(grad_input, op=torch.distributed.ReduceOp.MAX, group=tp_group, async_op=True)',
        "ColumnParallelLinear's input-gradient all-reduce uses MAX (wrong reduce op)",
    ),
    'ds-z12-gradnorm-max': (
        'deepspeed-zero',
        'deepspeed.runtime.zero.stage_1_and_2',
        'dist.all_reduce(total_norm, op=dist.ReduceOp.SUM, group=self.dp_process_group)',
        'dist.all_reduce(total_norm, op=dist.ReduceOp.MAX, group=self.dp_process_group)',
        'ZeRO-1/2 global gradient norm all-reduced with MAX instead of SUM (clipping on the wrong norm)',
    ),
    'ds-z3-partition-tail-offbyone': (
        'deepspeed-zero',
        'deepspeed.runtime.zero.partition_parameters',
        '                    elems_to_copy = param.ds_numel - start\n',
        '                    elems_to_copy = param.ds_numel - start - 1\n',
        "ZeRO-3's last (short) partition copies one element too few (off-by-one in an uneven partition)",
    ),
    # The four mg-ddp-* mutants below were fixed on 2026-11-30, before any measurement, by a helper that did
    # not read the fuzzer's megatron-ddp harness (only megatron-core's installed sources and this table).
    'mg-ddp-grad-scale-skipped': (
        'megatron-ddp',
        'megatron.core.distributed.param_and_grad_buffer',
        '                if bucket.gradient_scaling_factor != 1.0:\n                    bucket.grad_data *= bucket.gradient_scaling_factor',
        '                if bucket.gradient_scaling_factor > 1.0:\n                    bucket.grad_data *= bucket.gradient_scaling_factor',
        'the 1/dp pre-scaling of each grad bucket before its all-reduce / reduce-scatter is guarded as if the factor were dp (> 1), so it never runs: grads are summed, not averaged, over DP ranks',
    ),
    'mg-ddp-gradnorm-over-dp-replicas': (
        'megatron-ddp',
        'megatron.core.optimizer',
        "            optimizer = Float16OptimizerWithFloat16Params(*optimizer_args)\n            setattr(optimizer, 'grad_stats_parallel_group', model_parallel_group)",
        "            optimizer = Float16OptimizerWithFloat16Params(*optimizer_args)\n            setattr(optimizer, 'grad_stats_parallel_group', intra_dist_opt_group)",
        'the non-distributed fp16/bf16 optimizer sums its squared grad norm over the data-parallel ranks (the distributed-optimizer group), counting the replicated full gradients dp times (norm x sqrt(dp), clipping too strong)',
    ),
    'mg-ddp-distopt-shard-end-offbyone': (
        'megatron-ddp',
        'megatron.core.optimizer.distrib_optimizer',
        'gbuf_world_end = min(gbuf_size, gbuf_world_start + max_gbuf_range_size)',
        'gbuf_world_end = min(gbuf_size, gbuf_world_start + max_gbuf_range_size - 1)',
        "distributed optimizer's per-rank shard range ends one element early (inclusive end): the last element of every rank's shard is owned by no rank, never updated and left out of the grad norm",
    ),
    'mg-ddp-distopt-param-copy-local-range': (
        'megatron-ddp',
        'megatron.core.optimizer.distrib_optimizer',
        '                    world_range = param_range_map["gbuf_world_in_bucket"]\n\n                    assert world_range.size',
        '                    world_range = param_range_map["gbuf_local"]\n\n                    assert world_range.size',
        "distributed optimizer copies updated fp32 main-param shards into the bucket's param buffer at the shard-local offset instead of the in-bucket offset: ranks > 0 write over rank 0's slot and all-gather their own stale bf16/fp16 shard (main -> model param copy of the wrong range)",
    ),
    # The three mg-f16-* mutants below were fixed blind on 2026-11-30 from megatron-core 0.19.2's fp16 loss-scaler path.
    'mg-f16-hysteresis-offbyone': (
        'megatron-ddp',
        'megatron.core.optimizer.grad_scaler',
        '            if self._hysteresis_tracker <= 0:',
        '            if self._hysteresis_tracker < 0:',
        "DynamicGradScaler backs off only once the hysteresis tracker goes negative: one overflow more than `hysteresis` is needed before the loss scale is cut (with hysteresis=1 the first overflow skips the step but keeps the scale)",
    ),
    'mg-f16-found-inf-mp-group': (
        'megatron-ddp',
        'megatron.core.optimizer.optimizer',
        '            self.found_inf,\n            op=torch.distributed.ReduceOp.MAX,\n            group=self.get_grad_stats_parallel_group(),',
        '            self.found_inf,\n            op=torch.distributed.ReduceOp.MAX,\n            group=parallel_state.get_model_parallel_group(),',
        "the found-inf flag is all-reduced over the model-parallel group instead of the optimizer's grad-stats group: with the distributed optimizer an overflow in one data-parallel rank's grad shard is not seen by the others, so ranks disagree on skipping the step and on the loss scale",
    ),
    'mg-f16-loss-scaled-every-stage': (
        'megatron-ddp',
        'megatron.core.pipeline_parallel.schedules',
        '    if output_tensor_grad[0] is None and config.grad_scale_func is not None:\n        output_tensor[0] = config.grad_scale_func(output_tensor[0])',
        '    if config.grad_scale_func is not None:\n        output_tensor[0] = config.grad_scale_func(output_tensor[0])',
        "backward_step applies the loss scale on every pipeline stage, not only to the loss on the last stage: the already-scaled incoming grad is scaled again, so stage k from the end gets grads scaled by S**(k+1) (a loss scaled twice)",
    ),
}
