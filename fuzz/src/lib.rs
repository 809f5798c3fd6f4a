//! shardfuzz engine: the oracle, the LibAFL fuzzer, campaigns, minimizer and reports.
pub mod generate;
pub mod oracle;
