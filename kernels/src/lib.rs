//! Tensor kernels for shardfuzz: an f64 reference and emulated bf16/f16/f32 on the CPU.
//!
//! Every tensor is `f64` storage holding values representable in the op's dtype. Each op takes a
//! [`Prec`]: reductions accumulate in f32 for low precision (rounding after every addition) and
//! outputs are rounded to the storage dtype, as GPU frameworks do. F64 is exact (no rounding).

mod activation;
mod attention;
mod clip;
pub mod dtype;
mod elementwise;
mod embedding;
mod linear;
mod loss;
mod moe;
mod norm;
mod optim;
mod prec;
mod rotary;
mod softmax;
#[cfg(test)]
mod testutil;

pub use activation::{gelu_bwd, gelu_fwd, relu_bwd, relu_fwd, sigmoid, silu_bwd, silu_fwd, swiglu_bwd, swiglu_fwd};
pub use attention::{attention_bwd, attention_fwd, AttnCache, AttnShape};
pub use clip::{clip_coefficient, max_abs, scale_in_place, sum_abs, sum_squares};
pub use dtype::DType;
pub use elementwise::{add, add_in_place, scale, sum_into};
pub use embedding::{embedding_bwd, embedding_fwd};
pub use linear::{add_row, linear_bwd, linear_fwd, matmul, matmul_nt, matmul_tn, sum_rows, LinearGrads};
pub use loss::{
    cross_entropy_fwd_bwd, mask_ignored, row_max, row_sum, row_sum_exp, target_logit, CrossEntropy, LabelSmoothing, IGNORED_TARGET,
};
pub use moe::{assign_capacity, capacity, chosen_gates, router_bwd, router_fwd, topk_rows, Routing};
pub use norm::{layernorm_bwd, layernorm_fwd, layernorm_weight_grads, rmsnorm_bwd, rmsnorm_fwd, NormCache, NormGrads};
pub use optim::{adam_step, sgd_step, AdamConfig};
pub use prec::{Prec, Rounding};
pub use rotary::{rotary_bwd, rotary_fwd, RotaryShape};
pub use softmax::{log_softmax_rows, softmax_rows, softmax_rows_bwd};
