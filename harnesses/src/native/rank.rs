//! The program every rank thread runs: pipeline schedule over micro-batches, gradient
//! synchronisation (tied embeddings, data parallel, ZeRO), loss scaling, clipping, optimizer.

use std::ops::Range;

use shardfuzz_kernels::{self as k, DType, Prec};

use super::groups::Groups;
use super::plan::{Piece, Plan};
use super::sharding::{local_ranges, placement, shard, TpPlacement};
use super::zero::Flat;
use crate::case::{Axis, ClipNorm, PipelineSchedule};
use crate::inputs::Inputs;
use crate::model::{
    block_bwd, block_fwd, embed_bwd, embed_fwd, head_bwd, head_fwd, loss_sum, BlockCache, Bug, CResult, CommFailure, Ctx, Geom, GroupOps,
    HeadCache, Layout, Mat, ParamSet,
};
use crate::reference::{clip_coefficient_of, clip_measure, combine_measures, OptState};

/// Step-0 logits of one micro-batch: (global token rows, vocab columns held, values).
pub type LogitsPiece = (Range<usize>, Range<usize>, Mat);

/// What one rank hands back for assembly.
pub struct RankOut {
    pub rank: usize,
    pub layout: Layout,
    pub stage: usize,
    /// Sum of this rank's per-token losses at each step (last stage only; 0 elsewhere).
    pub loss_sums: Vec<f64>,
    /// Step-0 logits: (global token rows, vocab columns held, values).
    pub logits: Vec<LogitsPiece>,
    /// Step-0 gradients (after synchronisation, unscaled, before clipping), local shapes.
    pub grads0: ParamSet,
    /// Parameters after the last step, local shapes.
    pub params: ParamSet,
    /// Per step: 1 when the loss scaler skipped it.
    pub skipped: Vec<f64>,
    pub features: Vec<String>,
}

/// What a rank records over the steps for assembly.
#[derive(Default)]
struct StepRecord {
    loss_sums: Vec<f64>,
    logits: Vec<LogitsPiece>,
    grads0: ParamSet,
    skipped: Vec<f64>,
}

/// One step's gradients after synchronisation, unscaled: per parameter, and with ZeRO-2/3 also this
/// rank's flat partition (which then holds the reduced values).
struct Synced {
    grads: ParamSet,
    zero: Option<Vec<f64>>,
    /// With the tied-embedding fault: the norm's terms taken before the late tied reduction.
    early_measure: Option<f64>,
}

struct PieceState {
    piece: Piece,
    geom: Geom,
    ids: Vec<usize>,
    targets: Vec<usize>,
    caches: Vec<BlockCache>,
    head: Option<HeadCache>,
}

pub struct Rank<'a> {
    pub plan: &'a Plan<'a>,
    pub groups: &'a Groups<'a>,
    pub rank: usize,
    pub layout: Layout,
    pub stage: usize,
    pub p: Prec,
    pub features: Vec<String>,
    /// Some MoE layer of this rank dropped tokens at capacity.
    pub tokens_dropped: std::cell::Cell<bool>,
}

impl<'a> Rank<'a> {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            p: self.p,
            model: self.plan.model,
            layout: &self.layout,
            tp: Some(&self.groups.tp as &dyn GroupOps),
            ep: if self.plan.ep > 1 { Some(&self.groups.ep as &dyn GroupOps) } else { None },
            bugs: self.plan.bugs,
            routing_margin: std::cell::Cell::new(f64::INFINITY),
            flip_routing_below: 0.0,
            flip_only: None,
            gate_jitter: None,
            near_ties: std::cell::Cell::new(0),
            router_probs: Default::default(),
            attention_scores: Default::default(),
            tokens_dropped: std::cell::Cell::new(false),
            peak_activation: std::cell::Cell::new(0.0),
            loss_grad_scale: std::cell::Cell::new(0.0),
            counted_share: self.plan.loss_denominator / self.plan.model.tokens() as f64,
            class_weights: &self.plan.class_weights,
            label_smoothing: self.plan.case.train.label_smoothing(),
        }
    }

    fn is_last_stage(&self) -> bool {
        self.stage + 1 == self.plan.pp
    }

    /// The parameters this rank holds (its stage, its shards), initialised from the full inputs.
    fn local_params(&self, inputs: &Inputs) -> ParamSet {
        let hd = self.plan.model.head_dim();
        self.plan
            .specs
            .iter()
            .filter(|s| self.plan.stages_of(&s.name).contains(&self.stage))
            .map(|s| {
                let full = inputs.tensor(&s.name).expect("inputs hold every parameter");
                let mut t = shard(full, &local_ranges(s, &self.layout, hd));
                self.p.dtype.round_slice(&mut t.data);
                (s.name.clone(), t)
            })
            .collect()
    }

    /// The tag of micro-batch `j`'s message over the link from virtual stage `link` to `link + 1`.
    fn tag(&self, step: u32, a: usize, j: usize, link: usize, backward: bool) -> u64 {
        let (mb, links) = (self.plan.microbatches as u64, self.plan.stages.len() as u64);
        let mut t = (step as u64 * self.plan.accumulation as u64 + a as u64) * mb + j as u64;
        t = t * links + link as u64;
        (t << 1) | u64::from(backward)
    }

    /// The rank of the stage `delta` away along the pipeline (wrapping: under the interleaved
    /// schedule the last stage feeds the first stage's next chunk).
    fn neighbour(&self, delta: isize) -> usize {
        let pp = self.plan.pp as isize;
        self.plan.mesh.with_coord(self.rank, Axis::Pp, (self.stage as isize + delta).rem_euclid(pp) as usize)
    }

    fn piece_state(&self, piece: Piece, inputs: &Inputs) -> PieceState {
        let seq = self.plan.model.seq as usize;
        let toks: Range<usize> = piece.rows.start * seq..piece.rows.end * seq;
        PieceState {
            geom: Geom { batch: piece.rows.len(), seq },
            ids: inputs.tokens[toks.clone()].to_vec(),
            targets: inputs.targets[toks].to_vec(),
            piece,
            caches: vec![],
            head: None,
        }
    }

    /// Forward of one micro-batch through virtual stage `vs` (`tag(link)`: its messages' tags); the
    /// last one returns (loss sum, logits).
    fn forward(
        &self,
        params: &ParamSet,
        st: &mut PieceState,
        vs: usize,
        tag: impl Fn(usize) -> u64,
        grad_scale: f64,
    ) -> CResult<Option<(f64, Mat)>> {
        let ctx = self.ctx();
        ctx.loss_grad_scale.set(grad_scale);
        let h = self.plan.model.hidden as usize;
        let mut x = if vs == 0 {
            embed_fwd(&ctx, params, &st.geom, &st.ids)?
        } else {
            let data = self.groups.recv(self.neighbour(-1), tag(vs - 1))?;
            Mat::from_shape_vec((data.len() / h, h), data).map_err(|e| CommFailure(format!("received activation: {e}")))?
        };
        for pos in self.plan.stages[vs].clone() {
            let (i, kind) = self.plan.blocks[pos];
            let (nx, c) = block_fwd(&ctx, i, kind, params, &st.geom, &x)?;
            st.caches.push(c);
            x = nx;
        }
        if ctx.tokens_dropped.get() {
            self.tokens_dropped.set(true);
        }
        if vs + 1 == self.plan.stages.len() {
            let (losses, logits, hc) = head_fwd(&ctx, params, &st.geom, &x, &st.targets, grad_scale)?;
            st.head = Some(hc);
            Ok(Some((loss_sum(&ctx, &losses), logits)))
        } else {
            self.groups.send(self.neighbour(1), tag(vs), x.iter().copied().collect())?;
            Ok(None)
        }
    }

    fn backward(&self, params: &ParamSet, st: PieceState, vs: usize, tag: impl Fn(usize) -> u64, grads: &mut ParamSet) -> CResult<()> {
        let ctx = self.ctx();
        let h = self.plan.model.hidden as usize;
        let mut dx = match st.head {
            Some(hc) => head_bwd(&ctx, params, &st.geom, hc, grads)?,
            None => {
                let data = self.groups.recv(self.neighbour(1), tag(vs))?;
                Mat::from_shape_vec((data.len() / h, h), data).map_err(|e| CommFailure(format!("received gradient: {e}")))?
            }
        };
        let positions = self.plan.stages[vs].clone();
        for (pos, c) in positions.zip(st.caches).rev() {
            dx = block_bwd(&ctx, self.plan.blocks[pos].0, params, &st.geom, c, &dx, grads)?;
        }
        if vs == 0 {
            embed_bwd(&ctx, params, &st.geom, &st.ids, &dx, grads)
        } else {
            self.groups.send(self.neighbour(-1), tag(vs - 1), dx.iter().copied().collect())
        }
    }

    /// One accumulation step's micro-batches through the pipeline schedule.
    fn run_schedule(
        &self,
        params: &ParamSet,
        inputs: &Inputs,
        step: u32,
        a: usize,
        grad_scale: f64,
        grads: &mut ParamSet,
        out: &mut (f64, Vec<LogitsPiece>),
    ) -> CResult<()> {
        let d = self.plan.coord(self.rank, Axis::Dp);
        let pieces = self.plan.pieces(d, a);
        let n = pieces.len();
        // One state per (model chunk, micro-batch); chunk c runs virtual stage c·pp + stage.
        let chunks = self.plan.chunks();
        let mut states: Vec<Vec<Option<PieceState>>> =
            (0..chunks).map(|_| pieces.iter().map(|p| Some(self.piece_state(p.clone(), inputs))).collect()).collect();
        let seq = self.plan.model.seq as usize;
        let vs = |c: usize| c * self.plan.pp + self.stage;
        let mut fwd = |c: usize, j: usize, states: &mut Vec<Vec<Option<PieceState>>>| -> CResult<()> {
            let st = states[c][j].as_mut().expect("forward before backward");
            let counted = inputs.denominator_in(st.piece.rows.start * seq..st.piece.rows.end * seq);
            let scale = self.piece_grad_scale(grad_scale, counted, n);
            if let Some((loss, logits)) = self.forward(params, st, vs(c), |l| self.tag(step, a, j, l, false), scale)? {
                out.0 = self.p.acc().round(out.0 + loss);
                if step == 0 {
                    let rows = st.piece.rows.start * seq..st.piece.rows.end * seq;
                    out.1.push((rows, self.layout.vocab.clone(), logits));
                }
            }
            Ok(())
        };
        let bwd = |c: usize, j: usize, states: &mut Vec<Vec<Option<PieceState>>>, grads: &mut ParamSet| -> CResult<()> {
            let st = states[c][j].take().expect("backward once");
            self.backward(params, st, vs(c), |l| self.tag(step, a, j, l, true), grads)
        };
        for step in schedule_order(self.plan.schedule, chunks, n, self.plan.pp, self.stage) {
            match step {
                Pass::Forward(c, j) => fwd(c, j, &mut states)?,
                Pass::Backward(c, j) => bwd(c, j, &mut states, grads)?,
            }
        }
        Ok(())
    }

    /// The loss-gradient scale of one micro-batch whose counted targets weigh `counted`: the global
    /// token mean's, or with the injected fault the mean over the micro-batch's own counted tokens
    /// (then over micro-batches, accumulation steps and data-parallel ranks), which differs
    /// wherever micro-batches hold different numbers of counted tokens.
    fn piece_grad_scale(&self, grad_scale: f64, counted: f64, pieces: usize) -> f64 {
        let plan = self.plan;
        let own = (plan.dp * plan.accumulation * pieces) as f64 * counted;
        if !plan.bug(Bug::LossMeanPerMicrobatch) || own == plan.loss_denominator || own == 0.0 {
            return grad_scale;
        }
        grad_scale * plan.loss_denominator / own
    }

    /// Whether this rank counts element-wise toward the global gradient norm for `name`
    /// (replicated copies are counted once).
    pub(super) fn counts_in_norm(&self, name: &str, zero: bool) -> bool {
        let spec = self.plan.specs.iter().find(|s| s.name == name).expect("spec");
        let pl = placement(spec);
        let tp_ok = matches!(pl.tp, TpPlacement::Shard { .. }) && !(self.layout.kv_replicated && is_kv(name) && !self.first_kv_holder())
            || self.plan.coord(self.rank, Axis::Tp) == 0;
        let pp_ok = !(name == "embed.weight" && self.plan.pp > 1 && self.stage != 0);
        let d = self.plan.coord(self.rank, Axis::Dp);
        let dp_ok = zero || if pl.expert_sharded { d / self.plan.ep == 0 } else { d == 0 };
        tp_ok && pp_ok && dp_ok
    }

    fn first_kv_holder(&self) -> bool {
        let m = self.plan.model;
        let group = (m.heads / m.kv_heads) as usize;
        (self.layout.heads.start % group) == 0
    }

    /// The clipping norm's measure (`clip_measure`: Σg², Σ|g| or max |g|) over the gradient elements this rank owns.
    fn owned_measure(&self, grads: &ParamSet) -> f64 {
        let kind = self.plan.case.train.clip_norm();
        grads
            .iter()
            .filter(|(n, _)| self.counts_in_norm(n, false))
            .map(|(_, t)| clip_measure(kind, self.p, &t.data))
            .fold(0.0, |s, x| combine_measures(kind, s, x, |v| self.p.acc().round(v)))
    }

    /// Runs every step; returns what the target assembles.
    pub fn run(mut self, inputs: &Inputs) -> CResult<RankOut> {
        let ignored = ignored_target_features(self.plan, inputs, self.plan.coord(self.rank, Axis::Dp));
        self.features.extend(ignored);
        let plan = self.plan;
        let train = &plan.case.train;
        let mut params = self.local_params(inputs);
        let names: Vec<String> = plan.specs.iter().map(|s| s.name.clone()).filter(|n| params.contains_key(n)).collect();
        let mut opt = OptState::new(train, &plan.specs, &params);
        let mut scale = train.loss_scale.map(|s| s.get());
        let mut record = StepRecord::default();
        let flat = Flat::new(&names, &params, plan.dp);
        self.note_zero_padding(&flat);
        for step in 0..train.steps {
            let (grads, (loss_sum, logits)) = self.accumulate(&params, inputs, &names, step, scale.unwrap_or(1.0))?;
            record.loss_sums.push(loss_sum);
            if step == 0 {
                record.logits = logits;
            }
            let synced = self.synchronise(&flat, &names, grads, scale)?;
            if step == 0 {
                record.grads0 = match &synced.zero {
                    Some(zg) => flat.gather_grads(&self, zg, &params)?,
                    None => synced.grads.clone(),
                };
            }
            if let Some(sc) = scale {
                let overflow = self.overflowed(&synced)?;
                record.skipped.push(overflow);
                if overflow > 0.0 {
                    scale = Some(sc / 2.0);
                    self.features.push("loss-scale:overflow".into());
                    continue;
                }
            }
            let coef = self.clip_coefficient(&flat, &synced)?;
            // Adam counts applied updates: the steps the scaler skipped are not among them.
            let applied = step - record.skipped.iter().filter(|&&o| o > 0.0).count() as u32;
            self.update(&flat, &names, &mut params, synced, coef, &mut opt, applied)?;
        }
        if self.tokens_dropped.get() {
            self.features.push("path:moe:drops".into());
        }
        Ok(RankOut {
            rank: self.rank,
            layout: self.layout,
            stage: self.stage,
            loss_sums: record.loss_sums,
            logits: record.logits,
            grads0: record.grads0,
            skipped: record.skipped,
            params,
            features: self.features,
        })
    }

    fn note_zero_padding(&mut self, flat: &Flat) {
        let zero = self.plan.zero;
        if zero > 0 {
            let padded = flat.padding() > 0;
            self.features.push(format!("zero{zero}:{}", if padded { "padded" } else { "even" }));
            if padded {
                self.features.push("path:zero:padded".into());
            }
        }
    }

    /// One step's forward and backward over every accumulation step: the local gradients (zero for
    /// parameters the stage holds but did not use) and (loss sum, step-0 logits).
    fn accumulate(
        &self,
        params: &ParamSet,
        inputs: &Inputs,
        names: &[String],
        step: u32,
        loss_scale: f64,
    ) -> CResult<(ParamSet, (f64, Vec<LogitsPiece>))> {
        let plan = self.plan;
        // Each rank scales its loss gradient as if its share of tokens were 1/dp of the batch;
        // the data-parallel reduction then sums and divides by dp.
        let grad_scale = loss_scale * plan.dp as f64 / plan.loss_denominator;
        let mut grads = ParamSet::new();
        let mut acc = (0.0, vec![]);
        for a in 0..plan.accumulation {
            let undivided = plan.bug(Bug::AccumLossNotDivided);
            let per_chunk = if undivided { grad_scale * plan.accumulation as f64 } else { grad_scale };
            self.run_schedule(params, inputs, step, a, per_chunk, &mut grads, &mut acc)?;
        }
        for n in names {
            grads.entry(n.clone()).or_insert_with(|| crate::tensor::Tensor::zeros(params[n].shape.clone()));
        }
        Ok((grads, acc))
    }

    /// Tied-embedding and data-parallel (or ZeRO-2/3 reduce-scatter) synchronisation, then the loss
    /// scale divided out.
    fn synchronise(&self, flat: &Flat, names: &[String], mut grads: ParamSet, scale: Option<f64>) -> CResult<Synced> {
        let plan = self.plan;
        // The injected fault: the tied-embedding reduction between stages runs after the
        // clipping norm's terms are taken (ZeRO-2/3 must reduce before partitioning).
        let tied_late = plan.bug(Bug::TiedGradsReducedAfterNorm) && plan.zero < 2;
        if !tied_late {
            self.sync_tied_embeddings(&mut grads)?;
        }
        let mut zero = None;
        if plan.zero >= 2 {
            zero = Some(flat.reduce_scatter(self, &grads)?);
        } else {
            self.all_reduce_data_parallel(names, &mut grads)?;
        }
        if let Some(sc) = scale {
            for t in grads.values_mut() {
                t.data.iter_mut().for_each(|x| *x = self.p.r(*x / sc));
            }
            if let Some(zg) = zero.as_mut() {
                zg.iter_mut().for_each(|x| *x = self.p.r(*x / sc));
            }
        }
        let early_measure = (tied_late && plan.case.train.clip_grad_norm.is_some()).then(|| self.owned_measure(&grads));
        if tied_late {
            self.sync_tied_embeddings(&mut grads)?;
        }
        Ok(Synced { grads, zero, early_measure })
    }

    /// 1 when some rank's gradients overflowed (the loss scaler skips the step on every rank), else 0.
    fn overflowed(&self, synced: &Synced) -> CResult<f64> {
        let local_bad = match &synced.zero {
            Some(zg) => zg.iter().any(|x| !x.is_finite()),
            None => synced.grads.values().any(|t| !t.all_finite()),
        };
        let mut flag = [if local_bad { 1.0 } else { 0.0 }];
        if !self.plan.bug(Bug::F16OverflowNotAgreed) {
            self.groups.world.all_reduce_max(&mut flag)?;
        }
        Ok(flag[0])
    }

    /// The gradient-clipping coefficient (1 without clipping).
    fn clip_coefficient(&mut self, flat: &Flat, synced: &Synced) -> CResult<f64> {
        let Some(max_norm) = self.plan.case.train.clip_grad_norm else {
            return Ok(1.0);
        };
        let kind = self.plan.case.train.clip_norm();
        let mut measure = [match (&synced.zero, synced.early_measure) {
            (_, Some(early)) => early,
            (Some(zg), None) => flat.owned_measure(self, zg),
            (None, None) => self.owned_measure(&synced.grads),
        }];
        // The injected fault's region: the norm of ZeRO-2/3's partitioned gradients.
        let local = self.plan.bug(Bug::ClipLocalNorm) && synced.zero.is_some();
        match (local, kind) {
            (true, _) => {}
            (false, ClipNorm::Inf) => self.groups.world.all_reduce_max(&mut measure)?,
            (false, _) => self.groups.world.all_reduce_sum(&mut measure)?,
        }
        let coef = clip_coefficient_of(kind, measure[0], max_norm.get());
        if coef < 1.0 {
            self.features.push("clip:active".into());
        }
        Ok(coef)
    }

    /// The optimizer step on the clipped gradients (ZeRO-1+: on this rank's partition).
    fn update(
        &self,
        flat: &Flat,
        names: &[String],
        params: &mut ParamSet,
        synced: Synced,
        coef: f64,
        opt: &mut OptState,
        step: u32,
    ) -> CResult<()> {
        if self.plan.zero >= 1 {
            let mut part = match synced.zero {
                Some(zg) => zg,
                None => flat.partition_of(self, &synced.grads),
            };
            k::scale_in_place(self.p, &mut part, coef);
            return flat.update(self, params, &part, opt, step + 1);
        }
        let mut grads = synced.grads;
        for n in names {
            let g = grads.get_mut(n).expect("grad");
            k::scale_in_place(self.p, &mut g.data, coef);
            let param = params.get_mut(n).expect("param");
            opt.update(n, self.p, &mut param.data, &g.data, 0, step + 1);
        }
        Ok(())
    }

    fn sync_tied_embeddings(&self, grads: &mut ParamSet) -> CResult<()> {
        let plan = self.plan;
        let skipped = plan.bug(Bug::TiedEmbeddingGradNotReduced);
        if !(plan.model.tied_embeddings && plan.pp > 1) || skipped {
            return Ok(());
        }
        if self.stage == 0 || self.is_last_stage() {
            let g = grads.get_mut("embed.weight").expect("tied embedding on first and last stage");
            if let Some(group) = &self.groups.embedding {
                group.all_reduce_sum(&mut g.data)?;
            }
        }
        Ok(())
    }

    /// Data-parallel all-reduce of the gradients in two buckets (dense, and experts over the
    /// expert-data-parallel group), then division by the data-parallel degree.
    fn all_reduce_data_parallel(&self, names: &[String], grads: &mut ParamSet) -> CResult<()> {
        let plan = self.plan;
        if plan.dp == 1 {
            return Ok(());
        }
        for experts in [false, true] {
            // The injected fault's region: the expert bucket under expert parallelism.
            let world = plan.bug(Bug::DpAverageWorld) && experts && plan.ep > 1;
            let divisor = if world { plan.world } else { plan.dp } as f64;
            let bucket: Vec<&String> = names
                .iter()
                .filter(|n| placement(plan.specs.iter().find(|s| &&s.name == n).expect("spec")).expert_sharded == experts)
                .collect();
            if bucket.is_empty() {
                continue;
            }
            let mut flat: Vec<f64> = bucket.iter().flat_map(|n| grads[*n].data.iter().copied()).collect();
            // The injected fault: the expert bucket reduced over the whole data-parallel group, so
            // ranks holding different experts sum each other's gradients.
            let own_group = experts && plan.ep > 1 && !plan.bug(Bug::ExpertGradsWrongGroup);
            let group: &dyn GroupOps = if own_group { &self.groups.edp } else { &self.groups.dp };
            // The injected fault: the bucket downcast to bf16 and summed in bf16 (a bf16 bucket is
            // already bf16: nothing to downcast).
            let downcast = plan.bug(Bug::GradsDowncastBeforeReduce) && plan.case.train.reduce_dtype() != DType::BF16;
            if group.size() > 1 {
                if downcast {
                    flat.iter_mut().for_each(|x| *x = DType::BF16.round(*x));
                    group.all_reduce_sum_in(&mut flat, DType::BF16)?;
                } else {
                    group.all_reduce_sum(&mut flat)?;
                }
            }
            let mut off = 0;
            for n in bucket {
                let t = grads.get_mut(n).expect("grad");
                for (dst, src) in t.data.iter_mut().zip(&flat[off..]) {
                    *dst = self.p.r(src / divisor);
                }
                off += t.data.len();
            }
        }
        Ok(())
    }
}

/// One pass of one micro-batch through one model chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Forward(usize, usize),
    Backward(usize, usize),
}

/// The order in which a pipeline stage runs its passes (`chunks` model chunks, `n` micro-batches).
fn schedule_order(schedule: PipelineSchedule, chunks: usize, n: usize, pp: usize, stage: usize) -> Vec<Pass> {
    let mut order = vec![];
    match schedule {
        _ if chunks > 1 => {
            // Interleaved: every micro-batch forward through this rank's chunks in order, then
            // backward in micro-batch order, chunks in reverse (each wait is on a virtual stage
            // earlier in that order, so no rank waits on a later one).
            for j in 0..n {
                order.extend((0..chunks).map(|c| Pass::Forward(c, j)));
            }
            for j in 0..n {
                order.extend((0..chunks).rev().map(|c| Pass::Backward(c, j)));
            }
        }
        // (Interleaved with one chunk: no pipeline parallelism, where schedules coincide.)
        PipelineSchedule::Gpipe | PipelineSchedule::Interleaved => {
            order.extend((0..n).map(|j| Pass::Forward(0, j)));
            order.extend((0..n).rev().map(|j| Pass::Backward(0, j)));
        }
        PipelineSchedule::OneFOneB => {
            let warmup = (pp - stage - 1).min(n);
            order.extend((0..warmup).map(|j| Pass::Forward(0, j)));
            for j in warmup..n {
                order.push(Pass::Forward(0, j));
                order.push(Pass::Backward(0, j - warmup));
            }
            order.extend((n - warmup..n).map(|j| Pass::Backward(0, j)));
        }
    }
    order
}

fn is_kv(name: &str) -> bool {
    name.contains("attn.k.") || name.contains("attn.v.")
}

/// Runs one rank and returns its result.
pub fn run_rank<'a>(plan: &'a Plan<'a>, groups: &'a Groups<'a>, rank: usize, inputs: &Inputs) -> CResult<RankOut> {
    let p = plan.case.parallel.clone();
    let tp_i = plan.coord(rank, Axis::Tp);
    let d = plan.coord(rank, Axis::Dp);
    let mut layout = Layout::new(plan.model, plan.tp, tp_i, p.sequence_parallel, plan.ep, d % plan.ep).map_err(|r| CommFailure(r.0))?;
    // The injected fault's region: kv heads replicated over groups of tensor-parallel ranks.
    if plan.bug(Bug::GqaKvNotReplicated) && layout.kv_replicated {
        // The injected fault: round-robin instead of the kv head of this rank's query heads.
        let kv = tp_i % plan.model.kv_heads as usize;
        layout.kv_heads = kv..kv + 1;
    }
    let mut features = vec![];
    let m = plan.model;
    if plan.tp > 1 {
        for (what, n) in [("ffn", m.ffn), ("vocab", m.vocab), ("seq", m.seq), ("heads", m.heads), ("kv", m.kv_heads)] {
            features.push(format!("tp:{what}:{}", if n as usize % plan.tp == 0 { "div" } else { "nondiv" }));
        }
        if layout.ffn.is_empty() {
            features.push("tp:ffn:empty-shard".into());
        }
        if layout.kv_replicated {
            features.push("tp:kv:replicated".into());
        }
    }
    if plan.dp > 1 {
        features.push(format!("dp:batch:{}", if m.batch as usize % plan.dp == 0 { "div" } else { "nondiv" }));
    }
    if plan.pp > 1 {
        features.push(format!("pp:{:?}:mb{}", plan.schedule, plan.microbatches.min(plan.pp + 1).cmp(&plan.pp) as i8));
    }
    let stage = plan.coord(rank, Axis::Pp);
    features.extend(path_features(plan, stage, &layout, d));
    let rank =
        Rank { plan, groups, rank, layout, stage, p: Prec::new(plan.case.train.dtype), features, tokens_dropped: Default::default() };
    rank.run(inputs)
}

/// The code paths a rank of stage `stage` takes (strategies, block kinds, bias, norm, loops that
/// run more than once, optional steps): coarse edges of this implementation, reported as coverage
/// features with the prefix `path:`.
/// With ignored targets: whether this rank's micro-batches hold different numbers of counted
/// targets, or one holds none (a per-micro-batch mean differs there, or divides by zero).
fn ignored_target_features(plan: &Plan, inputs: &Inputs, d: usize) -> Vec<String> {
    if inputs.counted_targets() == inputs.targets.len() {
        return vec![];
    }
    let seq = plan.model.seq as usize;
    let counts: Vec<usize> = plan.pieces(d, 0).iter().map(|p| inputs.counted_in(p.rows.start * seq..p.rows.end * seq)).collect();
    let mut features = vec!["loss:ignored".to_string()];
    if counts.contains(&0) {
        features.push("loss:ignored:empty-microbatch".into());
    }
    if counts.windows(2).any(|w| w[0] != w[1]) {
        features.push("loss:ignored:uneven-microbatches".into());
    }
    features
}

fn path_features(plan: &Plan, stage: usize, layout: &Layout, d: usize) -> Vec<String> {
    let (m, t) = (plan.model, &plan.case.train);
    let mut f = vec![format!("dtype:{}", t.dtype), format!("norm:{:?}", m.norm), format!("act:{:?}", m.activation)];
    f.push(format!("opt:{:?}", t.optimizer.kind));
    f.push(format!("zero:{}", plan.zero));
    for c in 0..plan.chunks() {
        f.extend(plan.blocks[plan.stages[c * plan.pp + stage].clone()].iter().map(|(_, l)| format!("block:{l:?}")));
    }
    let flags = [
        (plan.tp > 1, "tp"),
        (plan.tp > 2, "tp:3+"),
        (plan.case.parallel.sequence_parallel, "sp"),
        (plan.dp > 1, "dp"),
        (plan.dp > 2, "dp:3+"),
        (plan.pp > 1, "pp"),
        (plan.pp > 1 && plan.schedule == PipelineSchedule::OneFOneB, "pp:1f1b"),
        (plan.chunks() > 1, "pp:interleaved"),
        (plan.ep > 1, "ep"),
        (m.bias, "bias"),
        (m.tied_embeddings, "tied"),
        (m.layer_passes > 1, "blocks:shared"),
        (m.kv_heads < m.heads, "gqa"),
        (layout.local_heads() > 1, "attn:local-heads:multi"),
        (layout.kv_replicated && m.kv_heads == 1, "tp:kv:replicated"),
        // Several kv heads, each shared by a group of ranks: the rank-to-head mapping matters.
        (layout.kv_replicated && m.kv_heads > 1, "tp:kv:grouped"),
        (plan.tp > 1 && layout.ffn.is_empty(), "tp:ffn:empty-shard"),
        (plan.tp > 1 && m.vocab as usize % plan.tp != 0, "tp:vocab:padded"),
        (m.moe.as_ref().is_some_and(|moe| moe.top_k > 1), "moe:top-k:multi"),
        (m.moe.as_ref().is_some_and(|moe| moe.renormalize), "moe:renormalized"),
        (m.moe.as_ref().is_some_and(|moe| moe.shared_ffn.is_some()), "moe:shared-expert"),
        (m.moe.as_ref().is_some_and(|moe| moe.shared_gate), "moe:shared-gate"),
        (layout.shared_ffn.is_empty() && m.moe.as_ref().is_some_and(|moe| moe.shared_ffn.is_some()), "tp:shared-ffn:empty-shard"),
        (plan.accumulation > 1, "accumulation:multi"),
        (plan.microbatches > 1, "microbatches:multi"),
        (plan.uneven_microbatches(d), "microbatches:uneven"),
        (t.steps > 1, "steps:multi"),
        (t.clip_grad_norm.is_some(), "clip"),
        (t.clip_grad_norm.is_some() && t.clip_norm_type == Some(ClipNorm::L1), "clip:l1"),
        (t.clip_grad_norm.is_some() && t.clip_norm_type == Some(ClipNorm::Inf), "clip:inf"),
        (t.loss_scale.is_some(), "loss-scale"),
        (t.reduce_dtype.is_some_and(|r| r != t.dtype), "reduce-dtype"),
        (plan.case.parallel.sequence_parallel && m.seq as usize % plan.tp != 0, "sp:seq:uneven"),
    ];
    f.extend(flags.iter().filter(|(on, _)| *on).map(|(_, name)| name.to_string()));
    f.into_iter().map(|x| format!("path:{x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_warms_up_by_the_stages_after_it_then_alternates() {
        use Pass::{Backward as B, Forward as F};
        let order = schedule_order(PipelineSchedule::OneFOneB, 1, 3, 2, 0);
        assert_eq!(order, vec![F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), B(0, 2)]);
        // The last stage has no warm-up.
        let order = schedule_order(PipelineSchedule::OneFOneB, 1, 2, 2, 1);
        assert_eq!(order, vec![F(0, 0), B(0, 0), F(0, 1), B(0, 1)]);
    }

    #[test]
    fn every_schedule_runs_each_pass_once_forward_before_backward() {
        for schedule in [PipelineSchedule::Gpipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved] {
            for (chunks, n, pp, stage) in [(1, 4, 4, 0), (1, 4, 4, 3), (1, 1, 2, 0), (2, 3, 2, 1)] {
                let chunks = if schedule == PipelineSchedule::Interleaved { chunks } else { 1 };
                let order = schedule_order(schedule, chunks, n, pp, stage);
                assert_eq!(order.len(), 2 * chunks * n, "{schedule:?}");
                for c in 0..chunks {
                    for j in 0..n {
                        let f = order.iter().position(|p| *p == Pass::Forward(c, j)).expect("forward");
                        let b = order.iter().position(|p| *p == Pass::Backward(c, j)).expect("backward");
                        assert!(f < b, "{schedule:?}: backward of ({c}, {j}) before its forward");
                    }
                }
            }
        }
    }
}
