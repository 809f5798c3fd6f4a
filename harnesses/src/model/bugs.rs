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

    /// The fault, then (after "when") the region of configurations where it fires. "Reduced
    /// precision" is any dtype but f64; "accumulation" is grad_accumulation > 1.
    pub fn description(self) -> &'static str {
        match self {
            Bug::RowParallelBiasEveryRank => {
                "row-parallel bias added on every TP rank before the reduce-scatter, when sequence parallelism has uneven shards, micro-batches > 1, accumulation, reduced precision"
            }
            Bug::SpNormGradNotReduced => {
                "norm-bias and row-parallel-bias gradients not all-reduced over TP, when sequence parallelism has uneven shards, pp > 1, accumulation, reduced precision"
            }
            Bug::ClipLocalNorm => "gradient clipping uses the local shard's norm, when ZeRO-2 with tp > 1, micro-batches > 1, accumulation",
            Bug::DpAverageWorld => {
                "expert gradients averaged over the world size instead of the DP group size, when ep > 1, micro-batches > 1, accumulation, reduced precision"
            }
            Bug::VocabPadUnmasked => {
                "vocab-parallel cross-entropy does not mask the padded vocab entries, when vocab % tp != 0, sequence parallel, RMSNorm, micro-batches > 1, accumulation, reduced precision"
            }
            Bug::ZeroPadInNorm => {
                "ZeRO partition padding holds stale values counted in the gradient norm, when numel % dp != 0, tp > 1, steps > 1, clipping, RMSNorm, micro-batches > 1"
            }
            Bug::ZeroPartitionOffset => {
                "ZeRO partition offsets use floor(numel / dp), when ZeRO-3, dp >= 3, numel % dp != 0, tp > 1, micro-batches > 1, accumulation"
            }
            Bug::RingRemainderLost => {
                "ring all-reduce drops the remainder chunk, when the group has >= 3 ranks, numel % group size != 0, a reduce dtype of its own, micro-batches > 1, accumulation"
            }
            Bug::AccumLossNotDivided => {
                "loss not divided by the accumulation steps, when accumulation inside a micro-batched pipeline of tensor-parallel RMSNorm stages, reduced precision"
            }
            Bug::PipelineDropsLastMicrobatch => {
                "the last micro-batch is dropped, when a 1F1B pipeline of tensor-parallel SwiGLU/RMSNorm stages has a batch that does not divide into micro-batches, accumulation"
            }
            Bug::GqaKvNotReplicated => {
                "ranks pick kv head rank % kv_heads instead of replicating the right one, when 1 < kv_heads < tp, sequence parallel, micro-batches > 1, accumulation, reduced precision"
            }
            Bug::AttnScaleLocalHeads => {
                "attention scaled by 1/sqrt(hidden / local heads), when grouped-query attention with >= 2 local heads and biases, sequence parallel, micro-batches > 1, accumulation, reduced precision"
            }
            Bug::F16OverflowNotAgreed => "the loss-scaling overflow check is local so ranks disagree on skipping the step, when f16 loss scaling overflows on some ranks",
            Bug::CollectiveNonEmptyOnly => {
                "the MLP reduce-scatter is skipped by ranks with an empty FFN shard (a hang), when ffn < tp, sequence parallel, micro-batches > 1, accumulation"
            }
            Bug::EmptyShardIndexed => "the first element of the FFN bias shard is read even when empty (a crash), when ffn < tp, SwiGLU, micro-batches > 1, reduced precision",
            Bug::MoeSplitSizesDropped => {
                "MoE all-to-all sends tokens the capacity dropped, when ep > 1, top-k > 1, capacity drops tokens, micro-batches > 1, accumulation, reduced precision"
            }
            Bug::TiedEmbeddingGradNotReduced => {
                "tied embedding gradients not all-reduced between first and last stage, when tied embeddings, pp > 1, ZeRO, accumulation, reduced precision"
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
