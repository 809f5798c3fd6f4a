//! Mutators of the model and op shapes.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shardfuzz_harnesses::case::{Activation, Case, FrameworkCheckpoint, HfModel, LayerKind, Model, MoeConfig, NormKind, Real, Recompute};

/// Load-balancing loss coefficients a mutated MoE case may carry: none, and the range models use
/// (Switch Transformer 0.01) up to one that dominates the router's gradient. Random generation does
/// not draw them (its stream is the benchmarks' fixed case stream); campaigns reach them by mutation.
pub const AUX_LOSS_COEFFICIENTS: [Option<Real>; 4] = [None, Some(Real(0.01)), Some(Real(0.1)), Some(Real(1.0))];

/// A dimension made prime, 1, or one above / below a multiple of a degree.
pub fn dimension_edge(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let deg = [c.parallel.tp, c.parallel.dp, c.parallel.pp, 2, 3, 4].choose(rng).copied().unwrap_or(2).max(1);
    let pick = |rng: &mut ChaCha8Rng, old: u32| -> u32 {
        match rng.gen_range(0..4) {
            0 => *[2u32, 3, 5, 7, 11, 13].choose(rng).unwrap_or(&3),
            1 => 1,
            2 => deg * rng.gen_range(1..=3) + 1,
            _ => (deg * rng.gen_range(1..=3)).saturating_sub(1).max(1),
        }
        .min(old.max(2) * 2)
        .clamp(1, 32)
    };
    if let Some(op) = c.op.as_mut() {
        let i = rng.gen_range(0..op.shape.len());
        let v = pick(rng, op.shape[i]);
        let changed = op.shape[i] != v;
        op.shape[i] = v;
        if op.new_shape.is_some() {
            op.new_shape = Some(vec![op.shape.iter().product::<u32>(), 1]);
        }
        return changed;
    }
    let Some(m) = c.model.as_mut() else { return false };
    let slot = match rng.gen_range(0..5) {
        0 => &mut m.ffn,
        1 => &mut m.vocab,
        2 => &mut m.seq,
        3 => &mut m.batch,
        _ => &mut m.ffn,
    };
    let v = pick(rng, *slot);
    let changed = *slot != v;
    *slot = v;
    changed
}

/// Fewer kv heads than the tensor-parallel degree (grouped-query attention replication). Half the
/// time on a degree of 4 when the current one is smaller: only there can the kv heads be more than
/// one and still fewer than tp (each kv head shared by a group of ranks rather than by all).
pub fn kv_heads_below_tp(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    let tp = if c.parallel.tp < 4 && rng.gen_bool(0.5) { 4 } else { c.parallel.tp.max(2) };
    c.parallel.tp = tp;
    let head_dim = (m.hidden / m.heads.max(1)).max(1);
    m.heads = tp * rng.gen_range(1..=2);
    m.hidden = m.heads * head_dim;
    let kv: Vec<u32> = (1..tp).filter(|k| m.heads % k == 0 && tp % k == 0).collect();
    m.kv_heads = *kv.choose(rng).unwrap_or(&1);
    if !m.has_attention() {
        m.layers.push(LayerKind::Attention);
    }
    true
}

/// A vocabulary the tensor-parallel degree does not divide (padding).
pub fn vocab_not_divisible(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    let tp = c.parallel.tp.max(2);
    c.parallel.tp = tp;
    m.vocab = tp * rng.gen_range(1..=8) + rng.gen_range(1..tp);
    true
}

pub fn add_layer(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    if m.layers.len() >= 4 {
        return false;
    }
    let kind = *[LayerKind::Attention, LayerKind::Mlp, LayerKind::Moe].choose(rng).unwrap_or(&LayerKind::Mlp);
    let at = rng.gen_range(0..=m.layers.len());
    m.layers.insert(at, kind);
    if kind == LayerKind::Moe && m.moe.is_none() {
        let experts = rng.gen_range(2..=4);
        m.moe = Some(MoeConfig {
            experts,
            top_k: rng.gen_range(1..=experts),
            capacity_factor: Real(*[0.5, 1.0, 1.25].choose(rng).unwrap_or(&1.0)),
            aux_loss: None,
            pad_to_capacity: false,
            renormalize: rng.gen_bool(0.5),
            shared_ffn: None,
            shared_gate: false,
        });
    }
    true
}

pub fn remove_layer(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    if m.layers.is_empty() {
        return false;
    }
    let at = rng.gen_range(0..m.layers.len());
    m.layers.remove(at);
    true
}

pub fn reorder_layers(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    let before = m.layers.clone();
    m.layers.shuffle(rng);
    m.layers != before
}

/// Norm kind, activation, bias and tied embeddings.
pub fn architecture(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    match rng.gen_range(0..4) {
        0 => m.norm = if m.norm == NormKind::Layernorm { NormKind::Rmsnorm } else { NormKind::Layernorm },
        1 => m.activation = if m.activation == Activation::Gelu { Activation::Swiglu } else { Activation::Gelu },
        2 => m.bias = !m.bias,
        _ => m.tied_embeddings = !m.tied_embeddings,
    }
    true
}

/// Experts, top-k, the capacity factor (token drops) and the load-balancing loss.
pub fn moe_routing(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    let experts = rng.gen_range(1..=4);
    m.moe = Some(MoeConfig {
        experts,
        top_k: rng.gen_range(1..=experts),
        capacity_factor: Real(*[0.25, 0.5, 1.0, 2.0].choose(rng).unwrap_or(&1.0)),
        aux_loss: *AUX_LOSS_COEFFICIENTS.choose(rng).unwrap_or(&None),
        pad_to_capacity: m.moe.as_ref().is_some_and(|c| c.pad_to_capacity),
        renormalize: rng.gen_bool(0.5),
        shared_ffn: m.moe.as_ref().and_then(|c| c.shared_ffn),
        shared_gate: m.moe.as_ref().is_some_and(|c| c.shared_gate),
    });
    if !m.layers.contains(&LayerKind::Moe) {
        m.layers.push(LayerKind::Moe);
    }
    true
}

/// The experts' inputs padded to their capacity or not (another dispatch path, the same math): a case with MoE
/// blocks only.
pub fn moe_pad_to_capacity(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    let Some(moe) = c.model.as_mut().and_then(|m| m.moe.as_mut()) else { return false };
    moe.pad_to_capacity = !moe.pad_to_capacity;
    true
}

/// Each token's gates renormalised over its chosen experts or not (a case with MoE blocks only).
pub fn moe_renormalize(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    let Some(moe) = c.model.as_mut().and_then(|m| m.moe.as_mut()) else { return false };
    moe.renormalize = !moe.renormalize;
    true
}

/// A shared expert added (of a width from 1 to 8, gated or not), its gate switched, or the shared expert removed (a
/// case with MoE blocks only).
pub fn moe_shared_expert(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(moe) = c.model.as_mut().and_then(|m| m.moe.as_mut()) else { return false };
    match (moe.shared_ffn, rng.gen_range(0..3)) {
        (None, _) => {
            moe.shared_ffn = Some(rng.gen_range(1..=8));
            moe.shared_gate = rng.gen_bool(0.5);
        }
        (Some(_), 0) => moe.shared_gate = !moe.shared_gate,
        (Some(_), 1) => moe.shared_ffn = Some(rng.gen_range(1..=8)),
        (Some(_), _) => (moe.shared_ffn, moe.shared_gate) = (None, false),
    }
    true
}

/// Experts spread over expert-parallel ranks, top-k > 1 routing and a capacity below the tokens
/// routed, so experts drop tokens: the all-to-all's split sizes must then follow the kept tokens,
/// not the routing (an MoE bug site that otherwise takes four unrelated steps: a MoE layer, ep > 1,
/// top-k > 1 and a tight capacity).
pub fn moe_capacity_drops(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    let p = &mut c.parallel;
    p.dp = p.dp.max(2);
    let degrees: Vec<u32> = (2..=p.dp).filter(|e| p.dp % e == 0).collect();
    p.ep = *degrees.choose(rng).unwrap_or(&p.dp);
    p.zero_stage = 0;
    let experts = p.ep * rng.gen_range(1..=2);
    let (aux_loss, pad_to_capacity, renormalize) =
        m.moe.as_ref().map_or((None, false, false), |c| (c.aux_loss, c.pad_to_capacity, c.renormalize));
    m.moe = Some(MoeConfig {
        experts,
        top_k: rng.gen_range(2..=experts),
        capacity_factor: Real(*[0.25, 0.5, 0.75].choose(rng).unwrap_or(&0.5)),
        aux_loss,
        pad_to_capacity,
        renormalize,
        shared_ffn: m.moe.as_ref().and_then(|c| c.shared_ffn),
        shared_gate: m.moe.as_ref().is_some_and(|c| c.shared_gate),
    });
    if !m.layers.contains(&LayerKind::Moe) {
        let at = rng.gen_range(0..=m.layers.len());
        m.layers.insert(at, LayerKind::Moe);
    }
    true
}

/// Activation checkpointing switched on (either implementation), to the other implementation, or off (a model
/// case only).
pub fn activation_checkpointing(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    let choices: Vec<Option<Recompute>> =
        std::iter::once(None).chain(Recompute::ALL.map(Some)).filter(|r| *r != m.activation_checkpointing).collect();
    m.activation_checkpointing = *choices.choose(rng).expect("two other choices");
    if m.activation_checkpointing.is_none() {
        c.parallel.framework_checkpoint = None;
    }
    true
}

/// Another `transformers` model class for the case (`model.hf_model`), or the target's default again. Only a model
/// of (attention, mlp) pairs is one, under RMSNorm and SwiGLU for a Llama, a Mistral, a Qwen2, under LayerNorm and
/// GELU with biases and as many kv heads as heads for an OPT and a Falcon (with a rotary embedding), and a model of
/// parallel blocks under LayerNorm and SwiGLU without biases, with a rotary embedding, for a Command: the mutation
/// makes it one (and drops the biases for a Qwen2, whose other projections have none).
pub fn hf_model(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    if m.layers.is_empty() || m.moe.is_some() {
        return false;
    }
    let choices: Vec<Option<HfModel>> = std::iter::once(None).chain(HfModel::ALL.map(Some)).filter(|h| *h != m.hf_model).collect();
    m.hf_model = *choices.choose(rng).expect("other choices");
    if let Some(h) = m.hf_model {
        let parallel_now = m.layers.iter().filter(|k| **k == LayerKind::Parallel).count();
        let blocks = (parallel_now + (m.layers.len() - parallel_now).div_ceil(2)).max(1);
        // (A Falcon's decoder layers are pairs or, with `parallel_attn`, parallel blocks; a Command's parallel blocks.)
        let parallel = h.parallel_blocks() || (h == HfModel::Falcon && rng.gen_bool(0.5));
        m.layers = if parallel { vec![LayerKind::Parallel; blocks] } else { [LayerKind::Attention, LayerKind::Mlp].repeat(blocks) };
        (m.norm, m.activation) = if h.gpt2_math() {
            (NormKind::Layernorm, Activation::Gelu)
        } else if h.parallel_blocks() {
            (NormKind::Layernorm, Activation::Swiglu)
        } else {
            (NormKind::Rmsnorm, Activation::Swiglu)
        };
        if h.rotary_only() {
            if m.rotary_base.is_none() {
                m.rotary_base = Some(*ROTARY_BASES.choose(rng).expect("bases"));
            }
            make_head_even(m);
        }
    }
    match m.hf_model {
        Some(HfModel::Qwen2 | HfModel::Command) => m.bias = false,
        Some(HfModel::Opt) => {
            m.bias = true;
            m.kv_heads = m.heads;
        }
        Some(HfModel::Falcon) => {
            m.bias = true;
            m.kv_heads = m.heads;
        }
        _ => {}
    }
    true
}

/// Query/key norms on (`model.qk_norm`), or off again, on a model that attends.
pub fn qk_norm(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    if !m.has_attention() {
        return false;
    }
    m.qk_norm = !m.qk_norm;
    true
}

/// The bases a rotary position embedding is drawn from (`model.rotary_base`): Llama's 10,000, where the slow pairs
/// barely turn over a short sequence, and small bases whose every pair turns by a large angle per position, so a
/// position handed to the wrong piece of a sequence moves many elements.
pub const ROTARY_BASES: [u32; 3] = [10_000, 100, 10];

/// A rotary position embedding on the queries and keys, another base, or none again (`model.rotary_base`). The
/// head size is made even where it is odd (hidden grows by one per head), as the embedding turns pairs.
pub fn rotary(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    if !m.has_attention() || m.heads == 0 {
        return false;
    }
    // (A Falcon or a Command encodes positions by its rotary embedding only: another base, never none.)
    let rotary_only = m.hf_model.is_some_and(HfModel::rotary_only);
    let choices: Vec<Option<u32>> =
        std::iter::once(None).chain(ROTARY_BASES.map(Some)).filter(|b| *b != m.rotary_base && !(rotary_only && b.is_none())).collect();
    m.rotary_base = *choices.choose(rng).expect("other choices");
    if m.rotary_base.is_some() {
        make_head_even(m);
    }
    true
}

/// An odd head size made even (hidden grows by one per head), as a rotary embedding turns pairs.
fn make_head_even(m: &mut Model) {
    let head = m.hidden / m.heads.max(1);
    if head % 2 == 1 {
        m.hidden = m.heads * (head + 1);
    }
}

/// The framework's own activation checkpoint in another way of keeping the blocks' inputs, or torch's again
/// (`parallel.framework_checkpoint`; the blocks checkpointed, re-entrant or not, when they were not).
pub fn framework_checkpoint(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    if m.activation_checkpointing.is_none() {
        m.activation_checkpointing = Some(*Recompute::ALL.choose(rng).expect("two kinds"));
    }
    let current = c.parallel.framework_checkpoint;
    let choices: Vec<Option<FrameworkCheckpoint>> =
        std::iter::once(None).chain(FrameworkCheckpoint::ALL.map(Some)).filter(|f| *f != current).collect();
    c.parallel.framework_checkpoint = *choices.choose(rng).expect("five other choices");
    true
}

/// The block stack run another number of times with the same parameters (`model.layer_passes`: 1 to 3, so
/// each block is used once or several times per step; a model case only).
pub fn layer_passes(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    let choices: Vec<u32> = (1..=3).filter(|n| *n != m.layer_passes).collect();
    m.layer_passes = *choices.choose(rng).expect("two other choices");
    true
}
