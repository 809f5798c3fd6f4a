//! Probable bugs: findings grouped by what their minimized cases need.
//!
//! A divergence's signature is its first divergent tensor and the strategy set of the case it was seen
//! in, so one bug that loses the gradient of every reused module shows as a signature per module and
//! per strategy set (eleven for one torch FSDP2 bug in a 10-minute campaign). Minimization removes
//! whatever a failure does not need (keeping the divergent tensor's module), and `minimize::needs`
//! then drops what only kept the divergence on that tensor, so what is left is what the bug needs.
//! Divergences of one target whose minimized cases need the same things and first go wrong in the
//! same phase (forward, backward, a later step, the optimizer step) are one probable bug. Crashes and
//! hangs are already keyed by their site, and a finding not yet minimized stays a group of its own:
//! its case still carries what it does not need.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;
use shardfuzz_harnesses::case::{Case, CheckpointLayout, Distribution, OptimizerKind, Parallel};
use shardfuzz_kernels::DType;

use crate::findings::{Finding, MINIMIZATION};
use crate::localize::{first_divergent, place_of};
use crate::minimize::Minimized;
use crate::oracle::{config_class, signature_id, VerdictKind};

/// A group of findings that are probably one bug.
#[derive(Debug, Clone, Serialize)]
pub struct ProbableBug {
    pub id: String,
    pub target: String,
    pub kind: String,
    /// Where the minimized cases first go wrong (divergences only).
    pub phase: Option<String>,
    /// What every minimized case of the group needs; `None` when the finding was not minimized.
    pub needs: Option<Vec<String>>,
    /// Finding ids, most hits first.
    pub findings: Vec<String>,
    pub hits: u64,
    pub first_seen_elapsed_s: f64,
}

/// The configuration a case needs, in terms free of sizes, seeds and layer indices: its strategies,
/// dtypes, the options that realise them, model and training features. (Not which sizes a degree does
/// not divide: the minimizer shrinks sizes to 1 wherever the failure allows, so a minimized case is
/// often uneven whether or not its bug needs it.)
pub fn needs(case: &Case) -> Vec<String> {
    let mut out: Vec<String> = config_class(case).split('+').filter(|c| *c != "single").map(String::from).collect();
    if case.parallel.zero_stage > 0 && case.parallel.dp == 1 {
        // (The strategy set leaves ZeRO out on one rank, where it partitions nothing; its hooks still run.)
        out.push(format!("zero{}", case.parallel.zero_stage));
    }
    out.push(format!("dtype={}", precision(case.train.dtype)));
    out.extend(parallel_needs(case));
    out.extend(train_needs(case));
    if let Some(m) = &case.model {
        let flags = [
            (m.bias, "bias"),
            (m.tied_embeddings, "tied-embeddings"),
            (m.sparse_embedding, "sparse-embedding"),
            (m.moe.is_some(), "moe"),
            (m.layer_passes > 1 && !m.layers.is_empty(), "shared-blocks"),
            (m.layers.contains(&shardfuzz_harnesses::case::LayerKind::Parallel), "parallel-blocks"),
            (m.activation != Default::default(), "activation"),
        ];
        out.extend(flags.iter().filter(|(on, _)| *on).map(|(_, n)| n.to_string()));
        if let Some(r) = m.activation_checkpointing {
            out.push(format!("activation_checkpointing={}", r.name()));
        }
        if let Some(h) = m.hf_model {
            out.push(format!("hf_model={}", h.name()));
        }
        if m.rotary_base.is_some() {
            out.push("rotary".into());
        }
        if m.qk_norm {
            out.push("qk-norm".into());
        }
    }
    out.sort();
    out.dedup();
    out
}

fn precision(d: DType) -> &'static str {
    match d {
        DType::F64 => "f64",
        DType::F32 => "f32",
        DType::BF16 | DType::F16 => "16-bit",
    }
}

/// A serde enum's or flag's name (`"sharded"`, `true`), or `set` for anything else (a size).
fn value_name<T: Serialize>(x: &T) -> String {
    match serde_json::to_value(x) {
        Ok(Value::String(s)) => s,
        Ok(Value::Bool(b)) => b.to_string(),
        _ => "set".into(),
    }
}

/// Every `parallel` field the case sets away from its default, but the degrees and strategies
/// `config_class` already names: `name=value` for flags and modes, `name=set` for sizes. (Read from
/// the serialized case, so a new option needs no line here.)
fn parallel_needs(case: &Case) -> Vec<String> {
    const NAMED: [&str; 7] = ["dp", "tp", "pp", "cp", "ep", "sequence_parallel", "zero_stage"];
    let (Ok(Value::Object(set)), Ok(Value::Object(default))) =
        (serde_json::to_value(&case.parallel), serde_json::to_value(Parallel::default()))
    else {
        return vec![];
    };
    let differs = |(k, v): &(&String, &Value)| !NAMED.contains(&k.as_str()) && default.get(*k) != Some(*v);
    set.iter().filter(differs).map(|(k, v)| format!("{k}={}", value_name(v))).collect()
}

fn train_needs(case: &Case) -> Vec<String> {
    let (t, d) = (&case.train, &case.data);
    let mut out = vec![];
    let dtype = |name: &str, x: Option<DType>| x.map(|x| format!("{name}={}", value_name(&x)));
    out.extend(dtype("reduce_dtype", t.reduce_dtype));
    out.extend(dtype("grad_accum_dtype", t.grad_accum_dtype));
    out.extend(dtype("master_dtype", t.master_dtype));
    if t.optimizer.kind != OptimizerKind::Sgd {
        out.push(format!("optimizer={}", value_name(&t.optimizer.kind)));
    }
    if let Some(k) = t.clip_norm_type {
        out.push(format!("clip_norm_type={}", value_name(&k)));
    }
    if let Some(i) = t.optimizer.implementation {
        out.push(format!("optimizer_implementation={}", value_name(&i)));
    }
    if let Some(q) = &t.resume_parallel {
        out.extend(q.differing_fields(&case.parallel).into_iter().map(|name| format!("resumed_{name}")));
    }
    let flags = [
        (t.steps > 1, "steps>1"),
        (t.grad_accumulation > 1, "grad_accumulation>1"),
        (t.clip_grad_norm.is_some(), "clip_grad_norm"),
        (t.loss_scale.is_some(), "loss_scale"),
        (t.resume_after.is_some(), "resume"),
        (t.checkpoint_layout == Some(CheckpointLayout::Gathered), "gathered_checkpoint"),
        (t.checkpoint_layout == Some(CheckpointLayout::Universal), "universal_checkpoint"),
        (!t.frozen.is_empty(), "frozen"),
        (t.per_token_loss, "per_token_loss"),
        (t.local_mean_loss, "local_mean_loss"),
        (t.compiled, "compiled"),
        (t.label_smoothing.is_some(), "label_smoothing"),
        (t.optimizer.weight_decay.0 != 0.0, "weight_decay"),
        (t.optimizer.no_decay_vectors, "no_decay_vectors"),
        (d.ignored.is_some(), "ignored-tokens"),
        (d.class_weights, "class-weights"),
    ];
    out.extend(flags.iter().filter(|(on, _)| *on).map(|(_, n)| n.to_string()));
    if d.distribution != Distribution::Normal {
        out.push(format!("data={}", value_name(&d.distribution)));
    }
    out
}

/// The probable bugs of a campaign's findings (`dir` is `OUT/findings`), most hits first.
pub fn probable_bugs(findings: &[Finding], dir: &Path) -> Vec<ProbableBug> {
    let mut groups: BTreeMap<String, ProbableBug> = BTreeMap::new();
    for f in findings {
        let (key, phase, needs) = group_key(f, &dir.join(&f.id));
        let g = groups.entry(key.clone()).or_insert_with(|| ProbableBug {
            id: signature_id(&key),
            target: f.target.clone(),
            kind: f.kind.clone(),
            phase,
            needs,
            findings: vec![],
            hits: 0,
            first_seen_elapsed_s: f64::INFINITY,
        });
        g.findings.push(f.id.clone());
        g.hits += f.hits;
        g.first_seen_elapsed_s = g.first_seen_elapsed_s.min(f.first_seen_elapsed_s);
    }
    let mut out: Vec<ProbableBug> = groups.into_values().collect();
    out.sort_by(|a, b| b.hits.cmp(&a.hits).then(a.first_seen_elapsed_s.total_cmp(&b.first_seen_elapsed_s)));
    out
}

/// A finding's group: its minimized divergence's target, phase and needs, or its own signature.
fn group_key(f: &Finding, dir: &Path) -> (String, Option<String>, Option<Vec<String>>) {
    let minimized: Option<Minimized> = std::fs::read_to_string(dir.join(MINIMIZATION)).ok().and_then(|t| serde_json::from_str(&t).ok());
    match minimized {
        Some(m) if f.kind == "divergent" && m.verdict.kind == VerdictKind::Divergent => {
            let phase = first_divergent(&m.verdict, &m.case).map(|c| place_of(&m.case, &c.tensor).0).unwrap_or_default();
            let needs = m.needs.clone().unwrap_or_else(|| needs(&m.case));
            (format!("{}|divergent|{phase}|{}", f.target, needs.join(",")), Some(phase), Some(needs))
        }
        _ => (f.signature.clone(), None, minimized.map(|m| needs(&m.case))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardfuzz_harnesses::case::{LayerKind, Recompute};

    fn base() -> Case {
        let mut c = Case::from_json(include_str!("../../corpus/dp2-even.json")).unwrap();
        c.parallel.zero_stage = 3;
        c.train.dtype = DType::BF16;
        c
    }

    #[test]
    fn sizes_seeds_and_divisibility_do_not_change_the_needs_but_features_do() {
        let base = base();
        let mut bigger = base.clone();
        let m = bigger.model.as_mut().unwrap();
        m.hidden *= 2;
        m.ffn *= 2;
        m.layers = vec![LayerKind::Mlp];
        bigger.data.seed += 1;
        bigger.parallel.dp = 4;
        bigger.model.as_mut().unwrap().batch = 8;
        assert_eq!(needs(&base), needs(&bigger));
        assert_eq!(needs(&base), vec!["bias", "dp", "dtype=16-bit", "optimizer=adam", "steps>1", "zero3"]);

        let mut shared = base.clone();
        let m = shared.model.as_mut().unwrap();
        m.layer_passes = 2;
        m.activation_checkpointing = Some(Recompute::Reentrant);
        let added: Vec<String> = needs(&shared).into_iter().filter(|n| !needs(&base).contains(n)).collect();
        assert_eq!(added, vec!["activation_checkpointing=reentrant", "shared-blocks"]);
        let mut uneven = base.clone();
        uneven.model.as_mut().unwrap().batch = 5;
        assert_eq!(needs(&uneven), needs(&base));
    }
}
