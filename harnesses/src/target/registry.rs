//! Targets by name. A new target is one file plus one line in [`TARGETS`].

use super::{NopTarget, Target};

/// Options every target constructor receives.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    /// Injected bugs to enable (native target only).
    pub inject: Vec<String>,
    /// Collective timeout in milliseconds (0: the target's default).
    pub timeout_ms: u64,
}

/// A registered target: name, one-line description, the Python environment it runs in, constructor.
pub struct TargetInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// The environment its worker runs in (`main`: `.venv`; another name: `.venv-NAME`); None: in-process.
    pub env: Option<&'static str>,
    /// Optional case features it can express (`sequence_parallel_mode` beyond split_gather,
    /// `zero_offload`): campaigns mutate towards a feature only when one of their targets offers it.
    pub offers: &'static [&'static str],
    pub create: fn(&TargetOptions) -> Result<Box<dyn Target>, String>,
}

pub const TARGETS: &[TargetInfo] = &[
    TargetInfo {
        name: "native",
        description: "embedded sharded implementation: TP/SP, DP/ZeRO, PP, EP on simulated ranks (threads)",
        env: None,
        offers: &["layer_passes", "label_smoothing", "clip_norm_type"],
        create: |o| {
            let bugs = crate::model::Bugs::parse(&o.inject)?;
            let ms = if o.timeout_ms == 0 { 10_000 } else { o.timeout_ms };
            Ok(Box::new(crate::native::NativeTarget::new(bugs, std::time::Duration::from_millis(ms))))
        },
    },
    TargetInfo {
        name: "nop",
        description: "single-device run in the case dtype (no sharding): for tests",
        env: None,
        offers: &[],
        create: |_| Ok(Box::new(NopTarget)),
    },
    TargetInfo {
        name: "torch-dtensor",
        description: "PyTorch DTensor: op cases on 1-D/2-D DeviceMesh, and OpInfo library ops on 1-3-D meshes, with Shard / Replicate / Partial (uneven shards)",
        env: Some(MAIN),
        offers: &[],
        create: |o| python("torch-dtensor", MAIN, o),
    },
    TargetInfo {
        name: "torch-tp",
        description: "PyTorch tensor parallel: parallelize_module with Colwise/RowwiseParallel, SequenceParallel, loss_parallel",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "local_mean_loss", "vocab_loss", "activation_checkpointing", "layer_passes", "compiled",
            "optimizer_implementation", "clip_norm_type", "resume_after", "checkpoint_layout"],
        create: |o| python("torch-tp", MAIN, o),
    },
    TargetInfo {
        name: "torch-fsdp2",
        description: "PyTorch FSDP2: fully_shard over the data-parallel ranks, optional HSDP (2-D mesh) and CPU offload, torch's context parallelism (ring attention under context_parallel, sharded over dp x cp)",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "local_mean_loss",
            "zero_offload",
            "zero_shard_group",
            "reduce_dtype_below",
            "master_dtype",
            "reshard_group",
            "sync_every_microbatch",
            "param_shard_dim",
            "sum_collectives",
            "explicit_grad_divide",
            "compiled",
            "optimizer_implementation", "clip_norm_type",
            "resume_after", "checkpoint_layout", "resume_parallel", "resume_degrees",
            "frozen",
            "activation_checkpointing", "layer_passes",
            "context_parallel",
            "cp_all_to_all",
        ],
        create: |o| python("torch-fsdp2", MAIN, o),
    },
    TargetInfo {
        name: "torch-ddp",
        description: "PyTorch DistributedDataParallel over the data-parallel ranks, torch's ZeroRedundancyOptimizer under ZeRO 1 (shard groups, parameter buckets), resume from rank 0's state dicts, torch's context parallelism (ring attention under context_parallel, DDP over dp x cp)",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "local_mean_loss",
            "reduce_bucket",
            "contiguous_grads",
            "sparse_embedding",
            "static_graph",
            "reduce_dtype_below",
            "find_unused",
            "sync_every_microbatch",
            "frozen",
            "activation_checkpointing", "layer_passes",
            "context_parallel",
            "cp_all_to_all",
            "zero_shard_group",
            "param_buckets",
            "resume_after",
            "compiled",
            "optimizer_implementation", "clip_norm_type",
        ],
        create: |o| python("torch-ddp", MAIN, o),
    },
    TargetInfo {
        name: "torch-fsdp1",
        description: "PyTorch FSDP1 (FullyShardedDataParallel, flat parameters, use_orig_params): NO_SHARD / SHARD_GRAD_OP / FULL_SHARD and hybrid sharding over the data-parallel ranks, mixed precision, no_sync, its clip_grad_norm_, DCP checkpoints resumed into another sharding strategy",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "local_mean_loss",
            "zero_shard_group",
            "reduce_dtype_below",
            "master_dtype",
            "sync_every_microbatch",
            "resume_after", "checkpoint_layout", "resume_parallel",
            "frozen",
            "activation_checkpointing", "layer_passes",
            "flat_params",
            "optimizer_implementation", "clip_norm_type",
            "compiled",
        ],
        create: |o| python("torch-fsdp1", MAIN, o),
    },
    TargetInfo {
        name: "torch-pp",
        description: "PyTorch pipelining: PipelineStage per block range under ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B / ScheduleLoopedBFS, the zero-bubble ScheduleInterleavedZeroBubble / ScheduleZBVZeroBubble and ScheduleDualPipeV, stages in DDP or FSDP2 over the data-parallel ranks and torch's tensor (and sequence) parallel plan inside them (torchtitan's pp x dp x tp), resumed through torch.distributed.checkpoint over other stages and ranks",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "local_mean_loss", "vocab_loss", "reduce_dtype_below", "master_dtype", "frozen",
            "activation_checkpointing", "zero_bubble", "dual_pipe", "breadth_first", "optimizer_implementation", "clip_norm_type",
            "compiled",
            "resume_after", "resume_parallel", "resume_degrees", "resume_stages",
        ],
        create: |o| python("torch-pp", MAIN, o),
    },
    TargetInfo {
        name: "jax-shardmap",
        description: "JAX shard_map with explicit collectives (psum, pmax, all_gather, psum_scatter, ppermute rings, all_to_all) on host devices; model cases trained over [dp, pp, tp] (pmean over dp, ZeRO-3 all_gather, Megatron-style tp and sequence parallelism, a ppermute pipeline), gradients from JAX's transposes",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "frozen", "activation_checkpointing", "layer_passes"],
        create: |o| python("jax-shardmap", MAIN, o),
    },
    TargetInfo {
        name: "jax-gspmd",
        description: "JAX jit with NamedSharding and with_sharding_constraint: XLA GSPMD partitions (and pads); model cases trained over [dp, tp] (ZeRO stages and sequence parallelism as shardings)",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "frozen", "activation_checkpointing", "layer_passes"],
        create: |o| python("jax-gspmd", MAIN, o),
    },
    TargetInfo {
        name: "deepspeed-zero",
        description: "DeepSpeed ZeRO stages 0-3 over the data-parallel ranks, tensor parallelism as its AutoTP training, optional optimizer offload to the host, MoE blocks as its MoE layer (top-1) over expert-parallel ranks, context parallelism as DeepSpeed-Ulysses (DistributedAttention over its sequence-parallel ranks)",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", 
            "zero_offload",
            "reduce_bucket",
            "overlap_comm",
            "reduce_scatter",
            "grad_predivide",
            "contiguous_grads",
            "round_robin_grads",
            "grad_accum_dtype",
            "sparse_embedding",
            "reduce_dtype_below",
            "reduce_to_owner",
            "persist_below",
            "optimizer_sub_group",
            "reshard_group",
            "prefetch_bucket",
            "max_live_parameters",
            "max_reuse_distance",
            "resume_after", "checkpoint_layout", "resume_parallel", "resume_degrees",
            "frozen",
            "activation_checkpointing", "layer_passes", "framework_checkpoint",
            "moe_pad_to_capacity",
            "context_parallel",
            "ulysses_mpu",
            "vocab_loss",
            "tp_overlap_comm",
            "auto_ep",
        ],
        create: |o| python("deepspeed-zero", MAIN, o),
    },
    TargetInfo {
        name: "deepspeed-pp",
        description: "DeepSpeed's pipeline engine: a PipelineModule (embedding, blocks, norm, head; a tied head as TiedLayerSpec) trained by train_batch under its 1F1B TrainSchedule or DualPipeV, beside data parallelism at ZeRO 0-1 (its BF16_Optimizer or ZeRO-1 optimizer)",
        env: Some(MAIN),
        offers: &["rotary", "label_smoothing", "local_mean_loss", "reduce_bucket", "grad_accum_dtype", "frozen",
            "activation_checkpointing", "framework_checkpoint", "dual_pipe", "resume_after", "checkpoint_layout", "resume_stages",
        ],
        create: |o| python("deepspeed-pp", MAIN, o),
    },
    TargetInfo {
        name: "megatron-tp",
        description: "Megatron-core ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding / vocab_parallel_cross_entropy, pipeline stages under its 1F1B and interleaved schedules, data-parallel replicas in its DistributedDataParallel (ZeRO-1: its distributed optimizer), MoE blocks as its MoELayer over expert-parallel ranks",
        env: Some(MAIN),
        offers: &[
            "label_smoothing",
            "vocab_loss",
            "reduce_bucket",
            "overlap_comm",
            "zero_shard_group",
            "overlap_param_gather",
            "sum_collectives",
            "grad_accum_dtype",
            "per_token_loss",
            "resume_after",
            "checkpoint_layout",
            "resume_parallel", "resume_degrees", "resume_stages",
            "moe_pad_to_capacity",
            "frozen",
            "activation_checkpointing",
            "layer_passes",
        ],
        create: |o| python("megatron-tp", MAIN, o),
    },
    TargetInfo {
        name: "megatron-ddp",
        description: "Megatron-core DistributedDataParallel + its optimizer over the data-parallel ranks: contiguous gradient buckets, the distributed optimizer (ZeRO-1; partial: several instances; overlapped parameter gather), fp32 main parameters, gradient reduction in fp32",
        env: Some(MAIN),
        offers: &[
            "label_smoothing",
            "reduce_bucket",
            "overlap_comm",
            "zero_shard_group",
            "overlap_param_gather",
            "sum_collectives",
            "grad_accum_dtype",
            "frozen",
            "per_token_loss",
            "resume_after",
            "checkpoint_layout",
            "resume_parallel",
            "activation_checkpointing",
            "layer_passes",
        ],
        create: |o| python("megatron-ddp", MAIN, o),
    },
    TargetInfo {
        name: "colossalai-tp",
        description: "Colossal-AI shardformer Linear1D_Col / Linear1D_Row / VocabParallelEmbedding1D / VocabParallelLMHead1D + cross_entropy_1d, sequence parallel split_gather / ring",
        env: Some("colossalai"),
        offers: &["sequence_parallel_mode", "vocab_loss", "vocab_divisible_by", "activation_checkpointing", "layer_passes"],
        create: |o| python("colossalai-tp", "colossalai", o),
    },
    TargetInfo {
        name: "colossalai-zero",
        description: "Colossal-AI Booster + LowLevelZeroPlugin: ZeRO stages 1-2 over the data-parallel ranks, fp32/bf16/fp16, optional CPU offload",
        env: Some("colossalai"),
        offers: &["label_smoothing", 
            "zero_offload",
            "reduce_bucket",
            "overlap_comm",
            "master_dtype",
            "zero_shard_group",
            "overlap_param_gather",
            "resume_after", "checkpoint_layout", "resume_parallel",
            "frozen",
            "activation_checkpointing", "layer_passes",
        ],
        create: |o| python("colossalai-zero", "colossalai", o),
    },
    TargetInfo {
        name: "colossalai-hybrid",
        description: "Colossal-AI Booster + HybridParallelPlugin on a transformers Llama (or Mistral, Qwen2; with a rotary position embedding where the case has one) or GPT-2 (or OPT, or with a rotary embedding a Falcon, in pairs or parallel blocks), or parallel blocks as a Cohere Command (with query/key norms where the case has them): tp x pp (1F1B, interleaved) x dp, ZeRO 0-2, sequence parallel split_gather / ring / all_to_all",
        env: Some("colossalai"),
        offers: &[
            "hf_model",
            "rotary",
            "qk_norm",
            "sequence_parallel_mode",
            "zero_offload",
            "vocab_loss",
            "reduce_bucket",
            "overlap_comm",
            "vocab_divisible_by",
            "overlap_param_gather",
            "resume_after", "checkpoint_layout", "resume_parallel", "resume_degrees", "resume_stages",
            "frozen",
            "activation_checkpointing",
        ],
        create: |o| python("colossalai-hybrid", "colossalai", o),
    },
    TargetInfo {
        name: "colossalai-moe",
        description: "Colossal-AI Booster + MoeHybridParallelPlugin on a transformers Mixtral: experts over ep ranks (shardformer's EP MoE blocks), moe_dp = dp / ep, tp x pp x dp, ZeRO 0-1",
        env: Some("colossalai"),
        offers: &["zero_offload", "reduce_bucket", "vocab_divisible_by", "activation_checkpointing", "rotary"],
        create: |o| python("colossalai-moe", "colossalai", o),
    },
];

/// Default time a Python target's case may take before it is a hang.
const PYTHON_TIMEOUT_MS: u64 = 60_000;
/// Default for a library-op case: one op on small sample inputs takes milliseconds (230 cases of a
/// campaign queue: 87 ms on average in process; a new JAX shape compiles in under a second), while
/// each hang at the model cases' 60 s cost a torch-dtensor campaign 3.5 minutes, at 20 s (30 s with
/// the in-process grace) one hang signature hit 13 times took 390 s of a 10-minute campaign. 10 s,
/// with the worker interrupting the case itself: 400 cases of a campaign queue took 46 ms on average,
/// 390 ms at the 99th percentile and 3.4 s at most (a worker's first case); at 5 s a 60-s campaign
/// made twice the execs, but a first case on a loaded machine could be cut off in our own set-up.
const PYTHON_OP_TIMEOUT_MS: u64 = 10_000;

use super::python::MAIN_ENV as MAIN;

fn python(name: &str, env: &str, o: &TargetOptions) -> Result<Box<dyn Target>, String> {
    let (ms, op_ms) = if o.timeout_ms == 0 { (PYTHON_TIMEOUT_MS, PYTHON_OP_TIMEOUT_MS) } else { (o.timeout_ms, o.timeout_ms) };
    let d = std::time::Duration::from_millis;
    Ok(Box::new(super::PythonTarget::new(name, env, d(ms), d(op_ms))?))
}

/// Whether `name` runs in a Python worker.
pub fn is_python(name: &str) -> bool {
    environment(name).is_some()
}

/// The optional case features the targets of a `--target` list (comma-separated) offer.
pub fn offered(targets: &str) -> Vec<&'static str> {
    let names: Vec<&str> = targets.split(',').map(str::trim).collect();
    TARGETS.iter().filter(|t| names.contains(&t.name)).flat_map(|t| t.offers.iter().copied()).collect()
}

/// The Python environment target `name` runs in (None: not a Python target, or no such target).
pub fn environment(name: &str) -> Option<&'static str> {
    TARGETS.iter().find(|t| t.name == name).and_then(|t| t.env)
}

/// The interpreter target `name` runs in (see [`super::python::python_interpreter_for`]).
pub fn interpreter(name: &str) -> std::path::PathBuf {
    super::python::python_interpreter_for(name, environment(name).unwrap_or(MAIN))
}

/// Creates the target called `name`.
pub fn create(name: &str, opts: &TargetOptions) -> Result<Box<dyn Target>, String> {
    let info = TARGETS.iter().find(|t| t.name == name).ok_or_else(|| {
        let names: Vec<_> = TARGETS.iter().map(|t| t.name).collect();
        format!("unknown target `{name}` (known: {})", names.join(", "))
    })?;
    (info.create)(opts)
}
