//! The LibAFL input: a case, stored in the corpus as the same human-editable JSON as hand-written
//! cases (atomic writes; a torn file can never be left behind).

use std::path::Path;

use libafl::corpus::CorpusId;
use libafl::inputs::Input;
use libafl::Error;
use serde::{Deserialize, Serialize};
use shardfuzz_harnesses::case::Case;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CaseInput(pub Case);

/// Stable 64-bit FNV-1a digest of a case's JSON (file names, deduplication).
pub fn case_digest(case: &Case) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in serde_json::to_vec(case).expect("case serialises") {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Input for CaseInput {
    fn to_file<P: AsRef<Path>>(&self, path: P) -> Result<(), Error> {
        libafl_bolts::fs::write_file_atomic(path, self.0.to_json().as_bytes())
    }

    fn from_file<P: AsRef<Path>>(path: P) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path.as_ref())?;
        Case::from_json(&text).map(CaseInput).map_err(|e| Error::serialize(format!("{}: {e}", path.as_ref().display())))
    }

    fn generate_name(&self, _id: Option<CorpusId>) -> String {
        format!("{:016x}.json", case_digest(&self.0))
    }
}
