//! The inputs of a case, generated once and deterministically from `data.seed` on the Rust side:
//! token ids, targets, initial parameters (or op inputs), all rounded to the case dtype. Every target
//! receives these same values.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardfuzz_kernels::DType;

use crate::case::{Case, Distribution, IgnorePattern, Ignored, OpKind, ParamRole};
use crate::tensor::Tensor;

/// Everything a target needs besides the case itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    /// Token ids, `[batch * seq]` (model cases) or the ids of an embedding op.
    pub tokens: Vec<usize>,
    /// Next-token targets, `[batch * seq]` (model cases) or the targets of a cross-entropy op;
    /// [`IGNORED`] where the loss ignores the position (`data.ignored`).
    pub targets: Vec<usize>,
    /// Initial parameters in [`crate::case::Model::params`] order (model cases), or the op's float
    /// inputs followed by `"grad_out"`, the upstream gradient of the op's output (op cases).
    pub tensors: Vec<(String, Tensor)>,
    /// The loss weight of each vocabulary entry (`data.class_weights`); empty: every target weighs 1.
    pub class_weights: Vec<f64>,
}

/// The target of a position the loss ignores (written as -100 for the workers, torch's
/// `ignore_index`): its loss and its logits' gradient are zero, and it is not counted in the mean.
pub const IGNORED: usize = shardfuzz_kernels::IGNORED_TARGET;

/// The label the workers receive for an ignored target.
pub const IGNORE_INDEX: i64 = -100;

/// Marks `data.ignored`'s targets, from their own stream of the data seed (so the other inputs do
/// not move when the field is added); at least one target always counts.
fn ignore_targets(targets: &mut [usize], ig: &Ignored, seq: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_0000_1a9e_0e0d);
    let f = ig.fraction.get();
    match ig.pattern {
        IgnorePattern::Scattered => targets.iter_mut().for_each(|t| {
            if rng.gen_bool(f.clamp(0.0, 1.0)) {
                *t = IGNORED;
            }
        }),
        IgnorePattern::Padding => {
            let most = ((2.0 * f * seq as f64).round() as usize).min(seq);
            for row in targets.chunks_mut(seq.max(1)) {
                let k = rng.gen_range(0..=most);
                let len = row.len();
                row[len - k.min(len)..].iter_mut().for_each(|t| *t = IGNORED);
            }
        }
    }
    if targets.iter().all(|&t| t == IGNORED) {
        if let Some(first) = targets.first_mut() {
            *first = 0;
        }
    }
}

/// A weight in [0.25, 2] per vocabulary entry, rounded to the case dtype (as a framework holds it), from
/// their own stream of the data seed.
fn class_weights(vocab: usize, dtype: DType, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0c1a_55e5_0000_0001);
    (0..vocab).map(|_| dtype.round(rng.gen_range(0.25..2.0))).collect()
}

impl Inputs {
    /// The loss weight of a target (1 without class weights; 0 when ignored).
    pub fn weight_of(&self, target: usize) -> f64 {
        match (target, self.class_weights.get(target)) {
            (IGNORED, _) => 0.0,
            (_, Some(&w)) => w,
            _ => 1.0,
        }
    }

    /// The loss mean's denominator: the summed weights of the counted targets of the whole batch
    /// (their count without class weights).
    pub fn loss_denominator(&self) -> f64 {
        self.denominator_in(0..self.targets.len())
    }

    /// [`Inputs::loss_denominator`] over the positions `range`.
    pub fn denominator_in(&self, range: std::ops::Range<usize>) -> f64 {
        self.targets[range].iter().map(|&t| self.weight_of(t)).sum()
    }

    /// How many targets the loss counts (every one but the ignored): the mean's denominator.
    pub fn counted_targets(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORED).count()
    }

    /// [`Inputs::counted_targets`] among the positions `range`.
    pub fn counted_in(&self, range: std::ops::Range<usize>) -> usize {
        self.targets[range].iter().filter(|&&t| t != IGNORED).count()
    }

    pub fn generate(case: &Case) -> Inputs {
        if case.library_op.is_some() {
            // The framework's own sample inputs, drawn by its worker from `data.seed`.
            return Inputs { tokens: vec![], targets: vec![], tensors: vec![], class_weights: vec![] };
        }
        let mut rng = ChaCha8Rng::seed_from_u64(case.data.seed);
        let dtype = case.train.dtype;
        let dist = case.data.distribution;
        if let Some(m) = &case.model {
            let v = m.vocab as usize;
            let n = m.tokens();
            let tokens = (0..n).map(|_| rng.gen_range(0..v)).collect();
            let mut targets: Vec<usize> = (0..n).map(|_| rng.gen_range(0..v)).collect();
            if let Some(ig) = &case.data.ignored {
                ignore_targets(&mut targets, ig, m.seq as usize, case.data.seed);
            }
            let tensors = m
                .params()
                .into_iter()
                .map(|p| {
                    let data = (0..p.numel()).map(|_| init_value(&mut rng, p.role, p.fan_in, dist, dtype)).collect();
                    (p.name.clone(), Tensor::new(p.shape.clone(), data))
                })
                .collect();
            let class_weights = if case.data.class_weights { class_weights(v, dtype, case.data.seed) } else { vec![] };
            Inputs { tokens, targets, tensors, class_weights }
        } else {
            let op = case.op.as_ref().expect("validated: model or op");
            let shape: Vec<usize> = op.shape.iter().map(|&d| d as usize).collect();
            let (tokens, targets) = match op.kind {
                OpKind::Embedding => ((0..shape[0]).map(|_| rng.gen_range(0..shape[1])).collect(), vec![]),
                OpKind::CrossEntropy => (vec![], (0..shape[0]).map(|_| rng.gen_range(0..shape[1])).collect()),
                _ => (vec![], vec![]),
            };
            let mut tensors: Vec<(String, Tensor)> = op
                .kind
                .inputs(&shape)
                .into_iter()
                .map(|(name, s)| {
                    let role = if name == "w" && op.kind == OpKind::Layernorm { ParamRole::NormWeight } else { ParamRole::Weight };
                    let fan_in = if op.kind == OpKind::Linear || op.kind == OpKind::Matmul { shape[1] } else { 1 };
                    let n = s.iter().product();
                    let data = (0..n).map(|_| init_value(&mut rng, role, fan_in, dist, dtype)).collect();
                    (name.to_string(), Tensor::new(s, data))
                })
                .collect();
            let out_shape = crate::ops::output_shape(op);
            let n = out_shape.iter().product();
            let data = (0..n).map(|_| dtype.round(std_normal(&mut rng))).collect();
            tensors.push(("grad_out".into(), Tensor::new(out_shape, data)));
            Inputs { tokens, targets, tensors, class_weights: vec![] }
        }
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// A copy with every float input multiplied by (1 + u·ξ), ξ = ±1 at random: the input
    /// perturbation whose effect on the f64 reference estimates the noise level of `dtype` (TTrace).
    pub fn perturbed(&self, dtype: DType, seed: u64) -> Inputs {
        self.perturbed_by(dtype, seed, 1.0)
    }

    /// Like [`Inputs::perturbed`] with a perturbation of `ulps × u`; with 2 u every value rounds to
    /// a neighbour in `dtype`, which gives a second, independently rounded run in that dtype.
    pub fn perturbed_by(&self, dtype: DType, seed: u64, ulps: f64) -> Inputs {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let u = dtype.unit_roundoff() * ulps;
        let mut out = self.clone();
        for (name, t) in &mut out.tensors {
            if name == "grad_out" {
                continue;
            }
            for x in &mut t.data {
                let s = if rng.gen::<bool>() { 1.0 } else { -1.0 };
                *x *= 1.0 + s * u;
            }
        }
        out
    }
}

fn std_normal(rng: &mut ChaCha8Rng) -> f64 {
    // Box–Muller: exact enough and dependency-free.
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn draw(rng: &mut ChaCha8Rng, dist: Distribution) -> f64 {
    match dist {
        Distribution::Normal => std_normal(rng),
        Distribution::Uniform => rng.gen_range(-3f64.sqrt()..3f64.sqrt()),
        Distribution::Large => 8.0 * std_normal(rng),
        Distribution::Tiny => std_normal(rng) * 2f64.powi(-10),
        Distribution::Outliers => {
            let x = std_normal(rng);
            if rng.gen_range(0..50) == 0 {
                32.0 * x
            } else {
                x
            }
        }
        Distribution::Integers => std_normal(rng).round().clamp(-2.0, 2.0),
    }
}

fn init_value(rng: &mut ChaCha8Rng, role: ParamRole, fan_in: usize, dist: Distribution, dtype: DType) -> f64 {
    let x = draw(rng, dist);
    let integers = dist == Distribution::Integers;
    let v = match role {
        ParamRole::Embedding if fan_in <= 1 => x,
        ParamRole::Embedding | ParamRole::Weight | ParamRole::Router | ParamRole::ExpertWeight => {
            if integers {
                x / 4.0
            } else {
                x / (fan_in.max(1) as f64).sqrt()
            }
        }
        ParamRole::Bias | ParamRole::ExpertBias | ParamRole::NormBias => {
            if integers {
                x / 4.0
            } else {
                0.1 * x
            }
        }
        ParamRole::NormWeight => {
            if integers {
                1.0 + x / 4.0
            } else {
                1.0 + 0.1 * x
            }
        }
    };
    dtype.round(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic_rounded_and_seed_dependent() {
        let c = Case::from_json(crate::case::tests::MINIMAL).unwrap();
        let a = Inputs::generate(&c);
        assert_eq!(a, Inputs::generate(&c));
        for (_, t) in &a.tensors {
            assert!(t.data.iter().all(|&x| DType::F32.round(x) == x));
        }
        let mut c2 = c.clone();
        c2.data.seed += 1;
        assert_ne!(a, Inputs::generate(&c2));
        assert!(a.tokens.iter().all(|&t| t < 11));
    }

    #[test]
    fn perturbation_is_relative_unit_roundoff() {
        let c = Case::from_json(crate::case::tests::MINIMAL).unwrap();
        let a = Inputs::generate(&c);
        let p = a.perturbed(DType::BF16, 1);
        let u = DType::BF16.unit_roundoff();
        for ((_, x), (_, y)) in a.tensors.iter().zip(&p.tensors) {
            for (a, b) in x.data.iter().zip(&y.data) {
                assert!((a - b).abs() <= u * a.abs() * 1.0000001);
            }
        }
        assert_ne!(a, p);
    }
}
