//! Bugs that can be injected into the native target (`--inject NAME`), each modelled on a real bug
//! class and each firing only in its own region of configurations.

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
}

impl Bug {
    pub const ALL: [Bug; 17] = [
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
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Bug::RowParallelBiasEveryRank => "row-parallel linear adds its bias on every TP rank before the all-reduce (tp > 1, bias on)",
            Bug::SpNormGradNotReduced => {
                "norm weight/bias and row-parallel bias gradients not all-reduced over TP under sequence parallelism"
            }
            Bug::ClipLocalNorm => "gradient clipping uses the norm of the local shard instead of the global norm",
            Bug::DpAverageWorld => "data-parallel gradients averaged over the world size instead of the DP group size",
            Bug::VocabPadUnmasked => "vocab-parallel cross-entropy does not mask the padded vocab entries (vocab % tp != 0)",
            Bug::ZeroPadInNorm => "ZeRO partition padding holds stale values that are counted in the gradient norm",
            Bug::ZeroPartitionOffset => "ZeRO partition offsets use floor(numel / dp) when numel is not divisible",
            Bug::RingRemainderLost => "ring all-reduce drops the remainder chunk when numel % group size != 0",
            Bug::AccumLossNotDivided => "loss not divided by the gradient-accumulation steps",
            Bug::PipelineDropsLastMicrobatch => "the last micro-batch is dropped when the batch does not divide into micro-batches",
            Bug::GqaKvNotReplicated => "with kv_heads < tp, ranks pick kv head rank % kv_heads instead of replicating the right one",
            Bug::AttnScaleLocalHeads => "attention softmax scaled by 1/sqrt(hidden / local heads) instead of 1/sqrt(head_dim)",
            Bug::F16OverflowNotAgreed => "the loss-scaling overflow check is local: ranks disagree on skipping the step",
            Bug::CollectiveNonEmptyOnly => "the MLP all-reduce is issued only by ranks with a non-empty FFN shard (a hang)",
            Bug::EmptyShardIndexed => "the first element of the FFN bias shard is read even when the shard is empty (a crash)",
            Bug::MoeSplitSizesDropped => "MoE all-to-all sends tokens the capacity dropped, misaligning the combine",
            Bug::TiedEmbeddingGradNotReduced => "tied embedding gradients not all-reduced between the first and last pipeline stage",
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
