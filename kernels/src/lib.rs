//! Tensor kernels for shardfuzz: an f64 reference and emulated bf16/f16/f32 on the CPU.
pub mod dtype;
pub use dtype::DType;
