//! The parallelism configuration of a case: mesh degrees, ZeRO, micro-batches, schedule, rank order.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Degrees of each mesh axis and the strategy switches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parallel {
    /// Data-parallel degree.
    pub dp: u32,
    /// Tensor-parallel degree (Megatron style).
    pub tp: u32,
    /// Pipeline-parallel degree (number of stages).
    pub pp: u32,
    /// Context-parallel degree.
    #[serde(default = "one")]
    pub cp: u32,
    /// Expert-parallel degree: experts spread over this many data-parallel ranks.
    #[serde(default = "one")]
    pub ep: u32,
    /// Shard the norm/residual regions along the sequence over the TP group.
    #[serde(default)]
    pub sequence_parallel: bool,
    /// How sequence parallelism is realised, where a framework offers several (Colossal-AI's
    /// `sequence_parallelism_mode`); the same model either way. Read only with `sequence_parallel`;
    /// targets with one realisation run it for `split_gather` and refuse the others.
    #[serde(default, skip_serializing_if = "SequenceParallelMode::is_default")]
    pub sequence_parallel_mode: SequenceParallelMode,
    /// ZeRO stage 0..=3 over the data-parallel group.
    #[serde(default)]
    pub zero_stage: u8,
    /// ZeRO with its optimizer states (and master weights) offloaded to host memory, where a target offers
    /// it (Colossal-AI's `cpu_offload`); targets without offloading refuse it. Read only with a ZeRO stage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zero_offload: bool,
    /// How the loss meets a tensor-parallel LM head, where a framework offers both (`VocabLoss`); the
    /// same model and loss either way. Absent: the target's own default.
    #[serde(default, skip_serializing_if = "VocabLoss::is_default")]
    pub vocab_loss: VocabLoss,
    /// The vocabulary padded to a multiple of this many rows per tensor-parallel rank (the padded size a
    /// multiple of N × tp) where a framework offers it (Megatron's and Colossal-AI's
    /// `make_vocab_size_divisible_by`): the padding rows are no token, so the same model and loss. A large N
    /// leaves the last ranks with padding rows only. Absent: the target's own choice. 1 to 4096.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_divisible_by: Option<u32>,
    /// Elements per bucket of the data-parallel gradient reduction, where a framework buckets it (DDP's
    /// and HybridParallelPlugin's `bucket_cap_mb`, DeepSpeed's `reduce_bucket_size`, Colossal-AI ZeRO's
    /// reduce bucket): the boundaries decide which gradients are flattened and reduced together, and when.
    /// The same result either way. Absent: the target's own size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_bucket: Option<u32>,
    /// The gradient reduction overlapped with the backward pass (true) or not (false), where a framework
    /// offers the choice (DeepSpeed's `overlap_comm`, Colossal-AI's `overlap_communication`); the same
    /// result either way. Absent: the target's own choice. Read only with data parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_comm: Option<bool>,
    /// The data-parallel gradient reduction as a reduce-scatter (true) or as all-reduces (false), where a
    /// framework offers the choice (DeepSpeed's `reduce_scatter`); the same result either way. Absent: the
    /// target's own choice. Read only with data parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_scatter: Option<bool>,
    /// A gradient pre-division factor f: gradients divided by f before the data-parallel reduction and the
    /// sum by dp / f after it, where a framework offers it (DeepSpeed's `gradient_predivide_factor`, which
    /// keeps large sums in range); the same average either way. Absent: none (1). 1 to 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_predivide: Option<u32>,
    /// The data-parallel gradient reduction's collectives plain sums, the average's division done apart from them
    /// (true), or the division inside the collectives (false: an averaging or pre-multiplying reduce op), where a
    /// framework offers the choice (FSDP2's `set_force_sum_reduction_for_comms`, for backends without those ops;
    /// Megatron's `average_in_collective`, negated); the same result either way. Absent: the target's own choice.
    /// Read only with data parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_collectives: Option<bool>,
    /// The data-parallel average's divisor (the number of ranks a gradient is reduced over) handed to the framework
    /// explicitly (true) instead of derived by it (false), where a framework takes one (FSDP2's
    /// `set_gradient_divide_factor`, which torchtitan sets on expert-parallel modules); the same result either way.
    /// Absent: derived. Read only with data parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explicit_grad_divide: Option<bool>,
    /// Gradients kept in contiguous reduction buffers (true) or per parameter (false), where a framework
    /// offers the choice: DeepSpeed ZeRO's `contiguous_gradients` (reduced gradients copied into one buffer
    /// per rank as their buckets are reduced, or gathered into the rank's partition at the step), DDP's
    /// `gradient_as_bucket_view` (gradients as views into the reduction buckets, or copied out of them). The
    /// same result either way. Absent: the target's own choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contiguous_grads: Option<bool>,
    /// Parameters dealt to the ZeRO partitions round robin (true) instead of in model order (false), where a
    /// framework offers the choice (DeepSpeed ZeRO-1/2's `round_robin_gradients`); the same result either
    /// way. Absent: the target's own choice. Read only with a ZeRO stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_robin_grads: Option<bool>,
    /// Hybrid sharding: the sharded states split within groups of this many consecutive data-parallel ranks
    /// and replicated across the groups, where a framework offers it (FSDP2's HSDP on a (dp / g, g) mesh;
    /// Colossal-AI's LowLevelZeroPlugin `extra_dp_size = dp / g`, whose optimizer takes the (dp / g, g) mesh's two
    /// groups and runs every collective across the groups and then within one, its partitions spanning both;
    /// Megatron's partial distributed optimizer under ZeRO 1, `num_distributed_optimizer_instances = dp / g`);
    /// the same result either way. Absent: sharded over every data-parallel rank. Divides dp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_shard_group: Option<u32>,
    /// Each slice of a gradient bucket reduced only to the rank whose partition owns it (true) instead of the
    /// whole bucket all-reduced and each rank keeping its part (false), where a framework offers the choice
    /// (DeepSpeed ZeRO-1/2's `use_multi_rank_bucket_allreduce: false`, one `reduce` per destination rank); the
    /// same result either way. Absent: the target's own choice. Read only with a ZeRO stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_to_owner: Option<bool>,
    /// After the optimizer step, the updated parameter partitions all-gathered asynchronously, each waited for
    /// when the next forward first uses the parameter (true), or gathered before the step returns (false), where
    /// a framework offers the choice (Colossal-AI's `overlap_allgather`, Megatron's `overlap_param_gather`); the
    /// same result either way. Absent: the target's own choice. Read only with a ZeRO stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_param_gather: Option<bool>,
    /// With gradient accumulation, the data-parallel gradients reduced after every micro-batch (true) or accumulated
    /// locally and reduced once, after the last (false), where a framework offers the choice (DDP's `no_sync`,
    /// FSDP2's `set_requires_gradient_sync(False)` on the micro-batches before the last); the same result either
    /// way. Absent: the target's own choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_every_microbatch: Option<bool>,
    /// Under pipeline parallelism, each backward split into its input-gradient and weight-gradient parts, the weight
    /// parts scheduled into the pipeline's bubbles (zero-bubble schedules), where a framework offers it (torch's
    /// `ScheduleInterleavedZeroBubble` under the interleaved schedule, `ScheduleZBVZeroBubble`'s two V-placed stages
    /// per rank under 1F1B); the same result either way. Absent: the target's own choice. Read only with pp > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_bubble: Option<bool>,
    /// Under the 1F1B schedule with pp > 1, DeepSeek's DualPipeV: two stages per pipeline rank placed in a V (rank r
    /// holds stages r and 2 pp - 1 - r), one micro-batch's forward overlapped with another's backward, each backward
    /// split into its input- and weight-gradient parts, where a framework offers it (torch's `ScheduleDualPipeV`);
    /// the same result either way. Absent: the target's own choice. Read only under 1F1B with pp > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dual_pipe: Option<bool>,
    /// Under context parallelism (cp > 1) realised as DeepSpeed-Ulysses, the sequence-parallel groups come from
    /// DeepSpeed's own sequence-parallel unit (`parallel_state_sp` passed as `mpu`, its Ulysses-for-Hugging-Face / ALST
    /// setup) instead of the config's `sequence_parallel_size` device mesh, where a framework offers both; the same
    /// result either way. Absent: the target's own choice. Read only with cp > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ulysses_mpu: Option<bool>,
    /// Under context parallelism (cp > 1) realised as ring attention, the key/value shards travel between the ranks
    /// by all-to-all instead of all-gather, where a framework offers both (torch's `set_rotate_method("alltoall")`);
    /// the same result either way. Absent: the target's own choice. Read only with cp > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cp_all_to_all: Option<bool>,
    /// Under tensor parallelism (tp > 1), a column-parallel layer's backward all-reduces its input gradient
    /// asynchronously, overlapped with its weight gradient's computation, where a framework offers the choice
    /// (DeepSpeed AutoTP's `tp_overlap_comm`); the same result either way. Absent: the target's own choice. Read only
    /// with tp > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_overlap_comm: Option<bool>,
    /// The case's MoE blocks made expert parallel by the framework replacing the model's own MoE modules at
    /// initialisation (DeepSpeed's AutoEP: a dropless all-to-all of variable splits), rather than the model being built
    /// from the framework's MoE layer (DeepSpeed's `deepspeed.moe.layer.MoE`: capacity buffers); the same result either
    /// way. Absent: the target's own choice. Read only with MoE blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_ep: Option<bool>,
    /// Under the interleaved schedule, a pipeline rank's stages run breadth first (every ready micro-batch of its
    /// earlier stage before the later one: torch's `ScheduleLoopedBFS`) rather than depth first (interleaved 1F1B),
    /// where a framework offers the choice; the same result either way. Absent: the target's own choice. Read only
    /// under the interleaved schedule with pp > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breadth_first: Option<bool>,
    /// Sharded parameters split along this tensor dimension where it divides evenly over their shard group, the
    /// others along dimension 0, where a framework offers the choice (FSDP2's `shard_placement_fn` returning
    /// `Shard(d)`; it refuses uneven splits on a nonzero dimension); the same result either way. Absent: dimension
    /// 0. 0 to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_shard_dim: Option<u8>,
    /// The same parameters take part in every step and the framework may rely on it (true), or it must
    /// find out each step (false), where a framework offers the choice (DDP's `static_graph`: the reducer
    /// records the first step's autograd hooks, delays that step's reduction to the end of the backward and
    /// replays the order afterwards); the same result either way. Absent: the target's own choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_graph: Option<bool>,
    /// The framework searches each step's autograd graph for parameters that get no gradient and marks them
    /// ready (true), or expects a gradient for every parameter (false), where a framework offers the choice
    /// (DDP's `find_unused_parameters`: the reducer traverses the graph from the outputs after every forward).
    /// Every parameter of a case gets a gradient, so the same result either way. Absent: the target's own
    /// choice. Read only with data parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub find_unused: Option<bool>,
    /// Each wrapped unit's parameters exposed as one flat parameter (true) or the original parameters kept as views
    /// into it (false), where a framework offers the choice (FSDP1's `use_orig_params=False` / `True`: the optimizer
    /// and every gradient then see the flat parameters); the same result either way. Absent: the target's own choice
    /// (torch-fsdp1: the original parameters). Read only with data parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flat_params: Option<bool>,
    /// Under a ZeRO stage, the parameters of each rank's optimizer partition packed into one contiguous buffer
    /// they are views of (true) or kept as separate tensors (false), where a framework offers the choice (torch's
    /// ZeroRedundancyOptimizer `parameters_as_bucket_view`: the updated partitions broadcast as whole buckets
    /// instead of parameter by parameter); the same result either way. Absent: the target's own choice
    /// (torch-ddp: separate tensors). Read only with a ZeRO stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_buckets: Option<bool>,
    /// Parameters of at most this many elements kept whole on every data-parallel rank while the larger ones
    /// are partitioned, where a framework offers it (DeepSpeed ZeRO-3's `stage3_param_persistence_threshold`:
    /// persistent parameters are never gathered or released, and their gradients take another path to the
    /// optimizer's partition); the same result either way. Absent: the target's own choice (deepspeed-zero:
    /// every parameter partitioned). Read only with ZeRO stage 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist_below: Option<u32>,
    /// Elements per optimizer sub-group: each rank's partition flattened and stepped in groups of about this
    /// many elements (whole parameters: a group closes once it reaches the size), where a framework offers it
    /// (DeepSpeed ZeRO-3's `sub_group_size`, which also bounds what is offloaded and checked for overflow at
    /// once); the same result either way. Absent: the target's own choice (DeepSpeed: one group). Read only
    /// with ZeRO stage 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_sub_group: Option<u32>,
    /// After the forward, the parameters resharded over groups of this many data-parallel ranks instead of the
    /// whole sharding group (each group holds a whole copy), so that the backward's all-gather spans one group,
    /// where a framework offers it: FSDP2's `reshard_after_forward=N`, DeepSpeed ZeRO++'s hierarchical
    /// partitioning (`zero_hpz_partition_size`: a secondary partition of the parameters per group). The same
    /// result either way. Absent: the target's own choice. Divides dp; read only with ZeRO stage 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard_group: Option<u32>,
    /// Elements of parameters gathered ahead of their use, in the order the first step traced, where a
    /// framework offers it (DeepSpeed ZeRO-3's `stage3_prefetch_bucket_size`; 0: each parameter gathered only
    /// when its module runs). The same result either way. Absent: the target's own choice. Read only with ZeRO
    /// stage 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_bucket: Option<u32>,
    /// At most this many elements of gathered parameters alive on a rank before the framework releases some,
    /// where a framework offers it (DeepSpeed ZeRO-3's `stage3_max_live_parameters`). The same result either
    /// way. Absent: the target's own choice. Read only with ZeRO stage 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_live_parameters: Option<u32>,
    /// A gathered parameter used again within this many parameters' uses is kept instead of released, where a
    /// framework offers it (DeepSpeed ZeRO-3's `stage3_max_reuse_distance`; 0: released after every use, so a
    /// tied embedding is gathered again for the head). The same result either way. Absent: the target's own
    /// choice. Read only with ZeRO stage 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reuse_distance: Option<u32>,
    /// The blocks checkpointed (`model.activation_checkpointing`) by the framework's own activation checkpoint
    /// instead of torch's, where a framework offers one (DeepSpeed's `deepspeed.checkpointing.checkpoint` /
    /// `non_reentrant_checkpoint`), keeping each block's inputs until the backward as this says. The same
    /// result either way. Absent: torch's checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_checkpoint: Option<FrameworkCheckpoint>,
    /// Micro-batches per step (pipeline parallel and gradient accumulation inside a step).
    #[serde(default = "one")]
    pub microbatches: u32,
    #[serde(default)]
    pub pipeline_schedule: PipelineSchedule,
    /// Model chunks each pipeline rank holds under the `interleaved` schedule (Megatron's virtual
    /// pipeline size, Colossal-AI's `num_model_chunks`): the layers split into pp × this many
    /// consecutive chunks, chunk c on rank c mod pp. 1 for every other schedule.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub virtual_stages: u32,
    /// Order of the mesh axes from fastest-varying rank to slowest, e.g. "tp-cp-dp-pp".
    #[serde(default)]
    pub rank_order: RankOrder,
}

/// How a framework's own activation checkpoint keeps a checkpointed block's inputs until the backward
/// (DeepSpeed's `activation_checkpointing` settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FrameworkCheckpoint {
    /// As they are (no partitioning, no host copy).
    Plain,
    /// Partitioned over the model-parallel group (`partition_activations`).
    Partition,
    /// Moved to host memory (`cpu_checkpointing`).
    Cpu,
    /// Partitioned and moved to host memory.
    PartitionCpu,
    /// Partitioned into one contiguous buffer per input, sized for every checkpoint of the forward
    /// (`contiguous_memory_optimization` with `number_checkpoints`).
    Contiguous,
}

impl FrameworkCheckpoint {
    pub const ALL: [FrameworkCheckpoint; 5] = [Self::Plain, Self::Partition, Self::Cpu, Self::PartitionCpu, Self::Contiguous];

    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Partition => "partition",
            Self::Cpu => "cpu",
            Self::PartitionCpu => "partition_cpu",
            Self::Contiguous => "contiguous",
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

impl Default for Parallel {
    fn default() -> Self {
        Parallel {
            dp: 1,
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
            sequence_parallel: false,
            sequence_parallel_mode: SequenceParallelMode::SplitGather,
            zero_stage: 0,
            zero_offload: false,
            vocab_loss: VocabLoss::TargetDefault,
            reduce_bucket: None,
            overlap_comm: None,
            reduce_scatter: None,
            grad_predivide: None,
            sum_collectives: None,
            explicit_grad_divide: None,
            contiguous_grads: None,
            round_robin_grads: None,
            zero_shard_group: None,
            reduce_to_owner: None,
            overlap_param_gather: None,
            sync_every_microbatch: None,
            zero_bubble: None,
            dual_pipe: None,
            ulysses_mpu: None,
            cp_all_to_all: None,
            tp_overlap_comm: None,
            auto_ep: None,
            breadth_first: None,
            param_shard_dim: None,
            static_graph: None,
            find_unused: None,
            flat_params: None,
            param_buckets: None,
            persist_below: None,
            optimizer_sub_group: None,
            reshard_group: None,
            vocab_divisible_by: None,
            prefetch_bucket: None,
            max_live_parameters: None,
            max_reuse_distance: None,
            framework_checkpoint: None,
            microbatches: 1,
            pipeline_schedule: PipelineSchedule::Gpipe,
            virtual_stages: 1,
            rank_order: RankOrder::default(),
        }
    }
}

impl Parallel {
    /// Number of ranks: the product of the mesh axes (ep is carved out of dp).
    pub fn world(&self) -> u64 {
        self.dp as u64 * self.tp as u64 * self.pp as u64 * self.cp as u64
    }

    /// Whether `other` has the same mesh degrees, micro-batches and pipeline schedule: what decides the world and
    /// each rank's share of the data, which a resumed layout (`Train::resume_parallel`) keeps.
    pub fn same_degrees(&self, other: &Parallel) -> bool {
        let key = |p: &Parallel| (p.dp, p.tp, p.pp, p.cp, p.ep, p.microbatches, p.pipeline_schedule, p.virtual_stages);
        key(self) == key(other)
    }

    /// Whether a run saved in layout `saved` may resume into `self`: the same world, expert degree, micro-batches and
    /// schedule; the data-, tensor-, context- and pipeline-parallel degrees may trade against each other (a target
    /// whose checkpoint reshards across them splits the data and the blocks anew).
    pub fn resumable_from(&self, saved: &Parallel) -> bool {
        let key = |p: &Parallel| (p.world(), p.ep, p.microbatches, p.pipeline_schedule, p.virtual_stages);
        key(self) == key(saved)
    }

    /// The fields, by their JSON names, whose values differ between `self` and `other` (an absent one reads as null).
    pub fn differing_fields(&self, other: &Parallel) -> Vec<String> {
        let (a, b) = (self.json_fields(), other.json_fields());
        let mut names: Vec<String> = a.keys().chain(b.keys()).cloned().collect();
        names.sort();
        names.dedup();
        names.retain(|n| a.get(n) != b.get(n));
        names
    }

    /// `self` with its field `name` (JSON name) set to `other`'s value of it.
    pub fn with_field_of(&self, other: &Parallel, name: &str) -> Parallel {
        let mut fields = self.json_fields();
        match other.json_fields().remove(name) {
            Some(v) => fields.insert(name.to_string(), v),
            None => fields.remove(name),
        };
        serde_json::from_value(serde_json::Value::Object(fields)).unwrap_or_else(|_| self.clone())
    }

    /// The JSON value of the field `name` (JSON name), None where it is absent (unset).
    pub fn json_field(&self, name: &str) -> Option<serde_json::Value> {
        self.json_fields().remove(name)
    }

    fn json_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        }
    }

    pub fn degree(&self, axis: Axis) -> u32 {
        match axis {
            Axis::Tp => self.tp,
            Axis::Cp => self.cp,
            Axis::Dp => self.dp,
            Axis::Pp => self.pp,
        }
    }
}

/// Sequence parallelism's realisation: `split_gather` (Megatron's: all-gather the sequence before the
/// column-parallel linears, reduce-scatter after the row-parallel ones), `ring` (the same with ring
/// all-gather-matmul), `all_to_all` (DeepSpeed Ulysses: sequence-split to head-split around attention).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SequenceParallelMode {
    #[default]
    SplitGather,
    Ring,
    AllToAll,
}

impl SequenceParallelMode {
    pub const ALL: [SequenceParallelMode; 3] = [Self::SplitGather, Self::Ring, Self::AllToAll];

    pub fn is_default(&self) -> bool {
        *self == Self::SplitGather
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::SplitGather => "split_gather",
            Self::Ring => "ring",
            Self::AllToAll => "all_to_all",
        }
    }
}

/// How the loss meets a tensor-parallel LM head: `sharded`, each rank's vocabulary shard of the logits
/// goes into a vocabulary-parallel cross-entropy (Colossal-AI's `parallel_output=True`, the plugin's
/// default; torch's `loss_parallel`); `gathered`, the logits are all-gathered over the vocabulary first
/// (`parallel_output=False`; a replicated LM-head output). `target_default` (the field absent): each
/// target's own choice (torch-tp sharded, colossalai-hybrid gathered). Targets with one realisation run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VocabLoss {
    #[default]
    TargetDefault,
    Gathered,
    Sharded,
}

impl VocabLoss {
    pub const ALL: [VocabLoss; 3] = [Self::TargetDefault, Self::Gathered, Self::Sharded];

    pub fn is_default(&self) -> bool {
        *self == Self::TargetDefault
    }
}

/// The order a pipeline runs its micro-batches in: `gpipe` (every forward, then every backward),
/// `1f1b` (one forward, one backward after a warm-up), `interleaved` (1F1B over `virtual_stages`
/// model chunks per rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PipelineSchedule {
    #[default]
    Gpipe,
    #[serde(rename = "1f1b")]
    OneFOneB,
    Interleaved,
}

impl PipelineSchedule {
    pub const ALL: [PipelineSchedule; 3] = [Self::Gpipe, Self::OneFOneB, Self::Interleaved];
}

/// A mesh axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Axis {
    Tp,
    Cp,
    Dp,
    Pp,
}

impl Axis {
    pub const ALL: [Axis; 4] = [Axis::Tp, Axis::Cp, Axis::Dp, Axis::Pp];
    pub fn name(self) -> &'static str {
        match self {
            Axis::Tp => "tp",
            Axis::Cp => "cp",
            Axis::Dp => "dp",
            Axis::Pp => "pp",
        }
    }
}

/// A permutation of the four mesh axes, written "tp-cp-dp-pp" (first = fastest-varying in the rank id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RankOrder(pub [Axis; 4]);

impl Default for RankOrder {
    fn default() -> Self {
        RankOrder([Axis::Tp, Axis::Cp, Axis::Dp, Axis::Pp])
    }
}

impl std::fmt::Display for RankOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.0.iter().map(|a| a.name()).collect();
        f.write_str(&names.join("-"))
    }
}

impl std::str::FromStr for RankOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('-').collect();
        let rule = "must be a permutation of tp, cp, dp, pp joined by '-', e.g. \"tp-cp-dp-pp\"";
        if parts.len() != 4 {
            return Err(format!("{rule} (got \"{s}\")"));
        }
        let mut axes = [Axis::Tp; 4];
        for (slot, part) in axes.iter_mut().zip(&parts) {
            *slot = Axis::ALL.into_iter().find(|a| a.name() == *part).ok_or_else(|| format!("{rule} (got \"{s}\")"))?;
        }
        let mut sorted = axes;
        sorted.sort();
        if sorted != Axis::ALL {
            return Err(format!("{rule} (got \"{s}\")"));
        }
        Ok(RankOrder(axes))
    }
}

impl Serialize for RankOrder {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for RankOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for RankOrder {
    fn schema_name() -> String {
        "RankOrder".into()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            string: Some(Box::new(schemars::schema::StringValidation {
                pattern: Some("^(tp|cp|dp|pp)-(tp|cp|dp|pp)-(tp|cp|dp|pp)-(tp|cp|dp|pp)$".into()),
                ..Default::default()
            })),
            ..Default::default()
        }
        .into()
    }
}

/// Where a global rank sits on each mesh axis, and the groups it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mesh {
    pub order: RankOrder,
    /// Degrees in `order`.
    pub dims: [usize; 4],
}

impl Mesh {
    pub fn new(p: &Parallel) -> Mesh {
        let order = p.rank_order;
        let dims = order.0.map(|a| p.degree(a) as usize);
        Mesh { order, dims }
    }

    pub fn world(&self) -> usize {
        self.dims.iter().product()
    }

    fn slot(&self, axis: Axis) -> usize {
        self.order.0.iter().position(|a| *a == axis).expect("axis in order")
    }

    fn stride(&self, slot: usize) -> usize {
        self.dims[..slot].iter().product()
    }

    /// Coordinate of `rank` along `axis`.
    pub fn coord(&self, rank: usize, axis: Axis) -> usize {
        let s = self.slot(axis);
        (rank / self.stride(s)) % self.dims[s]
    }

    /// Global ranks of the group along `axis` that contains `rank`, in axis order.
    pub fn group(&self, rank: usize, axis: Axis) -> Vec<usize> {
        let s = self.slot(axis);
        let stride = self.stride(s);
        let base = rank - self.coord(rank, axis) * stride;
        (0..self.dims[s]).map(|i| base + i * stride).collect()
    }

    /// The rank with the same coordinates as `rank` except `axis`, which is set to `value`.
    pub fn with_coord(&self, rank: usize, axis: Axis, value: usize) -> usize {
        let s = self.slot(axis);
        let stride = self.stride(s);
        rank - self.coord(rank, axis) * stride + value * stride
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_order_round_trips_and_rejects_bad_orders() {
        let o: RankOrder = "dp-tp-pp-cp".parse().unwrap();
        assert_eq!(o.to_string(), "dp-tp-pp-cp");
        assert!("tp-tp-dp-pp".parse::<RankOrder>().is_err());
        assert!("tp-dp-pp".parse::<RankOrder>().is_err());
    }

    #[test]
    fn mesh_groups_follow_rank_order() {
        let p = Parallel { dp: 2, tp: 2, pp: 2, ..Parallel::default() };
        let m = Mesh::new(&p);
        // tp fastest: ranks 0,1 share dp=0,pp=0
        assert_eq!(m.group(0, Axis::Tp), vec![0, 1]);
        assert_eq!(m.group(1, Axis::Dp), vec![1, 3]);
        assert_eq!(m.group(5, Axis::Pp), vec![1, 5]);
        assert_eq!(m.coord(6, Axis::Pp), 1);
        let p2 = Parallel { rank_order: "dp-tp-cp-pp".parse().unwrap(), ..p };
        let m2 = Mesh::new(&p2);
        assert_eq!(m2.group(0, Axis::Dp), vec![0, 1]);
        assert_eq!(m2.group(0, Axis::Tp), vec![0, 2]);
        assert_eq!(m2.with_coord(0, Axis::Pp, 1), 4);
    }
}
