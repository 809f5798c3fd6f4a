//! Bugs that can be injected into the native target (`--inject NAME`), each modelled on a real bug
//! class and each firing wherever its faulty code runs with an effect (its natural region).

/// An injectable fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bug {
    RowParallelBiasEveryRank,
    SpNormGradNotReduced,
    ClipLocalNorm,
    DpAverageWorld,
    VocabPadUnmasked,
    ZeroPadInNorm,
    ZeroPartitionOffset,
    RingRemainderLost,
    AccumLossNotDivided,
    PipelineDropsLastMicrobatch,
    GqaKvNotReplicated,
    AttnScaleLocalHeads,
    F16OverflowNotAgreed,
    CollectiveNonEmptyOnly,
    EmptyShardIndexed,
    MoeSplitSizesDropped,
    TiedEmbeddingGradNotReduced,
    LossMeanPerMicrobatch,
    ExpertGradsWrongGroup,
    GradsDowncastBeforeReduce,
    TiedGradsReducedAfterNorm,
    AuxLossLocalTokens,
}

impl Bug {
    pub const ALL: [Bug; 22] = [
        Bug::RowParallelBiasEveryRank,
        Bug::SpNormGradNotReduced,
        Bug::ClipLocalNorm,
        Bug::DpAverageWorld,
        Bug::VocabPadUnmasked,
        Bug::ZeroPadInNorm,
        Bug::ZeroPartitionOffset,
        Bug::RingRemainderLost,
        Bug::AccumLossNotDivided,
        Bug::PipelineDropsLastMicrobatch,
        Bug::GqaKvNotReplicated,
        Bug::AttnScaleLocalHeads,
        Bug::F16OverflowNotAgreed,
        Bug::CollectiveNonEmptyOnly,
        Bug::EmptyShardIndexed,
        Bug::MoeSplitSizesDropped,
        Bug::TiedEmbeddingGradNotReduced,
        Bug::LossMeanPerMicrobatch,
        Bug::ExpertGradsWrongGroup,
        Bug::GradsDowncastBeforeReduce,
        Bug::TiedGradsReducedAfterNorm,
        Bug::AuxLossLocalTokens,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::RowParallelBiasEveryRank => "row-parallel-bias-every-rank",
            Bug::SpNormGradNotReduced => "sp-norm-grad-not-reduced",
            Bug::ClipLocalNorm => "clip-local-norm",
            Bug::DpAverageWorld => "dp-average-world",
            Bug::VocabPadUnmasked => "vocab-pad-unmasked",
            Bug::ZeroPadInNorm => "zero-pad-in-norm",
            Bug::ZeroPartitionOffset => "zero-partition-offset",
            Bug::RingRemainderLost => "ring-remainder-lost",
            Bug::AccumLossNotDivided => "accum-loss-not-divided",
            Bug::PipelineDropsLastMicrobatch => "pipeline-drops-last-microbatch",
            Bug::GqaKvNotReplicated => "gqa-kv-not-replicated",
            Bug::AttnScaleLocalHeads => "attn-scale-local-heads",
            Bug::F16OverflowNotAgreed => "f16-overflow-not-agreed",
            Bug::CollectiveNonEmptyOnly => "collective-nonempty-only",
            Bug::EmptyShardIndexed => "empty-shard-indexed",
            Bug::MoeSplitSizesDropped => "moe-split-sizes-dropped",
            Bug::TiedEmbeddingGradNotReduced => "tied-embedding-grad-not-reduced",
            Bug::LossMeanPerMicrobatch => "loss-mean-per-microbatch",
            Bug::ExpertGradsWrongGroup => "expert-grads-wrong-group",
            Bug::GradsDowncastBeforeReduce => "grads-downcast-before-reduce",
            Bug::TiedGradsReducedAfterNorm => "tied-grads-reduced-after-norm",
            Bug::AuxLossLocalTokens => "aux-loss-local-tokens",
        }
    }

    /// The fault, then (after "when") the region where it physically manifests: the configurations
    /// whose runs execute the faulty code with an effect. No condition is there for the benchmark's
    /// sake; the test suite checks each one is needed (`trigger_cases::BUG_CASES`).
    pub fn description(self) -> &'static str {
        match self {
            Bug::RowParallelBiasEveryRank => "row-parallel bias added on every TP rank before the reduction, when tp > 1 with biases",
            Bug::SpNormGradNotReduced => {
                "norm-bias and row-parallel-bias gradients not all-reduced over TP, when sequence parallelism with biases (or LayerNorm)"
            }
            Bug::ClipLocalNorm => "gradient clipping uses the local partition's norm, when ZeRO-2/3 partitions the gradients over dp > 1, with clipping",
            Bug::DpAverageWorld => "expert gradients averaged over the world size instead of the DP group size, when ep > 1 and dp < world",
            Bug::VocabPadUnmasked => "vocab-parallel cross-entropy does not mask the padded vocab entries, when vocab % tp != 0",
            Bug::ZeroPadInNorm => "ZeRO partition padding holds stale values counted in the gradient norm, when ZeRO with numel % dp != 0, with clipping",
            Bug::ZeroPartitionOffset => "ZeRO partition offsets use floor(numel / dp), when ZeRO with numel % dp != 0",
            Bug::RingRemainderLost => "ring all-reduce drops the remainder chunk, when a group of >= 3 ranks reduces a buffer whose numel % group size != 0",
            Bug::AccumLossNotDivided => "loss not divided by the accumulation steps, when grad_accumulation > 1",
            Bug::PipelineDropsLastMicrobatch => {
                "the last micro-batch is dropped, when a 1F1B pipeline's batch share does not divide into micro-batches"
            }
            Bug::GqaKvNotReplicated => "ranks pick kv head rank % kv_heads instead of replicating the right one, when 1 < kv_heads < tp",
            Bug::AttnScaleLocalHeads => "attention scaled by 1/sqrt(hidden / local heads) instead of 1/sqrt(head_dim), when tp > 1",
            Bug::F16OverflowNotAgreed => "the loss-scaling overflow check is local so ranks disagree on skipping the step, when f16 loss scaling overflows on some ranks",
            Bug::CollectiveNonEmptyOnly => "the MLP's row-parallel reduction is skipped by ranks with an empty FFN shard (a hang), when ffn < tp",
            Bug::EmptyShardIndexed => "the first element of the FFN bias shard is read even when empty (a crash), when ffn < tp with biases",
            Bug::MoeSplitSizesDropped => "MoE all-to-all sends tokens the capacity dropped, when ep > 1 and capacity drops tokens",
            Bug::TiedEmbeddingGradNotReduced => "tied embedding gradients not all-reduced between first and last stage, when tied embeddings and pp > 1",
            Bug::LossMeanPerMicrobatch => {
                "the loss is averaged over each micro-batch's own counted tokens instead of the global batch's, when the counted tokens do not split evenly over dp x accumulation x micro-batches (uneven rows, or ignored targets)"
            }
            Bug::ExpertGradsWrongGroup => {
                "expert gradients reduced over the data-parallel group instead of the expert-data-parallel one (ranks sum other experts' gradients), when ep > 1"
            }
            Bug::GradsDowncastBeforeReduce => {
                "gradients cast to bf16 for the data-parallel all-reduce, and summed in bf16, ignoring the configured reduce dtype, when dp > 1 without ZeRO-2/3 and the reduce dtype is not bf16"
            }
            Bug::AuxLossLocalTokens => {
                "the MoE load-balancing loss is normalised by the sequence chunk a rank holds instead of the whole sequence (scaled by about the TP degree), when sequence parallelism and an auxiliary loss with top_k < experts (routing every token to every expert makes the loss constant)"
            }
            Bug::TiedGradsReducedAfterNorm => {
                "the tied-embedding gradients are all-reduced between first and last stage after the clipping norm is taken (the norm counts the first stage's partial gradient), when tied embeddings, pp > 1 and clipping, without ZeRO-2/3"
            }
        }
    }

    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// A set of injected bugs (empty by default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bugs(u64);

impl Bugs {
    pub fn none() -> Bugs {
        Bugs(0)
    }
    pub fn with(mut self, b: Bug) -> Bugs {
        self.0 |= 1 << b as u64;
        self
    }
    pub fn has(self, b: Bug) -> bool {
        self.0 & (1 << b as u64) != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// Parses bug names; the error names the unknown one.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Bugs, String> {
        names.iter().try_fold(Bugs::none(), |acc, n| {
            Bug::from_name(n.as_ref()).map(|b| acc.with(b)).ok_or_else(|| format!("unknown bug `{}` (see `shardfuzz bugs`)", n.as_ref()))
        })
    }
}
