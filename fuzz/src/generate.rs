//! Random valid cases from `arbitrary::Unstructured`: the default distribution is small (a case runs
//! in well under a millisecond) and makes non-divisible sizes common, since that is what we fuzz.

use arbitrary::{Result, Unstructured};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardfuzz_harnesses::case::{
    Activation, Case, Data, Distribution, IgnorePattern, Ignored, LayerKind, Limits, Model, MoeConfig, NormKind, OpCase, OpKind, Optimizer,
    OptimizerKind, Parallel, PipelineSchedule, Placement, RankOrder, Real, SequenceParallelMode, Train, VocabLoss, MIN_HIDDEN,
};
use shardfuzz_kernels::DType;

fn pick<T: Copy>(u: &mut Unstructured, items: &[T]) -> Result<T> {
    Ok(*u.choose(items)?)
}

/// A small power of two or a small odd number: degrees that divide sizes, and ones that do not.
fn degree(u: &mut Unstructured, max: u32) -> Result<u32> {
    let d = pick(u, &[1, 1, 1, 2, 2, 2, 3, 4])?;
    Ok(d.min(max))
}

fn parallel(u: &mut Unstructured, op: bool) -> Result<Parallel> {
    let tp = degree(u, 4)?;
    let dp = degree(u, (8 / tp).max(1))?;
    let pp = if op { 1 } else { degree(u, (8 / (tp * dp)).clamp(1, 3))? };
    let ep = if dp > 1 && u.ratio(1, 4)? { pick(u, &[1, dp])? } else { 1 };
    let mut order = RankOrder::default();
    if u.ratio(1, 4)? {
        let axes = &mut order.0;
        let i = u.int_in_range(0..=3)?;
        let j = u.int_in_range(0..=3)?;
        axes.swap(i, j);
    }
    Ok(Parallel {
        dp,
        tp,
        pp,
        cp: 1,
        ep,
        sequence_parallel: tp > 1 && u.ratio(1, 3)?,
        // Other realisations come from the `sequence-parallel-mode` mutator (an extra draw here would
        // change every generated case after it, and with it the benchmarks' fixed case streams).
        sequence_parallel_mode: SequenceParallelMode::SplitGather,
        zero_stage: if dp > 1 && (ep == 1 || u.ratio(1, 10)?) { u.int_in_range(0..=3)? } else { 0 },
        // (Offloading comes from the `zero-offload` mutator, for the reason given above.)
        zero_offload: false,
        // (The loss's realisation comes from the `vocab-loss` mutator, for the reason given above.)
        vocab_loss: VocabLoss::TargetDefault,
        // (How the gradient reduction is carried out comes from the `reduce-bucket`, `overlap-comm`,
        // `reduce-scatter` and `grad-predivide` mutators.)
        reduce_bucket: None,
        overlap_comm: None,
        reduce_scatter: None,
        grad_predivide: None,
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
        persist_below: None,
        optimizer_sub_group: None,
        reshard_group: None,
        vocab_divisible_by: None,
        prefetch_bucket: None,
        max_live_parameters: None,
        max_reuse_distance: None,
        framework_checkpoint: None,
        static_graph: None,
        sum_collectives: None,
        explicit_grad_divide: None,
        find_unused: None,
        flat_params: None,
        param_buckets: None,
        microbatches: if u.ratio(1, 2)? { 1 } else { u.int_in_range(1..=(8 / dp).clamp(1, 4))? },
        pipeline_schedule: pick(u, &[PipelineSchedule::Gpipe, PipelineSchedule::OneFOneB])?,
        // (Interleaving comes from the `schedule` mutator, for the reason given above.)
        virtual_stages: 1,
        rank_order: order,
    })
}

/// A model for `p`: mostly sized so the configuration is supported (heads a multiple of tp, a batch
/// that every micro-batch gets rows of), sometimes not, so clean rejections stay covered.
fn model(u: &mut Unstructured, p: &Parallel, accumulation: u32) -> Result<Model> {
    let fits = u.ratio(9, 10)?;
    let heads = if fits { p.tp * u.int_in_range(1..=2)? } else { u.int_in_range(1..=4)? };
    let head_dim = u.int_in_range(MIN_HIDDEN.div_ceil(heads)..=MIN_HIDDEN)?;
    let divisors: Vec<u32> = (1..=heads).filter(|d| heads % d == 0).collect();
    let kv_heads = pick(u, &divisors)?;
    let need = p.dp * p.microbatches * accumulation;
    let batch = if fits { need + u.int_in_range(0..=need.min(3))? } else { u.int_in_range(1..=4)? };
    let n_layers = u.int_in_range(0..=3)?;
    let mut layers = vec![];
    for _ in 0..n_layers {
        layers.push(pick(u, &[LayerKind::Attention, LayerKind::Attention, LayerKind::Mlp, LayerKind::Mlp, LayerKind::Moe])?);
    }
    let experts = u.int_in_range(1..=4)?;
    let moe = layers.contains(&LayerKind::Moe).then_some(MoeConfig {
        experts,
        top_k: u.int_in_range(1..=experts)?,
        capacity_factor: Real(pick(u, &[0.5, 1.0, 1.25, 2.0])?),
        aux_loss: None,
        pad_to_capacity: false,
        // (Renormalised gates come from the `moe-routing` and `moe-renormalize` mutators, for the reason given in
        // `parallel`.)
        renormalize: false,
        // (So do shared experts, from `moe-shared-expert`.)
        shared_ffn: None,
        shared_gate: false,
    });
    Ok(Model {
        vocab: u.int_in_range(2..=32)?,
        hidden: heads * head_dim,
        ffn: u.int_in_range(1..=16)?,
        heads,
        kv_heads,
        seq: u.int_in_range(1..=6)?,
        batch,
        layers,
        norm: pick(u, &[NormKind::Layernorm, NormKind::Rmsnorm])?,
        activation: pick(u, &[Activation::Gelu, Activation::Swiglu])?,
        bias: u.ratio(3, 4)?,
        tied_embeddings: u.ratio(1, 4)?,
        // (Sparse embedding gradients come from the `sparse-embedding` mutator.)
        sparse_embedding: false,
        activation_checkpointing: None,
        layer_passes: 1,
        moe,
        // (Another transformers model class comes from the `hf-model` mutator.)
        hf_model: None,
        // (Rotary position embeddings come from the `rotary` mutator.)
        rotary_base: None,
        qk_norm: false,
    })
}

fn placement(u: &mut Unstructured) -> Result<Placement> {
    pick(u, &[Placement::Replicate, Placement::Replicate, Placement::Shard(0), Placement::Shard(1), Placement::PARTIAL])
}

fn op(u: &mut Unstructured) -> Result<OpCase> {
    let kind = pick(u, &OpKind::ALL)?;
    let shape: Vec<u32> = (0..kind.shape_len()).map(|_| u.int_in_range(1..=8)).collect::<Result<_>>()?;
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let mut placements = std::collections::BTreeMap::new();
    for (name, s) in kind.inputs(&dims) {
        if u.ratio(2, 3)? {
            let mut p = vec![placement(u)?, placement(u)?];
            for x in &mut p {
                if let Placement::Shard(d) = x {
                    *d = (*d).min(s.len() - 1);
                }
            }
            placements.insert(name.to_string(), p);
        }
    }
    let new_shape = (kind == OpKind::Reshape).then(|| {
        let n = shape[0] * shape[1];
        let divisors: Vec<u32> = (1..=n).filter(|d| n % d == 0).collect();
        let a = *u.choose(&divisors).unwrap_or(&1);
        vec![a, n / a]
    });
    Ok(OpCase { kind, shape, dim: Some(u.int_in_range(0..=1)?), new_shape, placements })
}

fn train(u: &mut Unstructured) -> Result<Train> {
    let dtype = pick(u, &[DType::F64, DType::F64, DType::F32, DType::F32, DType::BF16, DType::BF16, DType::F16])?;
    let kind = pick(u, &[OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::Adamw])?;
    let lr = pick(u, &[1e-3, 1e-2, 3e-2, 1e-1])?;
    let mut opt = Optimizer::sgd(lr);
    opt.kind = kind;
    if u.ratio(1, 3)? {
        opt.weight_decay = Real(pick(u, &[0.01, 0.1])?);
    }
    Ok(Train {
        steps: u.int_in_range(1..=2)?,
        optimizer: opt,
        clip_grad_norm: if u.ratio(1, 3)? { Some(Real(pick(u, &[0.1, 0.5, 1.0, 10.0])?)) } else { None },
        clip_norm_type: None,
        grad_accumulation: pick(u, &[1, 1, 1, 2, 3])?,
        dtype,
        reduce_dtype: if dtype != DType::F64 && u.ratio(1, 5)? { Some(DType::F32) } else { None },
        grad_accum_dtype: None,
        master_dtype: None,
        loss_scale: if dtype == DType::F16 && u.ratio(1, 2)? { Some(Real(pick(u, &[128.0, 1024.0, 65536.0])?)) } else { None },
        resume_after: None,
        checkpoint_layout: None,
        resume_parallel: None,
        frozen: vec![],
        per_token_loss: false,
        local_mean_loss: false,
        compiled: false,
        label_smoothing: None,
    })
}

/// The label smoothings ε generation and the `label-smoothing` mutator draw.
pub const LABEL_SMOOTHINGS: [f64; 4] = [0.05, 0.1, 0.2, 0.5];

/// A random valid case.
pub fn arbitrary_case(u: &mut Unstructured) -> Result<Case> {
    let is_op = u.ratio(15, 100)?;
    let parallel = parallel(u, is_op)?;
    let train = train(u)?;
    let (model, op) = if is_op { (None, Some(op(u)?)) } else { (Some(model(u, &parallel, train.grad_accumulation)?), None) };
    let mut case = Case {
        schema: 1,
        name: None,
        parallel,
        model,
        op,
        library_op: None,
        train,
        data: Data {
            seed: u.arbitrary()?,
            distribution: pick(
                u,
                &[
                    Distribution::Normal,
                    Distribution::Normal,
                    Distribution::Normal,
                    Distribution::Uniform,
                    Distribution::Large,
                    Distribution::Tiny,
                    Distribution::Outliers,
                    Distribution::Integers,
                ],
            )?,
            // Drawn last, so the fields before it are those of a case without it.
            ignored: if is_op { None } else { ignored(u)? },
            // One model case in eight: a class-weighted loss.
            class_weights: !is_op && u.ratio(1, 8)?,
        },
    };
    // Drawn after everything else, so the fields above are those of a case without it: one model case
    // in sixteen without class weights smooths its labels.
    if !is_op && !case.data.class_weights && u.ratio(1, 16)? {
        case.train.label_smoothing = Some(Real(pick(u, &LABEL_SMOOTHINGS)?));
    }
    case.validate(&Limits::default()).map_err(|_| arbitrary::Error::IncorrectFormat)?;
    Ok(case)
}

/// Ignored targets in about one model case in six: scattered or padding, a tenth to nine tenths.
pub fn ignored(u: &mut Unstructured) -> Result<Option<Ignored>> {
    if u.ratio(5, 6)? {
        return Ok(None);
    }
    let fraction = pick(u, &[0.1, 0.25, 0.5, 0.9])?;
    let pattern = pick(u, &IgnorePattern::ALL)?;
    Ok(Some(Ignored { fraction: fraction.into(), pattern }))
}

/// A random valid case from a seed (deterministic).
pub fn random_case(seed: u64) -> Case {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    loop {
        let mut bytes = vec![0u8; 512];
        rng.fill_bytes(&mut bytes);
        if let Ok(c) = arbitrary_case(&mut Unstructured::new(&bytes)) {
            return c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_cases_are_valid_deterministic_and_varied() {
        let mut nondiv = 0;
        let mut ops = 0;
        for seed in 0..10_000 {
            let c = random_case(seed);
            c.validate(&Limits::default()).unwrap();
            assert!(c.world() <= 8 * 3);
            if let Some(m) = &c.model {
                if c.parallel.tp > 1 && m.ffn % c.parallel.tp != 0 {
                    nondiv += 1;
                }
            } else {
                ops += 1;
            }
        }
        assert_eq!(random_case(42), random_case(42));
        assert!(nondiv > 500, "non-divisible ffn cases: {nondiv}");
        assert!((800..2500).contains(&ops), "op cases: {ops}");
    }
}
