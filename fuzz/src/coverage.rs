//! The coverage map: one byte array with hit counts, fed by three sources hashed into it:
//! (a) SanitizerCoverage edges of the code under test (when the binary was built with
//! `scripts/sancov-build.sh`), (b) the semantic features of each run (strategy, divisibility,
//! padding, collectives and group sizes, dtype, verdict class), (c) coverage handed in by external
//! targets (Python frameworks).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Map size: small maps keep the per-execution cost low (see the LibAFL notes).
pub const MAP_SIZE: usize = 1 << 18;
/// The first half holds edges, the second semantic and external features.
const EDGE_SLOTS: usize = MAP_SIZE / 2;

static mut MAP: [u8; MAP_SIZE] = [0; MAP_SIZE];
static EDGE_GUARDS: AtomicUsize = AtomicUsize::new(0);
static LAST_EXEC_MICROS: AtomicUsize = AtomicUsize::new(0);
static LAST_EXPRESSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// How long the execution that filled the map took (the scheduler prefers cheap entries).
pub fn set_last_exec_time(d: std::time::Duration) {
    LAST_EXEC_MICROS.store(d.as_micros() as usize, Ordering::Relaxed);
}

pub fn last_exec_time() -> std::time::Duration {
    std::time::Duration::from_micros(LAST_EXEC_MICROS.load(Ordering::Relaxed) as u64)
}

/// Whether some target could express the case that ran last (the scheduler never mutates a case
/// that no target can run: its mutants would be refused too).
pub fn set_last_expressed(expressed: bool) {
    LAST_EXPRESSED.store(expressed, Ordering::Relaxed);
}

pub fn last_expressed() -> bool {
    LAST_EXPRESSED.load(Ordering::Relaxed)
}

/// Raw pointer to the map, for the LibAFL observer.
pub fn map_ptr() -> *mut u8 {
    (&raw mut MAP).cast()
}

fn bump(index: usize) {
    // Hit counts from several rank threads may race; a lost increment only blurs a bucket.
    unsafe {
        let p = map_ptr().add(index);
        p.write_volatile(p.read_volatile().wrapping_add(1));
    }
}

/// Marks the feature-half slot of a 64-bit feature hash. A feature is present or not: its slot is
/// set, not counted, since a count above one there only says that other features hashed to the
/// same slot, and each new mix of such collisions read as a new hit-count bucket (a one-hour native
/// campaign kept adding corpus entries for them long after the slots stopped growing). The hash is
/// mixed first (the splitmix64 finalizer): a plain multiply keeps only the low bits, and the low
/// bits of XOR-combined FNV hashes of names that differ in their last characters coincide (4 of 16
/// combinations of four paths shared a slot).
fn bump_feature(h: u64) {
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let index = EDGE_SLOTS + (z % (MAP_SIZE - EDGE_SLOTS) as u64) as usize;
    unsafe { map_ptr().add(index).write_volatile(1) };
}

fn fnv(s: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Records every feature of a run, and every pair, triple and quadruple of its code-path features
/// (prefix `path:`): a case that takes paths never taken together is new coverage even when each
/// path alone is old (the set form of AFL++'s n-gram edge coverage). Bugs live where several paths
/// meet, and each combination on the way there is a step the search keeps.
pub fn add_features_and_combinations(features: &[String]) {
    for f in features {
        bump_feature(fnv(f.as_bytes()));
    }
    let paths: Vec<u64> = features.iter().filter(|f| f.starts_with("path:")).map(|f| fnv(f.as_bytes())).collect();
    for (i, a) in paths.iter().enumerate() {
        for (j, b) in paths.iter().enumerate().skip(i + 1) {
            let ab = a ^ b.rotate_left(17);
            bump_feature(ab);
            for (k, c) in paths.iter().enumerate().skip(j + 1) {
                let abc = ab ^ c.rotate_left(37) ^ 0x7f4a_7c15;
                bump_feature(abc);
                for d in &paths[k + 1..] {
                    bump_feature(abc ^ d.rotate_left(53) ^ 0x2545_f491);
                }
            }
        }
    }
}

/// Coverage handed in by an external target (line/branch hashes from a Python worker).
pub fn add_external_coverage(hashes: &[u64]) {
    for &h in hashes {
        bump_feature(h);
    }
}

/// Number of instrumented edges in this binary (0 when built without SanitizerCoverage).
pub fn edge_guards() -> usize {
    EDGE_GUARDS.load(Ordering::Relaxed)
}

/// The slots hit by the last scanned run, in increasing order (see `scan_hits`).
static HITS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Lists the slots the run now in the map hit, for `hits()`. Eight bytes at a time: a run hits a
/// few thousand of the map's 262,144 slots, and the executor, the scheduler and the coverage count
/// all need the list.
pub fn scan_hits() {
    let mut hits = HITS.lock().expect("hit list");
    hits.clear();
    let words = unsafe { std::slice::from_raw_parts(map_ptr().cast::<u64>(), MAP_SIZE / 8) };
    for (w, &word) in words.iter().enumerate() {
        if word != 0 {
            let bytes = word.to_ne_bytes();
            hits.extend((0..8).filter(|&b| bytes[b] != 0).map(|b| (w * 8 + b) as u32));
        }
    }
}

/// The slots hit by the run `scan_hits` last looked at.
pub fn hits() -> std::sync::MutexGuard<'static, Vec<u32>> {
    HITS.lock().expect("hit list")
}

/// Empties the map and the hit list (a run whose coverage must not count).
pub fn clear() {
    unsafe { std::ptr::write_bytes(map_ptr(), 0, MAP_SIZE) };
    HITS.lock().expect("hit list").clear();
}

/// Number of non-zero entries in the map right now.
pub fn filled() -> usize {
    unsafe { std::slice::from_raw_parts(map_ptr(), MAP_SIZE) }.iter().filter(|b| **b != 0).count()
}

/// SanitizerCoverage callbacks: assign each guard an edge slot.
///
/// # Safety
/// Called by instrumented code with a valid guard range.
#[no_mangle]
pub unsafe extern "C" fn __sanitizer_cov_trace_pc_guard_init(start: *mut u32, stop: *mut u32) {
    if start == stop || *start != 0 {
        return;
    }
    let mut p = start;
    while p < stop {
        let n = EDGE_GUARDS.fetch_add(1, Ordering::Relaxed);
        *p = (n % EDGE_SLOTS) as u32 + 1;
        p = p.add(1);
    }
}

/// # Safety
/// Called by instrumented code with a guard initialised by the function above.
#[no_mangle]
pub unsafe extern "C" fn __sanitizer_cov_trace_pc_guard(guard: *mut u32) {
    let g = *guard;
    if g != 0 {
        bump((g - 1) as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> Vec<u8> {
        unsafe { std::slice::from_raw_parts(map_ptr(), MAP_SIZE) }.to_vec()
    }

    #[test]
    fn every_combination_of_up_to_four_paths_lands_in_the_feature_half() {
        let before = snapshot();
        let features: Vec<String> = ["path:a", "path:b", "path:c", "path:d", "strategy:tp"].iter().map(|s| s.to_string()).collect();
        add_features_and_combinations(&features);
        let after = snapshot();
        let changed = |r: std::ops::Range<usize>| r.filter(|&i| before[i] != after[i]).count();
        assert_eq!(changed(0..EDGE_SLOTS), 0, "features must not touch the edge half");
        // 5 features + 6 pairs + 4 triples + 1 quadruple of the 4 paths; "strategy:tp" joins none.
        let n = changed(EDGE_SLOTS..MAP_SIZE);
        assert_eq!(n, 16, "slots hit by 16 distinct features");
    }
}
