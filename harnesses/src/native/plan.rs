//! The plan of a native run, shared by every rank: mesh, stages, how the batch is split, which
//! configurations this implementation refuses (cleanly) and why.

use std::ops::Range;

use crate::case::{Axis, Case, LayerKind, Mesh, Model, ParamSpec, PipelineSchedule};
use crate::model::{Bug, Bugs, Layout, Reject};

/// Splits `n` into `parts` sizes that differ by at most one (how batches are split over ranks).
pub fn balanced(n: usize, parts: usize, i: usize) -> Range<usize> {
    let (q, r) = (n / parts, n % parts);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

/// One micro-batch: which global batch rows it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub rows: Range<usize>,
}

pub struct Plan<'a> {
    pub case: &'a Case,
    pub model: &'a Model,
    pub mesh: Mesh,
    pub world: usize,
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    pub ep: usize,
    pub zero: u8,
    pub microbatches: usize,
    pub accumulation: usize,
    pub schedule: PipelineSchedule,
    /// Positions in `blocks` of each virtual pipeline stage: pp × model chunks of them, virtual stage
    /// c·pp + s (chunk c of stage s) on the ranks of stage s (one chunk per stage unless interleaved).
    pub stages: Vec<Range<usize>>,
    /// The blocks in the order the forward runs them (`Model::block_sequence`: each layer once per
    /// pass); a layer run twice lies in one stage (shared blocks across stages are not planned).
    pub blocks: Vec<(usize, LayerKind)>,
    pub specs: Vec<ParamSpec>,
    pub bugs: Bugs,
    /// The loss mean's denominator: the counted targets of the global batch (`data.ignored`), each
    /// by its class weight (`data.class_weights`).
    pub loss_denominator: f64,
    /// The loss weight of each vocabulary entry; empty: unweighted.
    pub class_weights: Vec<f64>,
}

impl<'a> Plan<'a> {
    pub fn new(case: &'a Case, bugs: Bugs) -> Result<Plan<'a>, Reject> {
        let model = case.model.as_ref().expect("model case");
        let p = &case.parallel;
        let (dp, tp, pp, ep) = (p.dp as usize, p.tp as usize, p.pp as usize, p.ep as usize);
        if dp % ep != 0 {
            return Err(Reject(format!("the expert-parallel degree ({ep}) must divide the data-parallel degree ({dp})")));
        }
        if ep > 1 && p.zero_stage > 0 {
            return Err(Reject("ZeRO together with expert parallelism is not supported".into()));
        }
        // Every tensor-parallel rank must be able to lay out the model.
        for r in 0..tp {
            Layout::new(model, tp, r, p.sequence_parallel, ep, 0)?;
        }
        let (mb, ga) = (p.microbatches as usize, case.train.grad_accumulation as usize);
        let batch = model.batch as usize;
        if batch < dp * mb * ga {
            return Err(Reject(format!(
                "batch ({batch}) is smaller than dp × microbatches × grad_accumulation ({dp} × {mb} × {ga}): some micro-batches would be empty"
            )));
        }
        let blocks = model.block_sequence();
        let layers = blocks.len();
        let chunks = if pp > 1 && p.pipeline_schedule == PipelineSchedule::Interleaved { p.virtual_stages as usize } else { 1 };
        let stages = (0..pp * chunks).map(|s| balanced(layers, pp * chunks, s)).collect();
        Ok(Plan {
            case,
            model,
            mesh: Mesh::new(p),
            world: case.world(),
            dp,
            tp,
            pp,
            ep,
            zero: if dp > 1 { p.zero_stage } else { 0 },
            microbatches: mb,
            accumulation: ga,
            schedule: p.pipeline_schedule,
            stages,
            blocks,
            specs: model.params(),
            bugs,
            loss_denominator: model.tokens() as f64,
            class_weights: vec![],
        })
    }

    pub fn bug(&self, b: Bug) -> bool {
        self.bugs.has(b)
    }

    /// Batch rows of data-parallel rank `d`.
    pub fn dp_rows(&self, d: usize) -> Range<usize> {
        balanced(self.model.batch as usize, self.dp, d)
    }

    /// Batch rows of accumulation step `a` on data-parallel rank `d`.
    fn accumulation_rows(&self, d: usize, a: usize) -> Range<usize> {
        let rows = self.dp_rows(d);
        let chunk = balanced(rows.len(), self.accumulation, a);
        rows.start + chunk.start..rows.start + chunk.end
    }

    /// Whether some accumulation step of rank `d` splits into micro-batches of unequal length.
    pub fn uneven_microbatches(&self, d: usize) -> bool {
        (0..self.accumulation).any(|a| self.accumulation_rows(d, a).len() % self.microbatches != 0)
    }

    /// The micro-batches of accumulation step `a` on data-parallel rank `d`.
    pub fn pieces(&self, d: usize, a: usize) -> Vec<Piece> {
        let chunk = self.accumulation_rows(d, a);
        let mut out: Vec<Piece> = (0..self.microbatches)
            .map(|j| {
                let r = balanced(chunk.len(), self.microbatches, j);
                Piece { rows: chunk.start + r.start..chunk.start + r.end }
            })
            .collect();
        // The injected fault's region: a 1F1B pipeline whose chunk does not divide into micro-batches.
        let one_f_one_b = self.pp > 1 && self.schedule == PipelineSchedule::OneFOneB;
        if self.bug(Bug::PipelineDropsLastMicrobatch) && one_f_one_b && chunk.len() % self.microbatches != 0 && self.microbatches > 1 {
            out.pop();
        }
        out
    }

    /// The pipeline stage that owns parameter `name` (tied embeddings live on the first and last).
    pub fn stages_of(&self, name: &str) -> Vec<usize> {
        let last = self.pp - 1;
        if name == "embed.weight" {
            if self.model.tied_embeddings {
                let mut v = vec![0, last];
                v.dedup();
                return v;
            }
            return vec![0];
        }
        if name.starts_with("final_norm") || name.starts_with("lm_head") {
            return vec![last];
        }
        let layer: usize = name.split('.').nth(1).and_then(|s| s.parse().ok()).expect("layers.N.…");
        vec![self.stages.iter().position(|r| r.contains(&layer)).expect("every layer has a stage") % self.pp]
    }

    /// Model chunks per pipeline stage (above 1 only under the interleaved schedule).
    pub fn chunks(&self) -> usize {
        self.stages.len() / self.pp
    }

    pub fn coord(&self, rank: usize, axis: Axis) -> usize {
        self.mesh.coord(rank, axis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_chunks_go_round_robin_over_the_stages() {
        let text = crate::case::tests::MINIMAL
            .replace(r#""pp": 1"#, r#""pp": 2, "pipeline_schedule": "interleaved", "virtual_stages": 2"#)
            .replace(r#""layers": ["attention", "mlp"]"#, r#""layers": ["attention", "mlp", "attention", "mlp"]"#);
        let case = Case::from_json(&text).unwrap();
        let plan = Plan::new(&case, Bugs::default()).unwrap();
        assert_eq!(plan.chunks(), 2);
        let stages: Vec<usize> = (0..4).map(|i| plan.stages_of(&format!("layers.{i}.x"))[0]).collect();
        assert_eq!(stages, vec![0, 1, 0, 1]);
        assert_eq!((plan.stages_of("embed.weight"), plan.stages_of("lm_head.weight")), (vec![0], vec![1]));
    }

    #[test]
    fn balanced_split_differs_by_at_most_one() {
        let sizes: Vec<usize> = (0..4).map(|i| balanced(5, 4, i).len()).collect();
        assert_eq!(sizes, vec![2, 1, 1, 1]);
        assert_eq!(balanced(5, 4, 3), 4..5);
    }
}
