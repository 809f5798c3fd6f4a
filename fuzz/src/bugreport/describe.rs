//! A case in plain words, with the divisibility facts a maintainer looks for first.

use shardfuzz_harnesses::case::{
    Case, CheckpointLayout, ClipNorm, FrameworkCheckpoint, OptimizerImplementation, OptimizerKind, PipelineSchedule, Recompute, VocabLoss,
};

fn divides(what: &str, x: u32, by: &str, d: u32) -> Option<String> {
    (d > 1).then(|| {
        let verdict = if x % d == 0 { "divisible" } else { "not divisible" };
        format!("{by}={d} over {what}={x} ({verdict})")
    })
}

/// The parallel layout, e.g. "TP=2 over hidden=10 (not divisible), sequence parallel; DP=2 with ZeRO-2".
fn parallel_words(case: &Case) -> Vec<String> {
    let p = &case.parallel;
    let mut out = vec![];
    match (&case.model, &case.op) {
        (Some(m), _) => {
            let tp = [("hidden", m.hidden), ("ffn", m.ffn), ("vocab", m.vocab), ("heads", m.heads), ("kv_heads", m.kv_heads)];
            out.extend(tp.iter().filter_map(|(w, x)| divides(w, *x, "TP", p.tp)));
            if p.sequence_parallel && p.tp > 1 {
                let how = divides("seq", m.seq, "TP", p.tp).unwrap_or_default();
                out.push(format!("sequence parallel, {} ({how})", p.sequence_parallel_mode.name()));
            }
            if m.sparse_embedding {
                out.push("the embedding's gradient sparse (nn.Embedding(sparse=True))".into());
            }
            if m.layer_passes > 1 {
                out.push(format!("every block used {} times per step (the layer stack run {0} times, parameters shared)", m.layer_passes));
            }
            if let Some(h) = m.hf_model {
                out.push(format!("built as a transformers {} model", h.name()));
            }
            if let Some(b) = m.rotary_base {
                out.push(format!("rotary position embedding on queries and keys (base {b})"));
            }
            if m.qk_norm {
                out.push("query and key vectors normalised per head before the rotary embedding (query/key norms)".into());
            }
            if m.layers.contains(&shardfuzz_harnesses::case::LayerKind::Parallel) {
                out.push("parallel blocks: attention and MLP side by side on one norm's output, both added to the residual".into());
            }
            if let Some(r) = m.activation_checkpointing {
                out.push(format!("activation checkpointing of every block ({}: use_reentrant={})", r.name(), r == Recompute::Reentrant));
            }
            if let Some(f) = p.framework_checkpoint {
                let keep = match f {
                    FrameworkCheckpoint::Plain => "inputs kept as they are",
                    FrameworkCheckpoint::Partition => "inputs partitioned over the model-parallel group (partition_activations)",
                    FrameworkCheckpoint::Cpu => "inputs moved to host memory (cpu_checkpointing)",
                    FrameworkCheckpoint::PartitionCpu => {
                        "inputs partitioned and moved to host memory (partition_activations, cpu_checkpointing)"
                    }
                    FrameworkCheckpoint::Contiguous => "inputs partitioned into contiguous buffers (contiguous_memory_optimization)",
                };
                out.push(format!("the framework's own activation checkpoint, {keep}"));
            }
            match p.vocab_loss {
                VocabLoss::Sharded if p.tp > 1 => out.push("the loss on vocabulary-sharded logits".into()),
                VocabLoss::Gathered if p.tp > 1 => out.push("the loss on logits gathered over the vocabulary".into()),
                _ => {}
            }
            if let Some(n) = p.vocab_divisible_by {
                let multiple = n * p.tp;
                let padded = m.vocab.div_ceil(multiple) * multiple;
                out.push(format!("the vocabulary padded to a multiple of {n} × TP ({} → {padded} rows)", m.vocab));
            }
            out.extend(divides("batch", m.batch, "DP", p.dp));
            out.extend(divides("seq", m.seq, "CP", p.cp));
            if p.pp > 1 {
                out.push(
                    format!("PP={} stages over {} layers, {:?} schedule", p.pp, m.layers.len(), p.pipeline_schedule)
                        .to_lowercase()
                        .replace("pp=", "PP="),
                );
            }
            if p.ep > 1 {
                out.push(format!("EP={} over {} experts", p.ep, m.moe.as_ref().map_or(0, |e| e.experts)));
            }
        }
        (None, Some(op)) => {
            out.push(format!("a {}×{} device mesh [dp, tp]", p.dp, p.tp));
            for (name, places) in &op.placements {
                let shown: Vec<String> = places.iter().map(|x| x.to_string()).collect();
                out.push(format!("{name} placed [{}]", shown.join(", ")));
            }
        }
        _ => {}
    }
    if p.dp > 1 && case.train.grad_accumulation > 1 {
        match p.sync_every_microbatch {
            Some(true) => out.push("gradients reduced after every accumulated micro-batch".into()),
            Some(false) => out.push("gradients accumulated locally, reduced once after the last micro-batch".into()),
            None => {}
        }
    }
    if p.pp > 1 && p.zero_bubble == Some(true) {
        out.push("each backward split into input- and weight-gradient parts (a zero-bubble schedule)".into());
    }
    if p.pp > 1 && p.dual_pipe == Some(true) && p.pipeline_schedule == PipelineSchedule::OneFOneB {
        out.push("DualPipeV: two V-placed stages per rank, forwards overlapped with backwards".into());
    }
    if p.pp > 1 && p.breadth_first == Some(true) && p.pipeline_schedule == PipelineSchedule::Interleaved {
        out.push("each rank's stages run breadth first (looped BFS)".into());
    }
    if p.zero_stage > 0 && p.dp > 1 {
        out.push(format!("ZeRO stage {}{}", p.zero_stage, if p.zero_offload { " with CPU offload" } else { "" }));
        match p.reduce_to_owner {
            Some(true) => out.push("each gradient slice reduced to the rank that owns it".into()),
            Some(false) => out.push("gradient buckets all-reduced, each rank keeping its part".into()),
            None => {}
        }
        if let Some(d) = p.param_shard_dim.filter(|&d| d > 0) {
            out.push(format!("parameters sharded along dimension {d} where it divides evenly (the others along 0)"));
        }
        match p.overlap_param_gather {
            Some(true) => out.push("updated parameters all-gathered asynchronously, waited for at their next use".into()),
            Some(false) => out.push("updated parameters all-gathered before the step returns".into()),
            None => {}
        }
        if p.zero_stage == 3 {
            if let Some(n) = p.persist_below {
                out.push(format!("parameters of at most {n} elements kept whole on every rank (not partitioned)"));
            }
            if let Some(n) = p.optimizer_sub_group {
                out.push(format!("the optimizer stepping each partition in sub-groups of about {n} elements"));
            }
            if let Some(g) = p.reshard_group {
                out.push(format!("parameters resharded after the forward over groups of {g} ranks (a copy per group)"));
            }
            match p.prefetch_bucket {
                Some(0) => out.push("no parameters gathered ahead of their use (prefetch off)".into()),
                Some(n) => out.push(format!("up to {n} elements of parameters gathered ahead of their use")),
                None => {}
            }
            if let Some(n) = p.max_live_parameters {
                out.push(format!("at most {n} elements of gathered parameters alive at once"));
            }
            if let Some(n) = p.max_reuse_distance {
                out.push(format!("a gathered parameter kept only when used again within {n} elements of other uses"));
            }
        }
        match p.round_robin_grads {
            Some(true) => out.push("parameters dealt to the ZeRO partitions round robin".into()),
            Some(false) => out.push("parameters dealt to the ZeRO partitions in model order".into()),
            None => {}
        }
    }
    if p.dp > 1 {
        match p.contiguous_grads {
            Some(true) => out.push("gradients kept in contiguous reduction buffers".into()),
            Some(false) => out.push("gradients kept per parameter (no contiguous reduction buffer)".into()),
            None => {}
        }
        match p.sum_collectives {
            Some(true) => out.push("the gradient reduction's collectives plain sums, the average divided apart".into()),
            Some(false) => out.push("the gradient reduction's collectives averaging themselves".into()),
            None => {}
        }
        match p.explicit_grad_divide {
            Some(true) => out.push("the gradient average's divisor handed to the framework explicitly".into()),
            Some(false) => out.push("the gradient average's divisor derived by the framework".into()),
            None => {}
        }
        match p.static_graph {
            Some(true) => out.push("a static graph: the same parameters in every step, relied on by the reducer".into()),
            Some(false) => out.push("no static graph: the reducer finds the step's parameters each step".into()),
            None => {}
        }
        match p.flat_params {
            Some(true) => out.push("each wrapped unit's parameters exposed as one flat parameter".into()),
            Some(false) => out.push("the original parameters kept as views into the flat ones".into()),
            None => {}
        }
        match p.param_buckets {
            Some(true) => out.push("each rank's optimizer partition packed into one contiguous parameter bucket".into()),
            Some(false) => out.push("each rank's optimizer partition kept as separate parameters".into()),
            None => {}
        }
        match p.find_unused {
            Some(true) => out.push("the reducer searching each step's graph for parameters without a gradient".into()),
            Some(false) => out.push("the reducer expecting a gradient for every parameter".into()),
            None => {}
        }
        if let Some(g) = p.zero_shard_group {
            out.push(format!("hybrid sharding: sharded within groups of {g} data-parallel ranks, replicated across {}", p.dp / g));
        }
        if let Some(b) = p.reduce_bucket {
            out.push(format!("gradient-reduction buckets of {b} elements"));
        }
        match p.overlap_comm {
            Some(true) => out.push("the gradient reduction overlapped with the backward".into()),
            Some(false) => out.push("the gradient reduction not overlapped with the backward".into()),
            None => {}
        }
        match p.reduce_scatter {
            Some(true) => out.push("the gradient reduction as a reduce-scatter".into()),
            Some(false) => out.push("the gradient reduction as all-reduces, not a reduce-scatter".into()),
            None => {}
        }
        if let Some(f) = p.grad_predivide {
            out.push(format!("gradients pre-divided by {f} before the reduction (DP={})", p.dp));
        }
    }
    if p.microbatches > 1 {
        out.push(format!("{} micro-batches", p.microbatches));
    }
    out
}

/// The workload, e.g. "a 2-layer model (attention, mlp), vocab 7, hidden 4, …".
fn workload_words(case: &Case) -> String {
    if let Some(op) = &case.op {
        let shape: Vec<String> = op.shape.iter().map(|x| x.to_string()).collect();
        let dim = op.dim.map(|d| format!(" along dim {d}")).unwrap_or_default();
        return format!("the op `{:?}`{dim} on shape [{}] ({})", op.kind, shape.join(", "), op.kind.shape_help()).to_lowercase();
    }
    let Some(m) = &case.model else { return String::new() };
    let layers: Vec<String> = m.layers.iter().map(|l| format!("{l:?}").to_lowercase()).collect();
    format!(
        "a {}-layer model ({}), vocab {}, hidden {}, ffn {}, {} heads / {} kv heads, sequence {}, batch {}, {:?} norm, {:?}{}{}",
        m.layers.len(),
        layers.join(", "),
        m.vocab,
        m.hidden,
        m.ffn,
        m.heads,
        m.kv_heads,
        m.seq,
        m.batch,
        m.norm,
        m.activation,
        if m.bias { ", biases" } else { ", no biases" },
        if m.tied_embeddings { ", tied embeddings" } else { "" },
    )
}

fn train_words(case: &Case) -> String {
    let t = &case.train;
    let opt = match t.optimizer.kind {
        OptimizerKind::Sgd => "SGD",
        OptimizerKind::Adam => "Adam",
        OptimizerKind::Adamw => "AdamW",
    };
    let mut s = format!("{} step(s) of {opt} (lr {})", t.steps, t.optimizer.lr.0);
    let decay = t.optimizer.weight_decay.0;
    if decay != 0.0 {
        s += &format!(", weight decay {decay}");
        if t.optimizer.no_decay_vectors {
            s += " on matrices only (biases and norm weights in a parameter group without it)";
        }
    }
    s += match t.optimizer.implementation {
        Some(OptimizerImplementation::ForLoop) => ", its for-loop implementation (foreach=False)",
        Some(OptimizerImplementation::Foreach) => ", its foreach implementation (foreach=True; clipping's too)",
        Some(OptimizerImplementation::Fused) => ", its fused implementation (fused=True)",
        None => "",
    };
    if t.grad_accumulation > 1 {
        s += &format!(", {} accumulation steps", t.grad_accumulation);
    }
    if t.per_token_loss {
        s += ", the loss normalised by the framework's per-token path (summed losses, gradients divided by the global token count)";
    }
    if t.local_mean_loss {
        s += ", each micro-batch's loss the mean over its own tokens (reduction=\"mean\"), weighted by their share of the global count";
    }
    if t.compiled {
        s += ", the model compiled (torch.compile, backend aot_eager)";
    }
    if let Some(c) = &t.clip_grad_norm {
        s += &format!(", gradient clipping at {}", c.0);
        s += match t.clip_norm_type {
            Some(ClipNorm::L1) => " of the L1 norm (norm_type=1)",
            Some(ClipNorm::Inf) => " of the infinity norm (norm_type=inf, the largest |gradient|)",
            _ => "",
        };
    }
    if let Some(l) = &t.loss_scale {
        s += &format!(", loss scale {}", l.0);
    }
    s += &format!(", dtype {}", t.dtype);
    if let Some(r) = t.reduce_dtype {
        s += &format!(" (reductions in {r})");
    }
    match t.master_dtype {
        Some(m) if m != t.dtype => s += &format!(" (parameters and optimizer states kept in {m}, computed on a copy in {})", t.dtype),
        Some(_) => s += " (parameters stepped in place, no master copy)",
        None => {}
    }
    if let Some(a) = t.grad_accum_dtype {
        s += &format!(" (gradients accumulated in {a})");
    }
    match t.resume_after {
        Some(0) => s += ", checkpointed before its first step (a seed checkpoint) and resumed from the checkpoint",
        Some(k) => s += &format!(", checkpointed after step {k} of {} and resumed from the checkpoint", t.steps),
        None => {}
    }
    match t.checkpoint_layout {
        Some(CheckpointLayout::Sharded) => s += " (sharded: each rank writes and reads its own shards)",
        Some(CheckpointLayout::Gathered) => s += " (gathered to one rank to write, scattered from it on load)",
        Some(CheckpointLayout::Universal) => {
            s += " (written sharded, converted to a universal checkpoint, one file per parameter and state, and loaded from that)"
        }
        None => {}
    }
    if let Some(q) = &t.resume_parallel {
        let changes: Vec<String> = q
            .differing_fields(&case.parallel)
            .iter()
            .map(|name| format!("{name} {}", q.json_field(name).map_or("unset".to_string(), |v| v.to_string())))
            .collect();
        s += &format!(", resumed into another parallel layout ({})", changes.join(", "));
    }
    if !t.frozen.is_empty() {
        s += &format!(", {} frozen (requires_grad=False)", t.frozen.join(", "));
    }
    s += &format!(", {:?} data (seed {})", case.data.distribution, case.data.seed).to_lowercase();
    if let Some(ig) = &case.data.ignored {
        s += &format!(", {:.0} % of the targets ignored ({:?})", ig.fraction.get() * 100.0, ig.pattern).to_lowercase();
    }
    if case.data.class_weights {
        s += ", a class-weighted loss";
    }
    if let Some(e) = t.label_smoothing {
        s += &format!(", label smoothing {} (torch's definition)", e.0);
    }
    s
}

/// A library op, its sample, mesh and placements in plain words.
fn library_op_words(case: &Case) -> Option<Vec<String>> {
    let l = case.library_op.as_ref()?;
    let mesh: Vec<String> = l.mesh.iter().map(|d| d.to_string()).collect();
    let mut lines = vec![format!(
        "the framework's op `{}` (its sample input {}{}) on a {} mesh of {} ranks",
        l.full_name(),
        l.sample,
        if l.backward { ", forward and backward" } else { ", forward only" },
        mesh.join("×"),
        l.world()
    )];
    let places: Vec<String> = l
        .placements
        .iter()
        .enumerate()
        .map(|(j, p)| format!("argument {j} [{}]", p.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")))
        .collect();
    lines.push(if places.is_empty() {
        "every argument replicated".into()
    } else {
        format!("placements per mesh dim: {}", places.join("; "))
    });
    Some(lines)
}

/// The case in plain words, one line per aspect.
pub fn describe(case: &Case) -> Vec<String> {
    if let Some(mut lines) = library_op_words(case) {
        lines.push(train_words(case).split(", ").filter(|w| w.starts_with("dtype") || w.contains("seed")).collect::<Vec<_>>().join(", "));
        return lines;
    }
    let mut lines = vec![workload_words(case)];
    let par = parallel_words(case);
    lines.push(if par.is_empty() { "no parallelism".into() } else { par.join("; ") });
    lines.push(train_words(case));
    lines
}
