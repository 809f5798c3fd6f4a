//! Library-op cases: generation and mutation over the op vocabulary the targets announce (PyTorch's
//! OpInfo names and variants …), meshes of 1 to 3 dimensions, and placements per argument.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardfuzz_harnesses::case::{
    Case, Data, Distribution, Edit, LibraryOp, Optimizer, Parallel, Placement, Reduce, SampleEdit, Train, View, VocabularyEntry,
    MAX_SAMPLE_EDITS, MAX_VIEWS,
};
use shardfuzz_kernels::DType;

/// The ops the campaign's targets can express, with their families.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    pub entries: Vec<VocabularyEntry>,
    families: BTreeMap<String, Vec<usize>>,
}

impl Vocabulary {
    pub fn new(mut entries: Vec<VocabularyEntry>) -> Vocabulary {
        entries.sort();
        entries.dedup();
        let mut families: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            families.entry(e.family.clone()).or_default().push(i);
        }
        Vocabulary { entries, families }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn family_of(&self, op: &LibraryOp) -> Option<&[usize]> {
        let e = self.entries.iter().find(|e| e.name == op.name && e.variant == op.variant)?;
        self.families.get(&e.family).map(|v| v.as_slice())
    }
}

/// Meshes of up to 8 ranks: 1-D, 2-D both ways round (a degree that divides a size and one that
/// does not), 3-D, and size-1 dimensions.
const MESHES: &[&[u32]] = &[&[2], &[3], &[4], &[8], &[2, 2], &[2, 3], &[3, 2], &[2, 4], &[4, 2], &[1, 2], &[2, 1], &[2, 2, 2], &[1, 2, 2]];

/// Tensor arguments a generated case gives placements to (most samples have at most three).
const ARGUMENT_SLOTS: usize = 3;

fn placement(rng: &mut ChaCha8Rng) -> Placement {
    let weighted: [(Placement, u32); 8] = [
        (Placement::Replicate, 6),
        (Placement::Shard(0), 4),
        (Placement::Shard(1), 4),
        (Placement::Shard(2), 2),
        (Placement::PARTIAL, 2),
        (Placement::Partial(Reduce::Avg), 1),
        (Placement::Partial(Reduce::Max), 1),
        (Placement::Partial(Reduce::Min), 1),
    ];
    weighted.choose_weighted(rng, |(_, w)| *w).map(|(p, _)| *p).unwrap_or(Placement::Replicate)
}

fn placements(rng: &mut ChaCha8Rng, mesh_dims: usize) -> Vec<Vec<Placement>> {
    (0..ARGUMENT_SLOTS).map(|_| (0..mesh_dims).map(|_| placement(rng)).collect()).collect()
}

fn dtype(rng: &mut ChaCha8Rng) -> DType {
    *[DType::F64, DType::F64, DType::F32, DType::F32, DType::BF16, DType::F16].choose(rng).expect("nonempty")
}

/// A random library-op case over `vocab` (deterministic in `seed`).
pub fn random_library_case(seed: u64, vocab: &Vocabulary) -> Option<Case> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let e = vocab.entries.choose(&mut rng)?;
    let mesh = MESHES.choose(&mut rng).expect("nonempty").to_vec();
    let op = LibraryOp {
        name: e.name.clone(),
        variant: e.variant.clone(),
        sample: rng.gen_range(0..16),
        placements: placements(&mut rng, mesh.len()),
        sources: vec![],
        mesh,
        backward: rng.gen_ratio(9, 10),
        // (Redistributions come from the `redistribute` mutator: a draw here would change every
        // generated case after it, and with it the benchmarks' fixed case streams.)
        redistribute: vec![],
        views: vec![],
        edits: vec![],
        warmup: vec![],
        cotangent: vec![],
        cotangent_in_dtype: false,
    };
    Some(library_case(op, dtype(&mut rng), rng.gen()))
}

/// A case around `op` (the `parallel` section is unused by library ops: a single device).
pub fn library_case(op: LibraryOp, dtype: DType, seed: u64) -> Case {
    Case {
        schema: 1,
        name: None,
        parallel: Parallel::default(),
        model: None,
        op: None,
        library_op: Some(op),
        train: Train {
            steps: 1,
            optimizer: Optimizer::sgd(0.01),
            clip_grad_norm: None,
            clip_norm_type: None,
            grad_accumulation: 1,
            dtype,
            reduce_dtype: None,
            grad_accum_dtype: None,
            master_dtype: None,
            loss_scale: None,
            resume_after: None,
            checkpoint_layout: None,
            resume_parallel: None,
            frozen: vec![],
            per_token_loss: false,
            local_mean_loss: false,
            compiled: false,
            label_smoothing: None,
        },
        data: Data { seed, distribution: Distribution::Normal, ignored: None, class_weights: false },
    }
}

/// A library-op mutation: returns whether it changed the case.
pub type LibraryMutation = fn(&mut Case, &Vocabulary, &mut ChaCha8Rng) -> bool;

/// Every library-op mutation, by name.
pub const LIBRARY_MUTATIONS: &[(&str, LibraryMutation)] = &[
    ("op-in-family", op_in_family),
    ("op-any", op_any),
    ("sample", sample),
    ("placement", one_placement),
    ("mesh-reshape", mesh_reshape),
    ("backward", toggle_backward),
    ("redistribute", redistribute),
    ("sample-edit", sample_edit),
    ("warmup", warmup),
    ("source", source),
    ("view", view),
    ("cotangent", cotangent),
    ("cotangent-dtype", |c, _, _| {
        lib(c).is_some_and(|op| {
            op.cotangent_in_dtype = !op.cotangent_in_dtype;
            true
        })
    }),
    ("dtype", |c, _, rng| change(&mut c.train.dtype, dtype(rng))),
    ("reseed", |c, _, rng| change(&mut c.data.seed, rng.gen())),
];

fn change<T: PartialEq>(slot: &mut T, value: T) -> bool {
    let changed = *slot != value;
    *slot = value;
    changed
}

fn lib(c: &mut Case) -> Option<&mut LibraryOp> {
    c.library_op.as_mut()
}

fn set_op(c: &mut Case, e: &VocabularyEntry) -> bool {
    let Some(op) = lib(c) else { return false };
    let changed = op.name != e.name || op.variant != e.variant;
    op.name = e.name.clone();
    op.variant = e.variant.clone();
    changed
}

/// Another op of the same family (unary for unary, reduction for reduction): the same sharding
/// rule's neighbours.
fn op_in_family(c: &mut Case, vocab: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(members) = c.library_op.as_ref().and_then(|op| vocab.family_of(op)) else { return false };
    let Some(&i) = members.choose(rng) else { return false };
    let e = vocab.entries[i].clone();
    set_op(c, &e)
}

fn op_any(c: &mut Case, vocab: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(e) = vocab.entries.choose(rng).cloned() else { return false };
    set_op(c, &e)
}

fn sample(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    let next = if rng.gen_bool(0.5) { op.sample.wrapping_add(1) % 64 } else { rng.gen_range(0..64) };
    change(&mut op.sample, next)
}

/// One argument's placement on one mesh dimension.
fn one_placement(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    let dims = op.mesh.len();
    while op.placements.len() < ARGUMENT_SLOTS {
        op.placements.push(vec![Placement::Replicate; dims]);
    }
    let arg = rng.gen_range(0..op.placements.len());
    let m = rng.gen_range(0..dims);
    let p = placement(rng);
    change(&mut op.placements[arg][m], p)
}

/// Another mesh (often the same ranks arranged differently: 2×3 → 3×2 → 6); placements follow
/// dimension by dimension, new dimensions replicated.
fn mesh_reshape(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    let world = op.world();
    let same: Vec<&&[u32]> = MESHES.iter().filter(|m| m.iter().map(|&d| d as u64).product::<u64>() == world).collect();
    let mesh: Vec<u32> = match (rng.gen_bool(0.6), same.choose(rng)) {
        (true, Some(m)) => m.to_vec(),
        _ => MESHES.choose(rng).expect("nonempty").to_vec(),
    };
    for p in op.placements.iter_mut().chain(op.redistribute.iter_mut()).chain(op.sources.iter_mut()) {
        p.resize(mesh.len(), Placement::Replicate);
    }
    if !op.cotangent.is_empty() {
        op.cotangent.resize(mesh.len(), Placement::Replicate);
    }
    change(&mut op.mesh, mesh)
}

/// A redistribution of the outputs appended (to Shard or Replicate on each mesh dimension), or
/// one of the chain's removed.
fn redistribute(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    let dims = op.mesh.len();
    append_or_remove(&mut op.redistribute, shardfuzz_harnesses::case::MAX_REDISTRIBUTIONS, rng, |rng| {
        let to = [Placement::Replicate, Placement::Shard(0), Placement::Shard(1), Placement::Shard(2)];
        (0..dims).map(|_| *to.choose(rng).expect("nonempty")).collect()
    })
}

/// One of `list`'s entries removed (always when it is full, else 30 % of the time), or `make`'s appended.
fn append_or_remove<T>(list: &mut Vec<T>, max: usize, rng: &mut ChaCha8Rng, make: impl FnOnce(&mut ChaCha8Rng) -> T) -> bool {
    let n = list.len();
    if n > 0 && (n >= max || rng.gen_bool(0.3)) {
        list.remove(rng.gen_range(0..n));
    } else {
        let entry = make(rng);
        list.push(entry);
    }
    true
}

/// Where one argument starts on one mesh dimension before it is redistributed to its placement (a
/// partial value reduced into shards, shards gathered, one sharding moved to another); or, now and
/// then, every argument starting at its placement again.
fn source(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    if !op.sources.is_empty() && rng.gen_bool(0.15) {
        op.sources.clear();
        return true;
    }
    let dims = op.mesh.len();
    while op.placements.len() < ARGUMENT_SLOTS {
        op.placements.push(vec![Placement::Replicate; dims]);
    }
    while op.sources.len() < op.placements.len() {
        let at = op.placements[op.sources.len()].clone();
        op.sources.push(at);
    }
    let arg = rng.gen_range(0..op.sources.len());
    let m = rng.gen_range(0..dims);
    let p = placement(rng);
    change(&mut op.sources[arg][m], p)
}

/// Where the cotangents enter on one mesh dimension (sharded, partial by sum or average, or
/// replicated); or, now and then, the gathered output's cotangent again.
fn cotangent(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    if !op.cotangent.is_empty() && rng.gen_bool(0.15) {
        op.cotangent.clear();
        return true;
    }
    let dims = op.mesh.len();
    op.cotangent.resize(dims, Placement::Replicate);
    let to = [
        Placement::Replicate,
        Placement::Shard(0),
        Placement::Shard(1),
        Placement::Shard(2),
        Placement::PARTIAL,
        Placement::Partial(Reduce::Avg),
    ];
    let p = *to.choose(rng).expect("nonempty");
    let m = rng.gen_range(0..dims);
    change(&mut op.cotangent[m], p)
}

/// An output view appended (transpose, permute, flatten, unsqueeze, narrow), or one of them removed.
fn view(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    append_or_remove(&mut op.views, MAX_VIEWS, rng, |rng| *View::ALL.choose(rng).expect("nonempty"))
}

/// A change to one of the sample's own arguments (a dim, a flag, a scalar, an index tensor) appended,
/// or one of the case's edits removed.
fn sample_edit(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    append_or_remove(&mut op.edits, MAX_SAMPLE_EDITS, rng, random_edit)
}

/// One sample edit. Most samples have few editable arguments (the worker takes `arg` modulo their count).
fn random_edit(rng: &mut ChaCha8Rng) -> SampleEdit {
    SampleEdit { arg: rng.gen_range(0..4), edit: *Edit::ALL.choose(rng).expect("nonempty") }
}

/// A warm-up call before the case's own: its edits drawn as the sample edits are (a scalar or a dim of
/// its own), one appended, or one removed.
fn warmup(c: &mut Case, _: &Vocabulary, rng: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    append_or_remove(&mut op.warmup, MAX_SAMPLE_EDITS, rng, random_edit)
}

fn toggle_backward(c: &mut Case, _: &Vocabulary, _: &mut ChaCha8Rng) -> bool {
    let Some(op) = lib(c) else { return false };
    op.backward = !op.backward;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardfuzz_harnesses::case::Limits;

    fn vocab() -> Vocabulary {
        let e = |n: &str, f: &str| VocabularyEntry { name: n.into(), variant: String::new(), family: f.into() };
        Vocabulary::new(vec![e("add", "BinaryUfuncInfo"), e("mul", "BinaryUfuncInfo"), e("sum", "ReductionOpInfo"), e("cumsum", "OpInfo")])
    }

    #[test]
    fn generated_and_mutated_library_cases_are_valid_and_varied() {
        let v = vocab();
        let limits = Limits::default();
        let mut ops = std::collections::BTreeSet::new();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for seed in 0..300 {
            let c = random_library_case(seed, &v).unwrap();
            c.validate(&limits).unwrap();
            ops.insert(c.library_op.as_ref().unwrap().name.clone());
            for (name, f) in LIBRARY_MUTATIONS {
                let mut m = c.clone();
                f(&mut m, &v, &mut rng);
                m.validate(&limits).unwrap_or_else(|e| panic!("{name} broke a case: {e:?}"));
            }
        }
        assert_eq!(ops.len(), 4);
        assert_eq!(random_library_case(7, &v), random_library_case(7, &v));
        assert!(random_library_case(7, &Vocabulary::default()).is_none());
    }

    #[test]
    fn a_family_swap_stays_in_the_family() {
        let v = vocab();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut c = library_case(
            LibraryOp {
                name: "add".into(),
                variant: String::new(),
                sample: 0,
                mesh: vec![2],
                placements: vec![],
                sources: vec![],
                backward: true,
                redistribute: vec![],
                views: vec![],
                edits: vec![],
                warmup: vec![],
                cotangent: vec![],
                cotangent_in_dtype: false,
            },
            DType::F32,
            1,
        );
        for _ in 0..20 {
            op_in_family(&mut c, &v, &mut rng);
            assert!(["add", "mul"].contains(&c.library_op.as_ref().unwrap().name.as_str()));
        }
    }
}
