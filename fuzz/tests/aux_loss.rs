//! The MoE load-balancing loss: its gradient is the derivative of the loss it describes, and the
//! sharded native target computes the same gradients as the single-device reference.

use shardfuzz_fuzz::oracle::{evaluate, Oracle, VerdictKind};
use shardfuzz_fuzz::trigger_cases::case;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::reference;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};
use shardfuzz_kernels::DType;

const EXPERTS: usize = 4;
const TOP_K: usize = 2;
const COEF: f64 = 0.7;

fn moe_case(parallel: &str) -> Case {
    let model = format!(
        r#", "layers": ["moe", "attention"], "seq": 5, "batch": 4,
           "moe": {{"experts": {EXPERTS}, "top_k": {TOP_K}, "capacity_factor": 4.0, "aux_loss": {COEF}}}"#
    );
    case(parallel, &model, r#", "steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}, "clip_grad_norm": null"#, 11)
}

/// The language-model loss plus the load-balancing loss at `inputs`, with each sequence's routing
/// counts taken from `counts_from` (the counts are not differentiated).
fn objective(c: &Case, inputs: &Inputs, counts_from: &[f64]) -> f64 {
    let out = reference::run(c, inputs, DType::F64).unwrap();
    let lm = out.tensor("loss/step0").unwrap().data[0];
    let probs = out.stats.router_probs.as_ref().unwrap();
    let m = c.model.as_ref().unwrap();
    let (seq, batch) = (m.seq as usize, m.batch as usize);
    let mut aux = 0.0;
    for b in 0..batch {
        let rows = b * seq..(b + 1) * seq;
        let mut f = [0.0; EXPERTS];
        for t in rows.clone() {
            let row = &counts_from[t * EXPERTS..(t + 1) * EXPERTS];
            let mut order: Vec<usize> = (0..EXPERTS).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            order[..TOP_K].iter().for_each(|&e| f[e] += 1.0 / (seq * TOP_K) as f64);
        }
        let p_mean: Vec<f64> = (0..EXPERTS).map(|e| rows.clone().map(|t| probs[t * EXPERTS + e]).sum::<f64>() / seq as f64).collect();
        aux += COEF * EXPERTS as f64 * (0..EXPERTS).map(|e| f[e] * p_mean[e]).sum::<f64>();
    }
    lm + aux / batch as f64
}

#[test]
fn the_aux_loss_gradient_is_the_derivative_of_the_loss_plus_the_aux_loss() {
    let c = moe_case("");
    let inputs = Inputs::generate(&c);
    let out = reference::run(&c, &inputs, DType::F64).unwrap();
    let counts_from = out.stats.router_probs.clone().unwrap();
    let mut without = c.clone();
    without.model.as_mut().unwrap().moe.as_mut().unwrap().aux_loss = None;
    let plain = reference::run(&without, &inputs, DType::F64).unwrap();
    for name in ["layers.0.moe.router.weight", "embed.weight", "layers.0.norm.weight"] {
        let grad = out.tensor(&format!("grad/{name}")).unwrap();
        let plain_grad = plain.tensor(&format!("grad/{name}")).unwrap();
        let at = inputs.tensors.iter().position(|(n, _)| n == name).unwrap();
        let mut moved = 0.0f64;
        for i in (0..grad.data.len()).step_by(grad.data.len().div_ceil(6)) {
            let h = 1e-6;
            let shifted = |d: f64| {
                let mut x = inputs.clone();
                x.tensors[at].1.data[i] += d;
                objective(&c, &x, &counts_from)
            };
            let fd = (shifted(h) - shifted(-h)) / (2.0 * h);
            assert!((fd - grad.data[i]).abs() <= 1e-6 * (1.0 + fd.abs()), "{name}[{i}]: finite difference {fd}, gradient {}", grad.data[i]);
            moved = moved.max((grad.data[i] - plain_grad.data[i]).abs());
        }
        assert!(moved > 1e-4, "{name}: the aux loss did not change the gradient ({moved})");
    }
}

#[test]
fn sharded_runs_with_an_aux_loss_pass_and_the_local_token_fault_is_seen() {
    let mut clean = create("native", &TargetOptions::default()).unwrap();
    for parallel in [
        r#", "tp": 2, "sequence_parallel": true"#,
        r#", "dp": 2, "ep": 2"#,
        r#", "pp": 2, "microbatches": 2"#,
        r#", "tp": 2, "dp": 2, "microbatches": 2"#,
    ] {
        let v = evaluate(clean.as_mut(), &moe_case(parallel), &Oracle::default());
        assert_eq!(v.kind, VerdictKind::Pass, "{parallel}: {}", v.reason);
    }
    let mut buggy = create("native", &TargetOptions { inject: vec!["aux-loss-local-tokens".into()], timeout_ms: 10_000 }).unwrap();
    let v = evaluate(buggy.as_mut(), &moe_case(r#", "tp": 2, "sequence_parallel": true"#), &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
}
