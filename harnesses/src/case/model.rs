//! The model of a case: a small transformer-style stack, and the parameters it owns.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Real;

/// The narrowest hidden size generated or minimized to: below it the norms are degenerate (LayerNorm over one value
/// outputs its bias and has an identically zero weight gradient; over two, an identically zero input gradient), so
/// what a framework computes there is pure round-off with nothing to compare (torch's f32 LayerNorm over one value
/// gives a weight gradient of ~1e-4 of the tensor's scale where the f64 reference's is ~1e-13). Cases written by hand
/// may be narrower.
pub const MIN_HIDDEN: u32 = 4;

/// A transformer-style stack: embedding → blocks (pre-norm residual) → final norm → LM head → cross-entropy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub vocab: u32,
    pub hidden: u32,
    pub ffn: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub seq: u32,
    pub batch: u32,
    /// Blocks in order; each is `x = x + block(norm(x))`.
    pub layers: Vec<LayerKind>,
    #[serde(default)]
    pub norm: NormKind,
    #[serde(default)]
    pub activation: Activation,
    /// Biases on the linear layers (and on LayerNorm).
    #[serde(default = "yes")]
    pub bias: bool,
    /// The LM head reuses the embedding table.
    #[serde(default)]
    pub tied_embeddings: bool,
    /// The embedding's gradient as a sparse tensor (torch's `nn.Embedding(sparse=True)`: the rows of the
    /// tokens seen), reduced sparsely over data-parallel ranks where a target offers it (DDP, DeepSpeed
    /// without ZeRO); the same model and values either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sparse_embedding: bool,
    /// Each block's activations recomputed in the backward instead of kept from the forward (activation
    /// checkpointing), where a target offers it: torch's `torch.utils.checkpoint` around each block with the
    /// re-entrant (autograd.Function) or non-re-entrant (saved-tensor hooks) implementation, a transformers
    /// model's `gradient_checkpointing_enable(use_reentrant=...)`. The same values either way. Absent: no
    /// recomputation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_checkpointing: Option<Recompute>,
    /// How many times the block stack runs per forward, every pass with the same parameters (cross-layer
    /// parameter sharing, as ALBERT and universal transformers do): each block is a module used
    /// `layer_passes` times per step, and its gradient is the sum over its uses. 1 (the default): once.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub layer_passes: u32,
    /// Settings of the `moe` blocks (required when `layers` contains one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
    /// Which `transformers` model class realises the case where a target builds one (colossalai-hybrid: a Llama by
    /// default for RMSNorm + SwiGLU pairs): another class with the same math runs the framework's own code for that
    /// class (its shardformer policy and forwards). Targets that build their own model ignore it. Absent: the
    /// target's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_model: Option<HfModel>,
    /// Rotary position embedding on the queries and keys (RoPE, Llama's half-split layout: within each head, element
    /// c < head_dim/2 turns with c + head_dim/2 by position · base^(−2c/head_dim)), with this base (`rope_theta`).
    /// Positions count from 0 in each sequence, so a framework that splits the sequence (sequence or context
    /// parallelism, pipeline micro-batches) must hand each piece its own positions. Needs an even head size. Absent:
    /// no positional encoding (attention is permutation-equivariant before the causal mask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_base: Option<u32>,
    /// Query/key normalisation: before the rotary embedding, each head's query and key vectors are normalised over
    /// the head size by the model's norm kind, without bias, with a weight per element of every head
    /// (`layers.{i}.attn.q_norm.weight` [heads · head_dim], `k_norm` [kv_heads · head_dim]; Cohere Command R+'s
    /// `use_qk_norm`). Absent: none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
}

/// A `transformers` model class with the case model's (attention, mlp) math (`model.hf_model`): under RMSNorm and
/// SwiGLU (a Llama's), or under LayerNorm and GELU with biases (a GPT-2's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HfModel {
    Llama,
    /// Mistral: Llama's layers (no sliding window at these lengths).
    Mistral,
    /// Qwen2: Llama's layers plus q/k/v biases, built zero and frozen (the case model has none), so only cases
    /// without biases.
    Qwen2,
    /// OPT: GPT-2's math (LayerNorm before each sublayer, tanh GELU, biases; separate q, k, v projections), its
    /// learned position table zero and frozen, so only LayerNorm + GELU cases with biases and as many kv heads as
    /// heads.
    Opt,
    /// Falcon (`new_decoder_architecture` off): GPT-2's math with q, k, v fused head by head and a rotary embedding, so
    /// only LayerNorm + GELU cases with biases, as many kv heads as heads, and `rotary_base`; (attention, mlp) pairs,
    /// or parallel blocks as `parallel_attn`.
    Falcon,
    /// Cohere Command: one parallel block per decoder layer (attention and a SwiGLU MLP side by side on one LayerNorm
    /// without bias), no biases, GQA, a rotary embedding (Cohere's turns interleaved pairs; the q and k projections'
    /// columns are permuted head by head so that it turns the case's halves) and a logit scale of 1, so only `parallel`
    /// layers under LayerNorm and SwiGLU without biases, with `rotary_base`.
    Command,
}

impl HfModel {
    pub const ALL: [HfModel; 6] = [HfModel::Llama, HfModel::Mistral, HfModel::Qwen2, HfModel::Opt, HfModel::Falcon, HfModel::Command];

    pub fn name(self) -> &'static str {
        match self {
            HfModel::Llama => "llama",
            HfModel::Mistral => "mistral",
            HfModel::Qwen2 => "qwen2",
            HfModel::Opt => "opt",
            HfModel::Falcon => "falcon",
            HfModel::Command => "command",
        }
    }

    /// Whether the class's decoder layer is a parallel block (`LayerKind::Parallel`) rather than an (attention, mlp)
    /// pair.
    pub fn parallel_blocks(self) -> bool {
        self == HfModel::Command
    }

    /// Whether the class encodes positions only by its rotary embedding (a case of it needs `rotary_base`).
    pub fn rotary_only(self) -> bool {
        matches!(self, HfModel::Falcon | HfModel::Command)
    }

    /// Whether the class has a GPT-2's math (LayerNorm, GELU, biases) rather than a Llama's.
    pub fn gpt2_math(self) -> bool {
        matches!(self, HfModel::Opt | HfModel::Falcon)
    }
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// The most passes over the block stack a case may ask for (`model.layer_passes`).
pub const MAX_LAYER_PASSES: u32 = 4;

/// How activation checkpointing recomputes a block (`model.activation_checkpointing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    /// `use_reentrant=True`: the block runs under `no_grad` in an autograd.Function and again, with grad,
    /// inside its backward.
    Reentrant,
    /// `use_reentrant=False`: saved-tensor hooks recompute what the backward unpacks.
    NonReentrant,
}

impl Recompute {
    pub const ALL: [Recompute; 2] = [Recompute::Reentrant, Recompute::NonReentrant];

    pub fn name(self) -> &'static str {
        match self {
            Recompute::Reentrant => "reentrant",
            Recompute::NonReentrant => "non_reentrant",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// Causal multi-head attention (GQA when kv_heads < heads).
    Attention,
    /// Dense MLP with the model's activation.
    Mlp,
    /// Mixture of experts: a router and `experts` MLPs, top-k routing with a capacity.
    Moe,
    /// Attention and a dense MLP side by side on one norm's output, both added to the residual stream
    /// (`x + attention(norm(x)) + mlp(norm(x))`: GPT-J's, Falcon's `parallel_attn`, Cohere Command's decoder layer).
    Parallel,
}

impl LayerKind {
    /// Whether the block has an attention sublayer.
    pub fn attends(self) -> bool {
        matches!(self, LayerKind::Attention | LayerKind::Parallel)
    }

    /// Whether the block has a dense MLP sublayer.
    pub fn has_mlp(self) -> bool {
        matches!(self, LayerKind::Mlp | LayerKind::Parallel)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    #[default]
    Layernorm,
    Rmsnorm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    #[default]
    Gelu,
    Swiglu,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    pub experts: u32,
    pub top_k: u32,
    /// Slots per expert = ceil(capacity_factor * tokens * top_k / experts); tokens beyond are dropped.
    pub capacity_factor: Real,
    /// Coefficient of the load-balancing auxiliary loss (Switch Transformer's, per sequence:
    /// experts × Σ_e f_e P_e, f_e the share of the sequence's top-k choices routed to expert e,
    /// P_e its mean router probability), averaged over the batch's sequences and added to the
    /// loss the gradients come from. The reported loss stays the language-model loss alone (as
    /// Megatron logs the auxiliary loss apart). Absent: no auxiliary loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux_loss: Option<Real>,
    /// Every expert's input padded to its capacity with tokens of gate 0 (frameworks' drop-and-pad dispatch,
    /// Megatron's `moe_pad_expert_input_to_capacity`): the same math, another dispatch path. The reference and the
    /// native target compute the unpadded sum.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pad_to_capacity: bool,
    /// Each token's gates divided by their sum over its chosen experts (taken before any is dropped at capacity):
    /// Megatron's softmax after the top-k (`moe_router_pre_softmax` off, its default), DeepSpeed's top-2 gating,
    /// Mixtral's `norm_topk_prob`. With top_k = 1 every gate is 1 and the router learns from the aux loss alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub renormalize: bool,
    /// Width of a shared expert every token passes through, its output added to the routed experts' (Megatron's
    /// `moe_shared_expert_intermediate_size`; DeepSeek's and Qwen's MoE): an MLP with the block's activation and no
    /// biases, `moe.shared.{up,gate,down}.weight`. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_ffn: Option<u32>,
    /// The shared expert's output scaled per token by sigmoid(x · w), w the `[hidden, 1]` parameter
    /// `moe.shared_gate.weight` (Megatron's `moe_shared_expert_gate`). Needs `shared_ffn`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_gate: bool,
}

/// What a parameter is, which decides how it is initialised and sharded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamRole {
    Embedding,
    /// `[in, out]` matrix of a linear layer.
    Weight,
    Bias,
    NormWeight,
    NormBias,
    Router,
    /// `[experts, in, out]` stacked expert matrices.
    ExpertWeight,
    ExpertBias,
}

impl ParamRole {
    /// A vector of the model (a bias or a norm's weight), which `no_decay_vectors` leaves undecayed; an expert's bias
    /// is one too, though the experts' biases are stacked into a matrix (frameworks hold one vector per expert).
    pub fn is_vector(self) -> bool {
        matches!(self, ParamRole::Bias | ParamRole::NormWeight | ParamRole::NormBias | ParamRole::ExpertBias)
    }
}

/// A parameter of the model: its canonical name, full shape and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: ParamRole,
    /// Fan-in used to scale the initial values.
    pub fan_in: usize,
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

impl Model {
    /// Whether any block attends (an attention or a parallel block).
    pub fn has_attention(&self) -> bool {
        self.layers.iter().any(|k| k.attends())
    }

    pub fn head_dim(&self) -> usize {
        (self.hidden / self.heads.max(1)) as usize
    }

    pub fn tokens(&self) -> usize {
        self.batch as usize * self.seq as usize
    }

    /// The blocks in the order the forward runs them: `layers` once per pass (`layer_passes`), as
    /// (index into `layers`, kind).
    pub fn block_sequence(&self) -> Vec<(usize, LayerKind)> {
        let passes = self.layer_passes.max(1) as usize;
        (0..passes).flat_map(|_| self.layers.iter().copied().enumerate()).collect()
    }

    /// Every parameter in a fixed order (the order of gradient norms and optimizer states).
    pub fn params(&self) -> Vec<ParamSpec> {
        let (v, h, f) = (self.vocab as usize, self.hidden as usize, self.ffn as usize);
        let d = self.head_dim();
        let (hq, hkv) = (self.heads as usize, self.kv_heads as usize);
        let mut out = Vec::new();
        let mut push = |name: String, shape: Vec<usize>, role, fan_in| out.push(ParamSpec { name, shape, role, fan_in });
        push("embed.weight".into(), vec![v, h], ParamRole::Embedding, 1);
        let swiglu = self.activation == Activation::Swiglu;
        for (i, kind) in self.layers.iter().enumerate() {
            let pre = format!("layers.{i}");
            push(format!("{pre}.norm.weight"), vec![h], ParamRole::NormWeight, 1);
            if self.norm == NormKind::Layernorm && self.bias {
                push(format!("{pre}.norm.bias"), vec![h], ParamRole::NormBias, 1);
            }
            if kind.attends() {
                for (n, width) in [("q", hq * d), ("k", hkv * d), ("v", hkv * d)] {
                    push(format!("{pre}.attn.{n}.weight"), vec![h, width], ParamRole::Weight, h);
                    if self.bias {
                        push(format!("{pre}.attn.{n}.bias"), vec![width], ParamRole::Bias, h);
                    }
                }
                if self.qk_norm {
                    push(format!("{pre}.attn.q_norm.weight"), vec![hq * d], ParamRole::NormWeight, 1);
                    push(format!("{pre}.attn.k_norm.weight"), vec![hkv * d], ParamRole::NormWeight, 1);
                }
                push(format!("{pre}.attn.o.weight"), vec![hq * d, h], ParamRole::Weight, hq * d);
                if self.bias {
                    push(format!("{pre}.attn.o.bias"), vec![h], ParamRole::Bias, hq * d);
                }
            }
            if kind.has_mlp() {
                push(format!("{pre}.mlp.up.weight"), vec![h, f], ParamRole::Weight, h);
                if self.bias {
                    push(format!("{pre}.mlp.up.bias"), vec![f], ParamRole::Bias, h);
                }
                if swiglu {
                    push(format!("{pre}.mlp.gate.weight"), vec![h, f], ParamRole::Weight, h);
                    if self.bias {
                        push(format!("{pre}.mlp.gate.bias"), vec![f], ParamRole::Bias, h);
                    }
                }
                push(format!("{pre}.mlp.down.weight"), vec![f, h], ParamRole::Weight, f);
                if self.bias {
                    push(format!("{pre}.mlp.down.bias"), vec![h], ParamRole::Bias, f);
                }
            }
            if *kind == LayerKind::Moe {
                let e = self.moe.as_ref().map_or(1, |m| m.experts as usize);
                push(format!("{pre}.moe.router.weight"), vec![h, e], ParamRole::Router, h);
                push(format!("{pre}.moe.up.weight"), vec![e, h, f], ParamRole::ExpertWeight, h);
                if self.bias {
                    push(format!("{pre}.moe.up.bias"), vec![e, f], ParamRole::ExpertBias, h);
                }
                if swiglu {
                    push(format!("{pre}.moe.gate.weight"), vec![e, h, f], ParamRole::ExpertWeight, h);
                    if self.bias {
                        push(format!("{pre}.moe.gate.bias"), vec![e, f], ParamRole::ExpertBias, h);
                    }
                }
                push(format!("{pre}.moe.down.weight"), vec![e, f, h], ParamRole::ExpertWeight, f);
                if self.bias {
                    push(format!("{pre}.moe.down.bias"), vec![e, h], ParamRole::ExpertBias, f);
                }
                if let Some(moe) = self.moe.as_ref().filter(|m| m.shared_ffn.is_some()) {
                    let fs = moe.shared_ffn.unwrap_or(0) as usize;
                    push(format!("{pre}.moe.shared.up.weight"), vec![h, fs], ParamRole::Weight, h);
                    if swiglu {
                        push(format!("{pre}.moe.shared.gate.weight"), vec![h, fs], ParamRole::Weight, h);
                    }
                    push(format!("{pre}.moe.shared.down.weight"), vec![fs, h], ParamRole::Weight, fs);
                    if moe.shared_gate {
                        push(format!("{pre}.moe.shared_gate.weight"), vec![h, 1], ParamRole::Router, h);
                    }
                }
            }
        }
        push("final_norm.weight".into(), vec![h], ParamRole::NormWeight, 1);
        if self.norm == NormKind::Layernorm && self.bias {
            push("final_norm.bias".into(), vec![h], ParamRole::NormBias, 1);
        }
        if !self.tied_embeddings {
            push("lm_head.weight".into(), vec![v, h], ParamRole::Embedding, h);
        }
        out
    }
}
