"""deepspeed-zero: the case's model trained by a DeepSpeed engine (ZeRO stage 0..3 from the case) over the
data-parallel ranks, on the CPU accelerator with gloo.

ZeRO-3's layout follows the case where it sets one: small parameters persistent (`persist_below`:
`stage3_param_persistence_threshold`), optimizer sub-groups (`optimizer_sub_group`: `sub_group_size`) and ZeRO++'s
secondary partition (`reshard_group`: `zero_hpz_partition_size`); so does how its parameter coordinator gathers and
releases parameters along the first step's trace (`prefetch_bucket`, `max_live_parameters`, `max_reuse_distance`:
`stage3_prefetch_bucket_size`, `stage3_max_live_parameters`, `stage3_max_reuse_distance`).

Checkpointed blocks (`model.activation_checkpointing`) run under torch's checkpoint, or under DeepSpeed's own where
the case asks for it (`framework_checkpoint`: `deepspeed.checkpointing.checkpoint` / `non_reentrant_checkpoint`,
configured with `partition_activations`, `cpu_checkpointing`, `contiguous_memory_optimization` as the case says,
without a model-parallel unit, as a data-parallel-only user calls it).

The case's context parallelism (cp) runs as DeepSpeed-Ulysses over the engine's sequence-parallel groups
(deepspeed_ulysses).

The case's MoE blocks run as DeepSpeed's MoE layer over its expert-parallel groups (the case's ep)
(deepspeed_moe); its l_aux, times the case's coefficient, joins each micro-batch's loss. With `auto_ep` they run as
the layers DeepSpeed's AutoEP puts in place of the model's own MoE modules (deepspeed_autoep).

The engine owns backward, gradient reduction, clipping and the optimizer step (a torch optimizer from
`make_optimizer`, which DeepSpeed wraps). Gradient accumulation is the engine's: `gradient_accumulation_steps`
is the number of micro-batches a rank runs, `engine.backward(..., scale_wrt_gas=False)` since the shared loop
already scales each micro-batch loss to its share of the global token mean, and `engine.step()` after every
micro-batch (DeepSpeed only steps the optimizer at the accumulation boundary).

Step-0 gradients are DeepSpeed's reduced gradients before clipping (`safe_get_full_grad` between backward and
step); final parameters are DeepSpeed's master copy (`safe_get_full_fp32_param`, fp32 under ZeRO / bf16 / fp16)
rounded to the case dtype. Semantics note: for bf16/f16 DeepSpeed keeps fp32 master weights across steps, while
the reference rounds the parameters to the case dtype after every step; the difference is of the order of one
rounding of the parameters per step.
"""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from .base import (dtype_name, parallel, reduce_bucket, reduce_dtype_name, reduction_feature, reshard_feature,  # noqa: E402
                   resume_feature, resumed_case, rotary_base, zero_offloaded)
from .torch_common import TorchTarget, shared_tempdir, torch_dtype  # noqa: E402
from .deepspeed_moe import install as install_moe, moe_features, moe_of, unsupported_moe  # noqa: E402
from .deepspeed_moe import to_case_layout as moe_to_case_layout  # noqa: E402
from . import deepspeed_autotp as autotp  # noqa: E402
from . import deepspeed_autoep as autoep  # noqa: E402
from . import deepspeed_ulysses as ulysses  # noqa: E402
from . import deepspeed_checkpoint  # noqa: E402
from .torch_model import (build, make_optimizer, sparse_embedding, to_case_layout, unsupported_layout,  # noqa: E402
                          unsupported_sparse_embedding)
from .torch_training import DataPart, SequencePart, combine_dp, single_device, train  # noqa: E402


#: DeepSpeed's names of the dtypes it accumulates gradients in (`data_types.grad_accum_dtype`).
ACCUMULATE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
#: The dtypes DeepSpeed communicates gradients in (`communication_data_type`): the case's `reduce_dtype`.
COMMUNICATION = ACCUMULATE

#: Elements per ZeRO reduce / all-gather / prefetch bucket (the reduce bucket: the case's `reduce_bucket` where it
#: sets one).
BUCKET = 1000


#: The parallel fields a run resumed from DeepSpeed's checkpoint may change (`train.resume_parallel`): the ZeRO
#: configuration, and the data-, tensor- and context-parallel (Ulysses) degrees over the same ranks (the training loop
#: splits the data anew; deepspeed_checkpoint says which checkpoints load into other degrees).
RESUMES_INTO = ("dp", "tp", "cp", "zero_stage", "zero_offload", "reduce_bucket", "overlap_comm", "reduce_scatter", "contiguous_grads",
                "round_robin_grads", "reduce_to_owner", "reshard_group", "persist_below", "optimizer_sub_group",
                "prefetch_bucket", "max_live_parameters", "max_reuse_distance", "grad_predivide")


def micro_batches(case):
    """Micro-batches per optimizer step: `train` runs exactly grad_accumulation on every rank
    (unsupported_model refuses cases where a rank would have fewer rows than that)."""
    return case["train"].get("grad_accumulation", 1)


class DeepSpeedZero(TorchTarget):
    name = "deepspeed-zero"
    freezes = True
    rotates = True
    smooths_labels = True
    checkpoint_layouts = ("sharded", "universal")  # (DeepSpeed's own checkpoint, or that converted by ds_to_universal)
    resumes_into = RESUMES_INTO

    def __init__(self):
        super().__init__()
        # Imported once here, before ranks are forked (a missing DeepSpeed makes the target unavailable).
        import deepspeed
        import deepspeed.runtime.zero.stage3  # noqa: F401
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401

        self.coverage_prefixes = (os.path.dirname(deepspeed.__file__) + os.sep,)

    def versions(self):
        import deepspeed
        import torch

        return {"torch": torch.__version__.split("+")[0], "deepspeed": deepspeed.__version__, "backend": "gloo"}

    def unsupported(self, case):
        why = (unsupported_layout(case, ("dp", "ep", "cp", "tp"),
                                  "deepspeed-zero runs ZeRO data parallelism, AutoTP tensor parallelism and Ulysses context "
                                  "parallelism (no pp)", offload=True, moe=True)
               or unsupported_sparse_embedding(case)
               or (autoep.unsupported_autoep(case) if autoep.enabled(case) else unsupported_moe(case))
               or unsupported_frozen_moe(case)
               or ulysses.unsupported_ulysses(case) or autotp.unsupported_autotp(case))
        if why:
            return why
        p = parallel(case)
        if rotary_base(case) is not None and p.get("cp", 1) > 1:
            # (DeepSpeed-Ulysses splits the sequence before the attention's projections and leaves positions to the
            # model: the turn of each piece would be the harness's, not DeepSpeed's.)
            return "a rotary embedding beside Ulysses would take its positions from the harness, not DeepSpeed"
        if sparse_embedding(case) and p["zero_stage"] > 0:
            # Measured: ZeRO's gradient buckets view every gradient flat, which sparse tensors cannot
            # ("Could not run 'aten::view' with arguments from the 'SparseCPU' backend").
            return "DeepSpeed reduces sparse gradients without ZeRO only (stage 0)"
        if p["zero_stage"] not in (0, 1, 2, 3):
            return f"ZeRO stage {p['zero_stage']} does not exist"
        why = unsupported_data_types(case)
        if why:
            return why
        if p["zero_stage"] == 3 and p["reshard_group"] == 1:
            return "DeepSpeed's hpZ partition size 1 turns the secondary partition off; it keeps no whole copies"
        why = deepspeed_checkpoint.unsupported_checkpoint(case)
        if why:
            return why
        rd = reduce_dtype_name(case)
        if rd not in COMMUNICATION:
            return f"DeepSpeed communicates gradients in {' / '.join(COMMUNICATION)} only, not {rd}"
        return None

    def init_rank(self, rank, world, timeout_s):
        os.environ["DS_ACCELERATOR"] = "cpu"
        super().init_rank(rank, world, timeout_s)
        import importlib

        import deepspeed

        # (`import deepspeed.comm.torch as m` would bind the real torch: deepspeed.comm re-exports it.)
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")

        # The shared-memory allreduce op is a JIT-built C++ extension (needs ninja and a compiler); it only
        # serves inference_all_reduce. Without it DeepSpeed uses plain torch.distributed (gloo) collectives.
        ds_torch_comm.build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        import gc

        # ZeRO-3 calls gc.collect() per engine (over a second with torch's and DeepSpeed's objects alive):
        # keep the objects of the imports out of every later collection.
        gc.freeze()

    def config(self, case, world):
        p, t = parallel(case), case["train"]
        dt = dtype_name(case)
        ga = micro_batches(case)
        clip = t.get("clip_grad_norm")
        cfg = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": ga,
            "train_batch_size": ga * world,
            "gradient_clipping": float(clip) if clip is not None else 0.0,
            "zero_optimization": {
                "stage": p["zero_stage"],
                # Small buckets: the defaults (5e8 elements) cost seconds per case to allocate (deterministic
                # mode fills fresh memory) and would put a whole tiny model in one bucket.
                "reduce_bucket_size": reduce_bucket(case, BUCKET),
                "allgather_bucket_size": BUCKET,
                "stage3_prefetch_bucket_size": BUCKET,
                # Partition every parameter under ZeRO-3 (by default ones under 1e5 elements stay whole).
                "stage3_param_persistence_threshold": 0,
            },
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        # The case's way of reducing gradients, where it sets one (absent: DeepSpeed's defaults, overlapped
        # under stage 3 only, a reduce-scatter, no pre-division).
        for key, ds_key in (("overlap_comm", "overlap_comm"), ("reduce_scatter", "reduce_scatter"),
                            ("contiguous_grads", "contiguous_gradients"),
                            ("round_robin_grads", "round_robin_gradients")):
            if p[key] is not None:
                cfg["zero_optimization"][ds_key] = p[key]
        if p["reduce_to_owner"] is not None:
            # Off: average_tensor reduces each bucket slice to its owner (one dist.reduce per destination rank).
            cfg["zero_optimization"]["use_multi_rank_bucket_allreduce"] = not p["reduce_to_owner"]
        for key, ds_key in ZERO3_LAYOUT:
            if p["zero_stage"] == 3 and p[key] is not None:
                cfg["zero_optimization"][ds_key] = p[key]
        if zero_offloaded(case):
            # ZeRO-Offload: the optimizer's partition and step on the host. The case's torch optimizer runs
            # there (DeepSpeedCPUAdam is a JIT-built extension, and would not be the case's optimizer).
            cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
            cfg["zero_force_ds_cpu_optimizer"] = False
        if p["grad_predivide"] is not None:
            cfg["gradient_predivide_factor"] = float(p["grad_predivide"])
        if dt == "bf16":
            cfg["bf16"] = {"enabled": True}
        elif dt == "f16":
            # Static loss scale 1: no scaling, as the reference (cases with a loss scale are unsupported).
            cfg["fp16"] = {"enabled": True, "loss_scale": 1.0, "initial_scale_power": 0}
        if t.get("grad_accum_dtype") is not None:
            # bf16 with fp32 accumulation at ZeRO-1 is DeepSpeed's BF16_Optimizer (bf16_optimizer.py), not ZeRO's.
            cfg["data_types"] = {"grad_accum_dtype": ACCUMULATE[t["grad_accum_dtype"]]}
        if reduce_dtype_name(case) != dt:
            cfg["communication_data_type"] = COMMUNICATION[reduce_dtype_name(case)]
        return autoep.config(autotp.config(ulysses.config(cfg, case), case), case)

    def run_rank(self, rank, world, case, inputs):
        import deepspeed
        import torch
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad

        dt = torch_dtype(dtype_name(case))
        cfg = self.config(case, world)

        block_checkpoint = deepspeed_block_checkpoint(case)

        aux = []  # the l_aux of each MoE block in the micro-batch's forward (DeepSpeed's MoE layer returns it)
        moe = moe_of(case)

        def fresh_engine(c=case, cfg=cfg):
            forget_earlier_engines()
            model, _ = build(case, inputs, sparse_embedding(case))
            autotp.prepare(model, c)
            if autoep.enabled(c):
                autoep.prepare(model, c)  # DeepSpeed replaces its MoE blocks
            elif moe is not None:
                install_moe(model, c, inputs, dt, aux)
            if block_checkpoint is not None:
                model.block_checkpoint = block_checkpoint
            opt = (autoep.optimizer(c, lambda params: make_optimizer(c, params, split_groups=moe_groups))
                   or make_optimizer(c, list(model.parameters()), split_groups=moe_groups if moe is not None else None))
            engine = deepspeed.initialize(model=model, optimizer=opt, config=cfg, **ulysses.initialize_kw(c))[0]
            if block_checkpoint is not None and autotp.tensor_parallel(c) > 1:
                # As a Megatron-DeepSpeed user configures it: activations partitioned over the tensor-parallel ranks
                # of the engine's model-parallel unit (AutoTP's groups).
                configure_deepspeed_checkpointing(parallel(c)["framework_checkpoint"], checkpointed_blocks(c),
                                                  mpu=engine.mpu)
            ulysses.install(engine, c)
            return engine

        # What the hooks below reach: the engine and its parameters, replaced when the run resumes.
        now = {"engine": fresh_engine()}
        names = [n for n, _ in now["engine"].module.named_parameters()]
        now["shards"] = autotp.sharded_dims(now["engine"].module)

        def trained():
            now["params"] = dict(now["engine"].module.named_parameters())
            return [(n, now["params"][n]) for n in names]

        def resume(_opt):
            # DeepSpeed's own checkpoint (module, ZeRO partitions, optimizer states), or the universal checkpoint
            # converted from it, loaded into a fresh engine of the resumed layout.
            resumed = resumed_case(case)
            with shared_tempdir() as path:
                tag = deepspeed_checkpoint.save(now["engine"], path, case)
                old = now["engine"]
                now["engine"] = fresh_engine(resumed, deepspeed_checkpoint.load_config(self.config(resumed, world), case))
                now["engine"].load_checkpoint(path, tag=tag)
                old.destroy()
            now["shards"] = autotp.sharded_dims(now["engine"].module)
            if deepspeed_checkpoint.degrees(resumed) == deepspeed_checkpoint.degrees(case):
                return trained(), None
            return trained(), None, data_part(rank, resumed, inputs, now["engine"], lambda: now["engine"].module)

        named = trained()
        ga = cfg["gradient_accumulation_steps"]
        state = {"micro": 0, "stepped": False}

        def backward(loss):
            if moe is not None and moe.get("aux_loss"):
                # The case's loss is the batch's sequences' mean aux loss times its coefficient, in this loop's units
                # (dp / global batch: the engine averages gradients over the data-parallel ranks).
                loss = loss + sum(aux) * (moe["aux_loss"] * world / case["model"]["batch"])
            now["engine"].backward(loss, scale_wrt_gas=False)
            state["micro"] += 1
            if state["micro"] % ga:
                now["engine"].step()  # not a boundary: DeepSpeed only counts the micro-step

        def step():
            state["stepped"] = True
            now["engine"].step()

        def view(name, t):
            p = now["params"][name]
            if not state["stepped"]:
                v = t  # the gradient, from grad() below
            else:
                v = safe_get_full_fp32_param(p)
                if v is None:
                    v = gathered(p)  # a frozen parameter has no fp32 copy in the optimizer
                v = v.detach().to(dt)
            # (In float64 before any gather over tp: the ranks' copies need not share a dtype; measured: bf16 ZeRO 1-2
            # cases with ranks holding no head aborted gloo in this gather, "512 vs 256" bytes.)
            v = v.detach().to(torch.float64, copy=True).reshape(tuple(getattr(p, "ds_shape", p.shape)))
            if name in now["shards"]:
                v = autotp.gather_shards(v, *now["shards"][name])  # replicated ones stay this rank's own copy
            return to_case_layout(name, v).numpy()

        part = data_part(rank, case, inputs, now["engine"], lambda: now["engine"].module)
        out = train(case, inputs, now["engine"], [p for _, p in named], part.dp_index, part.dp,
                    backward=backward, step=step, clip=lambda: None, named=named, view=view,
                    grad=lambda name, p: safe_get_full_grad(p), forward=lambda ids: (aux.clear(), now["engine"](ids))[1],
                    resume=resume, seq=part.seq, group=part.group, vocab=part.vocab)
        now["engine"].destroy()
        if moe is not None:
            for kind in ("grads", "params"):
                out[kind] = (autoep.to_case_layout(out[kind], case) if autoep.enabled(case)
                             else moe_to_case_layout(out[kind], parallel(case)["ep"]))
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        p = parallel(case)
        stage = f"deepspeed:dp{p['dp']}:zero{p['zero_stage']}{':offload' if zero_offloaded(case) else ''}"
        layout = []
        if p["contiguous_grads"] is not None:
            layout.append(f"{stage}:contiguous-{'on' if p['contiguous_grads'] else 'off'}")
        if p["reduce_to_owner"] is not None:
            layout.append(f"{stage}:{'reduce-to-owner' if p['reduce_to_owner'] else 'bucket-allreduce'}")
        if p["round_robin_grads"] is not None:
            layout.append(f"{stage}:{'round-robin' if p['round_robin_grads'] else 'model-order'}")
        layout.extend(zero3_layout_features(stage, p, [v.size for v in outs[0]["params"].values()], len(outs)))
        if reduce_dtype_name(case) != dtype_name(case):
            layout.append(f"{stage}:{dtype_name(case)}-communicated-in-{reduce_dtype_name(case)}")
        if case["train"].get("grad_accum_dtype") is not None:
            layout.append(f"{stage}:{dtype_name(case)}-accumulated-in-{case['train']['grad_accum_dtype']}")
        sparse = [f"{stage}:sparse-embedding"] if sparse_embedding(case) else []
        layout.extend(autoep.features(stage, case) if autoep.enabled(case) else moe_features(stage, case))
        layout.extend(ulysses.features(stage, case))
        layout.extend(autotp.features(stage, case))
        if p["framework_checkpoint"] is not None:
            layout.append(f"{stage}:checkpoint-{p['framework_checkpoint']}")
        return combine_dp(case, outs, [stage, reduction_feature(stage, case), *layout, *sparse,
                                       *resume_feature(stage, case)])


def data_part(rank, case, inputs, engine, module):
    """The rows `rank` trains on in the case's layout (`engine`: the DeepSpeed engine of that layout; `module()`: the
    engine's model now, which a resume replaces): its data-parallel index over DeepSpeed's (dp, sp) or (dp, tp) mesh,
    its part of each sequence under Ulysses, the group a step's loss sums over, and AutoTP's vocabulary-parallel
    loss."""
    dp_index, sp_index = ulysses.rank_part(rank, case)
    if autotp.tensor_parallel(case) > 1:
        dp_index = autotp.dp_index(rank, case)
    seq = None if sp_index is None else SequencePart(sp_index, ulysses.context_parallel(case), engine.seq_parallel_group)
    vocab = autotp.VocabShard(case, inputs, module) if autotp.vocab_sharded(case) else None
    return DataPart(dp_index, parallel(case)["dp"], autotp.loss_group(case), seq, vocab)


def unsupported_data_types(case):
    """Why DeepSpeed on the CPU accelerator cannot train in the case's dtypes (f64, f16, an accumulation dtype), or
    None."""
    dt = dtype_name(case)
    if dt == "f64":
        # Measured: ZeRO 1-3 train f64 params through fp32 partitions (grads off by ~1e-8); stage 0 asserts
        # "attempting to reduce an unsupported grad type: torch.float64" at the first allreduce.
        return "DeepSpeed keeps fp32 master weights and gradient partitions (stage 0 refuses f64 grads): f64 is not expressed"
    if dt == "f16":
        # Measured: the CPU accelerator refuses it in deepspeed.initialize:
        # "ValueError: Type fp16 is not supported on your device."
        return "DeepSpeed's CPU accelerator does not support fp16 training"
    acc = case["train"].get("grad_accum_dtype")
    if acc is not None and acc not in ACCUMULATE:
        return f"DeepSpeed accumulates gradients in {' / '.join(ACCUMULATE.values())} only, not {acc}"
    if acc is not None and acc not in (dt, "f32"):
        # Measured (campaign 113): f32 gradients accumulated in bf16 come back rounded to bf16, as asked, 1e-3
        # off; the oracle's noise ensemble models the case dtype and reduce_dtype, not an accumulation dtype.
        return f"gradients accumulated in {acc}, below the {dt} compute dtype, are not expressed"
    return None


def forget_earlier_engines():
    """What a fresh process has: DeepSpeed keeps the ZeRO++ (hpZ) parameter group in a module global that no engine's
    teardown clears, and every later ZeRO-3 engine of the process partitions through it (a case without hpZ after
    one with it ran with hpZ; one with another hpZ size, with the first one's)."""
    from deepspeed.utils import groups

    if hasattr(groups, "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
        groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    # So do the device mesh, mpu and sequence-parallel groups of an engine with sequence parallelism (DeepSpeed-Ulysses).
    ulysses.forget()
    autotp.forget()  # and those of an AutoTP engine


def moe_groups(groups):
    """The optimizer's parameter groups with DeepSpeed's expert parameters in groups of their own, as DeepSpeed's MoE
    tutorial builds them (ZeRO requires it)."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    named = [{**g, "name": g.get("name", f"group{i}")} for i, g in enumerate(groups)]  # (the function reads names)
    return split_params_into_different_moe_groups_for_optimizer(named)


def unsupported_frozen_moe(case):
    """Why the case's frozen parameters cannot be expressed with DeepSpeed's MoE layer (None: they can)."""
    m = case.get("model") or {}
    frozen = case["train"].get("frozen") or ()
    for i, kind in enumerate(m.get("layers", ())):
        pre = f"layers.{i}.moe"
        if kind == "moe" and any(f == pre or f.startswith(pre + ".") or pre.startswith(f + ".") for f in frozen):
            return "frozen parameters of a MoE block are not expressed with DeepSpeed's MoE layer or AutoEP's"
    return None


def deepspeed_block_checkpoint(case):
    """The case's `framework_checkpoint` as DeepSpeed's activation checkpointing: its module-level settings configured
    for this case (every case configures them, so none leaks into the next), and a block runner for the model in
    place of torch's checkpoint; None where the case leaves the blocks to torch's."""
    mode = case["parallel"].get("framework_checkpoint")
    if mode is None:
        return None
    import torch
    from deepspeed.runtime.activation_checkpointing import checkpointing as ck

    configure_deepspeed_checkpointing(mode, checkpointed_blocks(case))

    def run(layer, x, recompute):
        if recompute is None or not torch.is_grad_enabled():
            return layer(x)
        if recompute == "non_reentrant":
            return ck.non_reentrant_checkpoint(layer, x)
        if not x.requires_grad:
            x = x.detach().requires_grad_(True)  # as for torch's re-entrant checkpoint (see checkpointed_block)
        return ck.checkpoint(layer, x)

    return run


def checkpointed_blocks(case):
    """How many block checkpoints a forward of the case's model takes (every block, once per layer pass)."""
    m = case["model"]
    return len(m["layers"]) * m.get("layer_passes", 1)


def configure_deepspeed_checkpointing(mode, num_checkpoints, mpu=None):
    """DeepSpeed's module-level activation-checkpointing settings for a case's `framework_checkpoint` (None: plain),
    with the model-parallel unit `mpu` whose ranks partitioned activations are split over (None: none)."""
    from deepspeed.runtime.activation_checkpointing import checkpointing as ck

    ck.configure(mpu, partition_activations=mode in ("partition", "partition_cpu", "contiguous"),
                 contiguous_checkpointing=mode == "contiguous", checkpoint_in_cpu=mode in ("cpu", "partition_cpu"),
                 num_checkpoints=num_checkpoints, synchronize=False, profile=False)
    if mpu is None:
        # (configure without a unit keeps the model-parallel ranks an earlier case's unit set)
        ck.mpu, ck.mp_rank, ck.mp_size, ck.mp_group = None, 0, 1, None
    ck.reset()
    for first_forward_state in ("cuda_device", "transport_stream"):
        # Older releases (0.14-0.18) set these at the first checkpointed forward: one that failed there (the CPU
        # accelerator has no Stream) left a device and no stream for the next case.
        if hasattr(ck, first_forward_state):
            setattr(ck, first_forward_state, None)


#: The case's ZeRO-3 layout fields and the DeepSpeed settings that realise them (read only at stage 3).
ZERO3_LAYOUT = (
    ("persist_below", "stage3_param_persistence_threshold"),
    ("optimizer_sub_group", "sub_group_size"),
    # How the parameter coordinator gathers and releases parameters along the trace of the first step.
    ("prefetch_bucket", "stage3_prefetch_bucket_size"),
    ("max_live_parameters", "stage3_max_live_parameters"),
    ("max_reuse_distance", "stage3_max_reuse_distance"),
    # ZeRO++ hpZ: after the forward each parameter is released to a secondary partition over groups of this many
    # ranks, all-gathered within the group in the backward.
    ("reshard_group", "zero_hpz_partition_size"),
)


def zero3_layout_features(stage, p, sizes, world):
    """How ZeRO-3 lays the parameters out, where the case says: whether none, some or all of them persist whole on
    every rank (`persist_below`), whether a rank's partition is stepped in one optimizer sub-group or several
    (`optimizer_sub_group`), and how much the coordinator gathers ahead, keeps alive and keeps for a reuse
    (`prefetch_bucket`, `max_live_parameters`, `max_reuse_distance`). `sizes`: every parameter's element count."""
    if p["zero_stage"] != 3:
        return []
    out = [f"{stage}:{name}-{size_band(p[key], sizes)}"
           for key, name in (("prefetch_bucket", "prefetch"), ("max_live_parameters", "live-cap"),
                             ("max_reuse_distance", "reuse")) if p[key] is not None]
    if p["persist_below"] is not None:
        kept = sum(n <= p["persist_below"] for n in sizes)
        out.append(f"{stage}:persistent-{'none' if kept == 0 else 'all' if kept == len(sizes) else 'some'}")
    if p["optimizer_sub_group"] is not None:
        out.append(f"{stage}:sub-groups-{'several' if p['optimizer_sub_group'] < sum(sizes) / world else 'one'}")
    if p["reshard_group"] is not None:
        out.append(f"{stage}:{reshard_feature(p['reshard_group'], world)}")
    return out


def size_band(n, sizes):
    """Where a size in elements sits against the parameters' `sizes`: none, below the largest parameter, some of the
    model, or all of it."""
    return "none" if n == 0 else "all" if n >= sum(sizes) else "below-a-parameter" if n < max(sizes) else "some"


def gathered(p):
    """The full value of the parameter `p` (ZeRO-3 partitions it: gathered, every rank calling)."""
    import deepspeed

    if not hasattr(p, "ds_id"):
        return p.detach().clone()
    with deepspeed.zero.GatheredParameters([p]):
        return p.detach().clone()


TARGET = DeepSpeedZero()

