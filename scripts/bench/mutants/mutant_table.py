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
    # The six ca-* mutants below were fixed blind on 2026-12-02, before any measurement, by a helper that read only
    # Colossal-AI 0.5.0's installed sources and the CPU notes (not the fuzzer's colossalai harnesses); each was shown
    # live by a small torchrun program of its own (2 ranks, gloo) against a single-device reference.

    # Liveness: program t_tp.py (VocabParallelLMHead1D, make_vocab_size_divisible_by=1, + cross_entropy_1d, tp=2, fp32)
    # vs torch F.cross_entropy on the full head: unmutated loss diff 0, dW 3e-8, dh 4e-9; mutated loss diff 0 but
    # dW max diff 2.6e-1 / 6.5e-1 (rank0/rank1), dh 3.9e-2. Reached by every cross_entropy_1d backward with tp>1
    # (layer level, and dist_cross_entropy in models when tp>1 and parallel_output=True).
    'ca-ce1d-grad-target-unmasked': (
        'colossalai-tp',
        'colossalai.shardformer.layer.loss',
        '        grad_logits_2d[torch.arange(0, grad_logits_2d.shape[0]), masked_target_1d] -= update\n',
        '        grad_logits_2d[torch.arange(0, grad_logits_2d.shape[0]), masked_target_1d] -= 1.0\n',
        "cross_entropy_1d backward subtracts the one-hot target on every vocab shard, not only on the shard that owns the label: a rank whose shard lacks a token's label takes 1 off the grad of its local column 0 (shard mask missing in backward; the loss value is unchanged)",
    ),
    # Liveness: program t_tp.py (Linear1D_Col 6->8, gather_output=True, tp=2, input requires grad) vs nn.Linear:
    # unmutated input-grad diff 1.2e-7; mutated 1.33 / 0.92 (rank0/rank1); the VocabParallelLMHead1D input grad (it
    # inherits Linear1D_Col.forward) also goes wrong (dh 3.9e-2 / 4.8e-2). Reached by Linear1D_Col / VocabParallelLMHead1D
    # without sequence parallelism or with all_to_all (split_gather / ring take linear_gather_forward_reducescatter_backward).
    'ca-col-dgrad-no-allreduce': (
        'colossalai-tp',
        'colossalai.shardformer.layer.linear',
        '            output_parallel = linear_with_async_comm(\n                input_parallel,\n                self.weight,\n                bias,\n                self.process_group,\n                True,\n',
        '            output_parallel = linear_with_async_comm(\n                input_parallel,\n                self.weight,\n                bias,\n                self.process_group,\n                False,\n',
        "Linear1D_Col (and VocabParallelLMHead1D) passes async_grad_allreduce=False, which in LinearWithAsyncCommunication means no all-reduce at all (unlike MatmulWithAsyncCommunication, where False means a synchronous one): the input gradient stays each rank's partial sum over its own output-column shard (a missing all-reduce of the input grad)",
    ),
    # Liveness: program t_zero.py (LowLevelZeroPlugin fp32, dp=2, SGD, max_norm=0.1, 2 steps; stage 1, stage 2,
    # stage 1 + cpu_offload) vs torch clip_grad_norm_ + SGD on the full batch: unmutated param diff 1.5e-8 and equal
    # grad norm everywhere; mutated get_grad_norm() 0.814 / 0.707 on rank0 / rank1 vs 0.955..1.086 reference, params off
    # by 9.3e-3..9.6e-3, in all three configurations. Reached whenever max_norm > 0 (the norm is also what
    # get_grad_norm() reports) with a single dp group (extra_dp_size=1; HybridParallelZeroOptimizer overrides this method).
    'ca-zero-gradnorm-local-shard': (
        'colossalai-zero',
        'colossalai.zero.low_level.low_level_optim',
        '            else:\n                torch.distributed.all_reduce(\n                    total_norm_exponentiated_cuda,\n                    op=torch.distributed.ReduceOp.SUM,\n                    group=dp_pg,\n                )\n            total_norm = total_norm_exponentiated_cuda.item() ** (1.0 / norm_type)',
        '            total_norm = total_norm_exponentiated_cuda.item() ** (1.0 / norm_type)',
        "LowLevelZeroOptimizer's L2 grad norm is all-reduced over the dp group only in the nd (tuple-group) branch: with a single dp group each rank clips its grad shard by the norm of its own shard (clipping on a local shard instead of the global norm)",
    ),
    # Liveness: program t_zero.py: with a model whose params all have odd numel (Linear(5,7)+Linear(7,3), dp=2) the
    # params differ from the reference by 5.8e-2 (and grad norm 0.987 vs 0.955) in stage 1, stage 2 and stage 1 +
    # cpu_offload; with all-even numels (Linear(6,8)+Linear(8,4)) it is equivalent (diff 1.5e-8). So it is live only
    # when some param's numel is not a multiple of the dp size (any precision, stage 1 or 2, either bucket path).
    'ca-zero-grad-pad-wrong-side': (
        'colossalai-zero',
        'colossalai.zero.low_level.bookkeeping.bucket_store',
        '                    grad = torch.nn.functional.pad(grad.view(-1), [0, padding_size])',
        '                    grad = torch.nn.functional.pad(grad.view(-1), [padding_size, 0])',
        "the grad bucket pads a gradient whose numel is not a multiple of the dp size at the front while the flat master-param shards are padded at the end: every grad shard is misaligned by the pad size against its param shard (off-by-one in an uneven partition)",
    ),
    # Liveness: program t_hybrid.py (HybridParallelPlugin tp=1 pp=2 1f1b, num_microbatches=2, fp32, tiny Llama from a
    # LlamaConfig, SGD, max_norm=0.05, 2 steps) vs single-device reference: unmutated loss and grad norm equal to 6
    # digits; mutated loss 8.2999 vs 4.1500 and grad norm 2.383 vs 1.192 (x num_microbatches). Reached on every 1F1B
    # training step (num_microbatches >= pp_size >= 2, so never the trivial /1).
    'ca-pp-loss-not-averaged-microbatches': (
        'colossalai-hybrid',
        'colossalai.pipeline.schedule.one_f_one_b',
        '            loss = criterion(output_obj, micro_batch) / self.num_microbatches\n',
        '            loss = criterion(output_obj, micro_batch)\n',
        "the 1F1B last stage no longer divides each micro-batch loss by the number of micro-batches: the returned loss and every grad are summed, not averaged, over micro-batches (loss scaled by num_microbatches)",
    ),
    # Liveness: program t_hybrid.py (same configuration): unmutated grad norm 1.191635 on both stages = reference;
    # mutated 0.9159 (stage 0) / 0.7623 (stage 1), and the step-2 loss 4.0684 vs 4.0914. Reached by
    # HybridParallelNaiveOptimizer (precision fp32, zero_stage 0) with pp_size > 1 and max_norm > 0.
    'ca-hp-gradnorm-pp-uses-tp-group': (
        'colossalai-hybrid',
        'colossalai.booster.plugin.hybrid_parallel_plugin',
        '                dist.all_reduce(tensor=total_norm_exponentiated_cuda, op=dist.ReduceOp.SUM, group=self.pp_pg)\n\n            # compute the total_norm\n            total_norm = total_norm_exponentiated_cuda.item() ** (1.0 / norm_type)\n\n        return total_norm\n\n    def _clip_grad_norm(',
        '                dist.all_reduce(tensor=total_norm_exponentiated_cuda, op=dist.ReduceOp.SUM, group=self.tp_pg)\n\n            # compute the total_norm\n            total_norm = total_norm_exponentiated_cuda.item() ** (1.0 / norm_type)\n\n        return total_norm\n\n    def _clip_grad_norm(',
        "HybridParallelNaiveOptimizer (fp32, zero_stage=0) sums the squared grad norm over the tp group a second time instead of over the pp group: each pipeline stage clips by its own stage's norm (with tp>1 that norm is also counted tp times) (wrong process group)",
    ),
    # The six jx-* mutants below were fixed blind on 2026-12-02, before any measurement, by a helper that read only
    # jax 0.12.0.1's installed sources (not the fuzzer's JAX harnesses); each was shown live by a small program of its
    # own (a sharded computation against the unsharded one, mutated and not).

    # live_psum_scatter.py: psum_scatter forward differs from the unsharded sum (max|diff|=4.1), and so does
    # jax.grad through all_gather, whose transpose is psum_scatter (max|diff|=7.3); unmutated agrees (0).
    'jx-psum-scatter-max': (
        'jax-shardmap',
        'jax._src.lax.parallel',
        'mlir.register_lowering(reduce_scatter_p,\n                       partial(_reduce_scatter_lowering, lax.add_p))',
        'mlir.register_lowering(reduce_scatter_p,\n                       partial(_reduce_scatter_lowering, lax.max_p))',
        'reduce_scatter_p (psum_scatter, and the transpose of all_gather) lowers with a max reducer instead of add (wrong reduce op)',
    ),
    # live_ppermute_grad.py: the forward ppermute still agrees (0); jax.grad through a ring-shift ppermute differs
    # from the unsharded gradient (max|diff|=2.69); unmutated agrees (0).
    'jx-ppermute-transpose-fwd-perm': (
        'jax-shardmap',
        'jax._src.lax.parallel',
        '  inverse_perm = list(zip(dsts, srcs))',
        '  inverse_perm = list(zip(srcs, dsts))',
        'ppermute transpose sends cotangents along the forward permutation rather than its inverse (wrong backward rule)',
    ),
    # live_axis_index.py: axis_index on a 4x2 mesh gives wrong indices (max|diff|=3.0 vs the unsharded formula),
    # the 1-D mesh case still agrees; unmutated agrees on both (0).
    'jx-axis-index-stride': (
        'jax-shardmap',
        'jax._src.lax.parallel',
        'nreplicas * math.prod(axis_sizes[axis_pos + 1 :])',
        'nreplicas * math.prod(axis_sizes[:axis_pos])',
        "axis_index's device-id stride is taken from the leading mesh axes, not the trailing ones (wrong axis index on multi-axis meshes)",
    ),
    # live_indices_iota.py: on a 4x2 mesh, device_put(X, P('j','i')) / P('j',None) reads back different from X
    # (max|diff|=2.6-2.8), and jit with those in_shardings differs from the unsharded result (max|diff|=1.9-2.0);
    # P('i','j') (iota tile order) still agrees; unmutated agrees everywhere (<=2.2e-16).
    'jx-indices-iota-devices': (
        'jax-gspmd',
        'jax._src.op_shardings',
        '  device_it = iter(hlo_sharding.tile_assignment_devices())',
        '  device_it = iter(range(num_devices))',
        "op_sharding_to_numpy_indices ignores the tile-assignment device permutation, so host data goes to the wrong devices when a spec's order differs from the mesh order (wrong shard placement)",
    ),
    # live_out_sharding.py: jit(lambda x: x.T) on an array sharded P('x') records P('x') (should be P(None,'x'));
    # np.asarray of it still agrees, but a second jit on it differs (max|diff|=1.99) and so does an eager op
    # (max|diff|=6.3); unmutated records P(None,'x') and agrees (<=3.3e-16).
    'jx-out-sharding-from-input': (
        'jax-gspmd',
        'jax._src.interpreters.pxla',
        '          and out_aval.sharding.mesh == orig_in_s.mesh.abstract_mesh\n          and o.is_equivalent_to(orig_in_s, orig_aval.ndim)):',
        '          and out_aval.sharding.mesh == orig_in_s.mesh.abstract_mesh):',
        "jit without out_shardings records the first input's sharding for every same-rank output, without checking XLA's output sharding (wrong output sharding recorded)",
    ),
    # live_replica_concat.py: device_put of a single-device jax.Array to P('i') or P(None,'i') on a 4x2 mesh reads
    # back different from X (max|diff|=2.3-2.8), and jit with those in_shardings on a jnp argument differs from
    # the unsharded result (max|diff|=1.96-1.98); P('i','j') still agrees; unmutated agrees (<=2.2e-16).
    'jx-dput-replica-concat': (
        'jax-gspmd',
        'jax._src.array',
        '    shards = merge_lists(is_duplicate, unique_shards, duplicate_shards)',
        '    shards = [*unique_shards, *duplicate_shards]',
        'shard_device_array appends the replica (duplicate) shards after the unique ones instead of merging them back into device order (wrong placement under partial replication)',
    ),
    # torch FSDP2 / DDP / DTensor / tensor-parallel mutants, fixed blind on 2026-12-02 (fifth session)
    # (read only torch 2.15.0's installed sources and the CPU notes; each was shown live by a small program of its own
    # under /tmp/torchmut (mp.spawn, gloo, 127.0.0.1) against the same computation on one process in float64/float32)

    # Liveness: fsdp_t.py (fully_shard, Linear(5,7)-ReLU-Linear(7,3), dp=2, fp32, SGD lr 0.1, 3 steps, batch split
    # over ranks) vs one process on the full batch: unmutated param diff 2.8e-8 in every mode; mutated, fully_shard
    # on the root only (defaults) or reshard_after_forward=False: param diff 9.4e-3, final forward diff 0.144.
    # Per-Linear fully_shard with a param-less root and reshard_after_forward=True: unaffected (2.8e-8). Reached
    # whenever a group is not resharded after forward (the root by default) and there is more than one step.
    'fsdp2-no-reshard-after-backward': (
        'torch-fsdp2',
        'torch.distributed.fsdp._fully_shard._fsdp_param_group',
        '        if self._training_state == TrainingState.FORWARD:\n            if not self._reshard_after_forward:\n                return',
        '        if self._training_state != TrainingState.IDLE:\n            if not self._reshard_after_forward:\n                return',
        "FSDPParamGroup.reshard() applies reshard_after_forward=False's early return in every non-idle state, not only in forward: a group kept unsharded after forward (the root by default, or reshard_after_forward=False) is not resharded after backward either, so after optimizer.step() the next forward's unshard() is a no-op and computes with the stale all-gathered parameters (a skipped reshard / re-gather)",
    ),
    # Liveness: fsdp_t.py (per-Linear + root fully_shard, Linear(5,7)-ReLU-Linear(7,3): the 7-row weights and 7/3
    # biases shard unevenly): unmutated param diff 2.8e-8 (dp=2 and 4); mutated param diff 6.1e-2 (dp=2, fp32 and
    # bf16 param_dtype), 7.2e-3 (dp=4), 5.4e-3 with clip_grad_norm_ (grad norm 1.017 vs 1.047). With all dims even
    # (Linear(5,8)-Linear(8,4), dp=2) it is equivalent (2.9e-8). Live when a group holds a param whose dim 0 does not
    # divide by the dp size followed by another param (e.g. weight then bias of one Linear).
    'fsdp2-grad-view-unpadded-offset': (
        'torch-fsdp2',
        'torch.distributed.fsdp._fully_shard._fsdp_collectives',
        '            group_offset += padded_unsharded_size.numel() // world_size',
        '            group_offset += fsdp_param.sharded_size.numel()',
        "_cast_and_view_sharded_grads advances through the reduce-scatter output by each parameter's unpadded sharded numel instead of its padded one: on a rank whose shard of an uneven parameter is short (or empty), every later parameter of the group takes its gradient from the wrong offset (uneven-shard padding counted wrongly)",
    ),
    # Liveness: fsdp_t.py, 2 micro-batches per step with gradient sync on every backward (no
    # set_requires_gradient_sync(False)): unmutated param diff 2.8e-8; mutated 4.4e-2 (final forward 0.111). With
    # set_requires_gradient_sync(False) on the first micro-batch (grads accumulate unsharded) and with a single
    # backward per step it is unaffected. Reached whenever a reduce-scatter finds an existing sharded grad.
    'fsdp2-accum-grad-overwritten': (
        'torch-fsdp2',
        'torch.distributed.fsdp._fully_shard._fsdp_collectives',
        '                fsdp_param.sharded_param.grad._local_tensor += new_sharded_grad',
        '                fsdp_param.sharded_param.grad._local_tensor.copy_(new_sharded_grad)',
        "foreach_reduce overwrites an existing sharded gradient with the newly reduced one instead of adding to it: gradient accumulation with sync on every micro-batch keeps only the last micro-batch (accumulation drops micro-batches)",
    ),
    # Liveness: fsdp_t.py with torch.nn.utils.clip_grad_norm_(max_norm=0.05) on the DTensor grads: unmutated norm
    # 1.047285 / 0.851138 / 0.471779 = reference, param diff 3.5e-8; mutated rank-0 norm 0.936 / 0.478 / 0.242,
    # param diff 1.8e-3 (also with accumulation). Without clipping unaffected. Reached by every clip_grad_norm_ /
    # _get_total_norm over sharded DTensor grads (any p-norm but inf), and by vector_norm of a sharded DTensor.
    'fsdp2-clip-norm-local-shard': (
        'torch-fsdp2',
        'torch.distributed.tensor._ops._math_ops',
        '        reduced_tensor = super()._reduce_value(tensor, mesh, mesh_dim)',
        '        reduced_tensor = tensor',
        "_NormPartial (the partial p-norm of a sharded DTensor, which clip_grad_norm_ builds over FSDP2's DTensor gradients) skips the all-reduce of x**p when made Replicate: every rank takes the norm of its own shard as the total norm (clipping on a local norm)",
    ),
    # Liveness: ddp_t.py (DDP, Linear(5,7)-Tanh-Linear(7,3), fp32, SGD, 2 steps) vs one process on the full batch:
    # unmutated diff 1.6e-5 (fp16 hook) / 2.1e-4 (bf16 hook) / 2.5e-8 (no hook); mutated 2.6e-2 with either hook and
    # any of gradient_as_bucket_view, static_graph, find_unused_parameters, no_sync accumulation (dp=2), 6.5e-2 (dp=4).
    # Without a hook (C++ reducer) unaffected. Shown with SGD; Adam would largely normalise the factor away.
    'ddp-compress-hook-no-div': (
        'torch-ddp',
        'torch.distributed.algorithms.ddp_comm_hooks.default_hooks',
        '    compressed_tensor = buffer.to(dtype).div_(world_size)',
        '    compressed_tensor = buffer.to(dtype)',
        "fp16_compress_hook / bf16_compress_hook no longer divide the compressed bucket by the world size before the all-reduce: gradients are summed, not averaged, over DDP ranks (missing 1/world divide)",
    ),
    # Liveness: ddp_t.py: unmutated as above; mutated diff 4.8e-2 (max over ranks) with the fp16 or bf16 hook in every
    # configuration (view, static_graph, find_unused_parameters, no_sync), 9.6e-2 at dp=4; ranks end with different
    # parameters. Without a hook unaffected.
    'ddp-compress-hook-no-writeback': (
        'torch-ddp',
        'torch.distributed.algorithms.ddp_comm_hooks.default_hooks',
        '        decompressed_tensor.copy_(value)\n',
        '',
        "_compress_hook's decompress callback returns the bucket buffer without copying the all-reduced compressed tensor into it: every rank steps with its own un-reduced local gradient (a reduction whose result is never written back; replicas drift apart)",
    ),
    # Liveness: dt_t.py (x of shape (5,6,7), float64, 1-D mesh of 2 and 4): unmutated diff 0 everywhere; mutated with
    # x Shard(2): softmax(x,-1) 0.686, log_softmax 1.89, cumsum(-1) 3.9, softmax backward 0.779 (dp=2; 0.996 / 5.49 /
    # 5.16 / 0.92 at 4). softmax(x, 2) (positive dim) and x sharded on another dim are unaffected.
    'dt-softmax-negdim-shard': (
        'torch-dtensor',
        'torch.distributed.tensor._ops._math_ops',
        '    active_dim = normalize_dim(active_dim, ndim)\n',
        '',
        "_shard_except_dim_strategy (softmax, log_softmax and their backward, cumsum/cumprod, sort, topk, cummax...) no longer normalizes a negative dim: with dim=-1 no tensor dim is excluded, so a DTensor sharded on the softmax/scan dim is computed shard-locally instead of being replicated first (strategy lets the reduction dim stay sharded)",
    ),
    # Liveness: dt_t.py (F.layer_norm over the last dim of a (4,6,8) float64 DTensor sharded on dim 0 or 1, weight
    # and bias Replicate parameters): unmutated weight grad Partial, diff 1.4e-14, SGD step 3.6e-15; mutated weight
    # grad Replicate with diff 62 / 58 (dp=2), 87 / 110 (dp=4), the SGD-updated weight differs by 6.2 and across
    # ranks; bias grad and input grad unaffected. Also live under tensor parallelism: tp_t.py with SequenceParallel
    # LayerNorms, norm.weight grad diff 0.126.
    'dt-layernorm-bwd-weight-replicate': (
        'torch-dtensor',
        'torch.distributed.tensor._ops._math_ops',
        '            Partial("sum") if compute_d_weight else None,\n            Partial("sum") if compute_d_bias else None,',
        '            Replicate() if compute_d_weight else None,\n            Partial("sum") if compute_d_bias else None,',
        "native_layer_norm_backward's strategy labels the weight gradient Replicate instead of Partial(sum) when the input is sharded on a batch/sequence dim: each rank keeps only its own rows' contribution (the missing all-reduce of a replicated LayerNorm weight's gradient, as under sequence parallelism)",
    ),
    # Liveness: dt_t.py: (A Shard(1)) @ (B Shard(0)) gives Partial(sum); adding / subtracting a Replicate bias:
    # unmutated diff 4.4e-16 / 8.9e-16; mutated 0.768 (dp=2), 2.3 (dp=4). A Replicate + Replicate add and
    # RowwiseParallel's bias (addmm) are unaffected. Reached by any add/sub/add_ of a Partial(sum) and a Replicate DTensor.
    'dt-add-partial-replicate-sum': (
        'torch-dtensor',
        'torch.distributed.tensor._ops._pointwise_ops',
        '    [Partial("sum"), Partial("sum"), Partial("sum")],\n    [Partial("avg"), Partial("avg"), Partial("avg")],\n',
        '    [Partial("sum"), Partial("sum"), Partial("sum")],\n    [Partial("avg"), Partial("avg"), Partial("avg")],\n    [Partial("sum"), Partial("sum"), Replicate()],\n',
        "add/sub (add.Tensor, add_, sub...) gain a P(sum), P(sum), R rule: a Replicate operand is added to a Partial(sum) one on every rank without being partitioned, so after the reduction it counts n times (the rule the comment beside it excludes)",
    ),
    # Liveness: dt_t.py, distribute_tensor(x, [Shard(a)]).redistribute([Shard(b)]) vs x (float64): unmutated full_tensor
    # diff 0 and local shapes equal to distribute_tensor(x, [Shard(b)]) for (5,7), (8,6), (6,5), (7,9) at dp=2 and 4;
    # mutated dp=2: (5,7) S0->S1 diff 1.0 / S1->S0 1.27, (6,5) S0->S1 0.76, (7,9) 1.42 / 1.41, local shapes wrong;
    # (8,6) (even) unaffected; dp=4: RuntimeError (narrow(): length must be non-negative). Live when the new shard
    # dim does not divide by the mesh size (gloo runs the all-gather + chunk fallback; the unpad is shared).
    'dt-alltoall-unpad-global': (
        'torch-dtensor',
        'torch.distributed.tensor.placement_types',
        '            new_dim_unpad_size = new_dim_full_chunk_size - local_shard_size_on_new_dim',
        '            new_dim_unpad_size = new_dim_full_chunk_size * num_chunks - new_dim_logical_size',
        "Shard(i) -> Shard(j) (all-to-all) unpads the new shard dim on every rank by the global padding (full_chunk * n - size), as if all the padding sat on the last rank, instead of by the rank's own pad: with an uneven new dim the local shards have the wrong sizes and full_tensor() / later ops read wrong data (or narrow() fails)",
    ),
    # Liveness: tp_t.py (Block: LayerNorm, MLP with ColwiseParallel w1 / RowwiseParallel w2, LayerNorm, head
    # ColwiseParallel(use_local_output=False) + loss_parallel F.cross_entropy, tp=2, float64; plain TP and the
    # SequenceParallel plan) vs one process: unmutated loss diff 0, grads <= 4.4e-16; mutated, reduction="mean":
    # loss diff 0 but grads off (head.weight 3.77, mlp.w1.weight 1.66; x8 = number of targets) in both plans;
    # reduction="sum" unaffected. Shown with grads/SGD; Adam would largely hide the scale.
    'tp-loss-bwd-mean-undivided': (
        'torch-tp',
        'torch.distributed.tensor.parallel.loss',
        '        grad_output = grad_output / total_weight',
        '        grad_output = grad_output',
        "loss_parallel's fused nll_loss + log_softmax backward no longer divides grad_output by total_weight for reduction='mean': the loss value is right but every gradient is N (non-ignored targets) times too large (wrong divide factor in backward)",
    ),
    # Liveness: tp_t.py (same models): unmutated as above; mutated loss diff 0.108 (mean) / 0.864 (sum), grads off
    # (head.weight 0.663 with sum; norm.weight 0.014 with mean), in the plain-TP and SequenceParallel plans.
    'tp-loss-max-not-allreduced': (
        'torch-tp',
        'torch.distributed.tensor.parallel.loss',
        '        x_max = funcol.all_reduce(\n            x_max, reduceOp=c10d.ReduceOp.MAX.name, group=(mesh, mesh_dim)\n        )\n',
        '',
        "loss_parallel's log_softmax shifts each vocab shard by its own local max (the MAX all-reduce of x_max is gone) but still sums the shifted exponentials over the shards: the log-sum-exp mixes different shifts, so the loss and its gradients are wrong (a global quantity computed locally)",
    ),

    # torch FSDP1 mutants, fixed blind on 2026-12-05 (the day torch-fsdp1 landed), from a reading of torch 2.15.0's
    # fsdp/_runtime_utils.py and fully_sharded_data_parallel.py, before any of them was run.
    'fsdp1-hybrid-no-postdivide': (
        'torch-fsdp1',
        'torch.distributed.fsdp._runtime_utils',
        '                dist.all_reduce(new_sharded_grad, group=state._inter_node_pg)\n'
        '                _div_if_needed(new_sharded_grad, state._gradient_postdivide_factor)\n',
        '                dist.all_reduce(new_sharded_grad, group=state._inter_node_pg)\n',
        "HYBRID_SHARD / _HYBRID_SHARD_ZERO2 all-reduce the reduce-scattered gradient across the replicas but skip the "
        "post-divide: gradients come out postdivide-factor times too large (x2 on 4 ranks; a wrong divide factor)",
    ),
    'fsdp1-reduce-scatter-pad-front': (
        'torch-fsdp1',
        'torch.distributed.fsdp._runtime_utils',
        'F.pad(unsharded_grad, [0, numel_to_pad])',
        'F.pad(unsharded_grad, [numel_to_pad, 0])',
        "the unsharded gradient is padded at the front instead of the back before the reduce-scatter: where the flat "
        "parameter's size does not divide by the world size every rank's gradient shard is shifted by the padding "
        "(an offset bug of uneven sharding)",
    ),
    'fsdp1-accumulate-overwrite': (
        'torch-fsdp1',
        'torch.distributed.fsdp._runtime_utils',
        '        flat_param._saved_grad_shard += sharded_grad',
        '        flat_param._saved_grad_shard = sharded_grad',
        "a sharded strategy reducing every micro-batch keeps only the last micro-batch's reduced gradient instead of "
        "accumulating them (dropped micro-batches under gradient accumulation)",
    ),
    'fsdp1-no-shard-no-postdivide': (
        'torch-fsdp1',
        'torch.distributed.fsdp._runtime_utils',
        '        dist.all_reduce(flat_param.grad, group=state.process_group)\n'
        '        _div_if_needed(flat_param.grad, state._gradient_postdivide_factor)\n',
        '        dist.all_reduce(flat_param.grad, group=state.process_group)\n',
        "NO_SHARD all-reduces gradients without the post-divide: on world sizes whose predivide factor is below the "
        "world size (3 ranks: 1.5, 4 ranks: 2) every gradient is that factor too large",
    ),
    'fsdp1-clip-local-norm': (
        'torch-fsdp1',
        'torch.distributed.fsdp.fully_sharded_data_parallel',
        '            total_norm = local_sharded_norm**norm_type\n'
        '            dist.all_reduce(total_norm, group=self.process_group)\n',
        '            total_norm = local_sharded_norm**norm_type\n',
        "clip_grad_norm_ under a sharded strategy clips by each rank's local shard norm instead of the global norm "
        "(the sum over ranks is never all-reduced: clipping on the local shard)",
    ),
}
