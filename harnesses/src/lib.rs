//! shardfuzz harnesses: the case model, generated inputs, the f64 reference, the `Target` trait and
//! the targets (the native sharded implementation; Python workers for real frameworks).
pub mod case;
pub mod inputs;
pub mod model;
pub mod native;
pub mod ops;
pub mod reference;
pub mod target;
pub mod tensor;
