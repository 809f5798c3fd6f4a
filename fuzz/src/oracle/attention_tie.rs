//! Attention within reach of a tie: a saturated softmax row whose top score round-off can carry to
//! its runner-up.
//!
//! A softmax over scores far apart is an argmax. Where a token's key is ill-conditioned (a
//! LayerNorm of large, nearly constant values), round-off moves its scores by tens, and a correct
//! run can land where the top two scores meet: the row's weights split, and every gradient that
//! flows through it (the block's projections, every block below it, the embedding) changes by far
//! more than any member shows, since each member lands somewhere else on the same saturated side.
//! Found by a clean native bf16 campaign: dp2 tp3 with a replicated kv head, where one key's score
//! was −415 in f64, −307 and −325 in two bf16 members, and −276.8 in the sharded run, beside a
//! runner-up at −276.75; the step-0 gradients below that block came out 50 ε off
//! (`tests/clean-cases/bf16-campaign-gqa-attention-tie-tp3-dp2.json`).

use shardfuzz_harnesses::target::{AttentionRow, RunOutput};

use super::ensemble::{is_later_step, Member};

/// A score moved by one unit changes a softmax weight e-fold. Below that, a row's weights move
/// continuously with round-off and the members sample it; a row whose scores the members move by
/// more, and by at least half the margin between its top score and its runner-up, may tie.
pub const TIE_MOVE: f64 = 1.0;

/// The highest block with a row within reach of a tie, and that row's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionTie {
    pub layer: usize,
    /// The most any member moved one of the row's scores.
    pub moved: f64,
    /// The reference's margin between the row's top score and its runner-up.
    pub margin: f64,
}

impl AttentionTie {
    /// Whether tensor `name` depends on the rows of this block's step-0 backward: gradients of
    /// this block, the blocks below it and the embedding, and every tensor of a later step.
    /// Gradients of later blocks, the final norm and the head are computed before it.
    pub fn reaches(&self, name: &str) -> bool {
        if is_later_step(name) {
            return true;
        }
        let Some(param) = name.strip_prefix("grad/") else { return false };
        if param.starts_with("final_norm.") || param.starts_with("lm_head.") {
            return false;
        }
        match param.strip_prefix("layers.").and_then(|rest| rest.split('.').next()).and_then(|n| n.parse::<usize>().ok()) {
            Some(layer) => layer <= self.layer,
            None => true,
        }
    }

    pub fn note(&self) -> String {
        format!(
            "attention in block {} within reach of a tie: round-off moved a score by {:.3} where its row's top score leads by {:.3} (a softmax that may split between two keys): step-0 gradients from that block down and later steps not comparable",
            self.layer, self.moved, self.margin
        )
    }
}

/// The row within reach of a tie in the highest block, if any: members' step-0 scores against the
/// reference's (the routing-flip member is left out: its moves are no round-off).
pub fn attention_near_tie(reference: &RunOutput, members: &[&Member]) -> Option<AttentionTie> {
    let rows = reference.stats.attention_scores.as_ref()?;
    let others: Vec<&Vec<AttentionRow>> = members
        .iter()
        .filter(|m| m.name != "routing-flip" && m.name != "gate-jitter")
        .filter_map(|m| m.output.stats.attention_scores.as_ref())
        .filter(|o| o.len() == rows.len())
        .collect();
    let mut found: Option<AttentionTie> = None;
    for (i, row) in rows.iter().enumerate() {
        let Some(margin) = margin(&row.scores) else { continue };
        let moved = others.iter().map(|o| largest_move(&o[i].scores, &row.scores)).fold(0.0, f64::max);
        if moved >= TIE_MOVE && 2.0 * moved >= margin && found.is_none_or(|f| row.layer > f.layer) {
            found = Some(AttentionTie { layer: row.layer, moved, margin });
        }
    }
    found
}

/// The top score's lead over the next smaller one (scores equal to it, equal keys, tie in every
/// run alike); None for a row of one key or with no smaller score.
fn margin(scores: &[f64]) -> Option<f64> {
    let top = scores.iter().copied().filter(|s| s.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    let runner = scores.iter().copied().filter(|&s| s.is_finite() && s < top).fold(f64::NEG_INFINITY, f64::max);
    (top.is_finite() && runner.is_finite()).then_some(top - runner)
}

fn largest_move(member: &[f64], reference: &[f64]) -> f64 {
    if member.len() != reference.len() {
        return 0.0;
    }
    member.iter().zip(reference).filter(|(a, b)| a.is_finite() && b.is_finite()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rows: Vec<(usize, Vec<f64>)>) -> RunOutput {
        let mut out = RunOutput::default();
        out.stats.attention_scores = Some(rows.into_iter().map(|(layer, scores)| AttentionRow { layer, scores }).collect());
        out
    }

    #[test]
    fn a_saturated_row_whose_scores_round_off_moves_past_half_its_margin_reaches_the_blocks_below() {
        let reference = run(vec![(0, vec![1.0, 2.0]), (2, vec![-415.3, -277.7, -534.1])]);
        let member = Member::new("dtype", run(vec![(0, vec![1.0, 2.0]), (2, vec![-306.9, -278.3, -530.7])]));
        let tie = attention_near_tie(&reference, &[&member]).expect("a tie within reach");
        assert_eq!(tie.layer, 2);
        assert!((tie.moved - 108.4).abs() < 1e-9 && (tie.margin - 137.6).abs() < 1e-9, "{tie:?}");
        assert!(tie.reaches("grad/layers.2.attn.k.weight") && tie.reaches("grad/layers.0.moe.up.weight"));
        assert!(tie.reaches("grad/embed.weight") && tie.reaches("param/layers.3.mlp.up.weight") && tie.reaches("loss/step1"));
        assert!(
            !tie.reaches("grad/layers.3.mlp.up.weight") && !tie.reaches("grad/lm_head.weight") && !tie.reaches("grad/final_norm.weight")
        );
        assert!(!tie.reaches("logits") && !tie.reaches("loss/step0"));
    }

    #[test]
    fn ordinary_round_off_and_exact_ties_of_equal_keys_are_no_tie() {
        // Unsaturated: moved by less than one unit, however small the margin.
        let reference = run(vec![(1, vec![0.50, 0.52, -3.0])]);
        let member = Member::new("split", run(vec![(1, vec![0.51, 0.50, -3.0])]));
        assert_eq!(attention_near_tie(&reference, &[&member]), None);
        // Saturated but far: moved by 3 against a lead of 40.
        let reference = run(vec![(1, vec![400.0, 360.0, 360.0])]);
        let member = Member::new("split", run(vec![(1, vec![397.0, 360.0, 360.0])]));
        assert_eq!(attention_near_tie(&reference, &[&member]), None);
        // Two equal keys tie in every run: the margin is to the next smaller score.
        let reference = run(vec![(1, vec![-20.0, 401.3, 401.3])]);
        let member = Member::new("split", run(vec![(1, vec![-18.0, 401.5, 401.5])]));
        assert_eq!(attention_near_tie(&reference, &[&member]), None);
        // The routing-flip member's moves are no round-off.
        let reference = run(vec![(1, vec![10.0, 5.0])]);
        let member = Member::new("routing-flip", run(vec![(1, vec![0.0, 5.0])]));
        assert_eq!(attention_near_tie(&reference, &[&member]), None);
    }
}
