//! shardfuzz engine: the oracle, the LibAFL fuzzer, campaigns, minimizer and reports.
pub mod bugreport;
pub mod campaign;
pub mod coverage;
pub mod executor;
pub mod findings;
pub mod generate;
pub mod input;
pub mod localize;
pub mod minimize;
pub mod mutators;
pub mod oracle;
pub mod plot;
pub mod report;
pub mod scheduler;
pub mod sensitivity;
pub mod triage;
pub mod trigger_cases;
