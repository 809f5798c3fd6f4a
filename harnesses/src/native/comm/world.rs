//! The shared state of one run: mailboxes, rank status, deadlock detection.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Reduction applied by all-reduce and reduce-scatter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

#[derive(Debug, Clone)]
pub struct WorldOptions {
    pub timeout: Duration,
}

impl Default for WorldOptions {
    fn default() -> Self {
        WorldOptions { timeout: Duration::from_secs(10) }
    }
}

/// Why a communication failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    #[error("rank {rank}: deadlock in {collective} on {group}: waiting for rank {waiting_for} that will never send")]
    Deadlock { rank: usize, collective: String, group: String, waiting_for: usize },
    #[error("rank {rank}: timeout in {collective} on {group}")]
    Timeout { rank: usize, collective: String, group: String },
    #[error("rank {rank}: collective mismatch on {group}: {detail}")]
    Mismatch { rank: usize, group: String, detail: String },
    #[error("rank {rank}: peer rank {peer} crashed")]
    PeerCrashed { rank: usize, peer: usize },
}

/// A rank stuck in a collective when the run hung.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckInfo {
    pub rank: usize,
    pub collective: String,
    pub group: String,
}

/// A process group: global ranks in group order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub ranks: Vec<usize>,
    pub id: u64,
}

impl Group {
    pub fn size(&self) -> usize {
        self.ranks.len()
    }
    pub fn label(&self) -> String {
        format!("{}{:?}", self.name, self.ranks)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Coll { group: u64, seq: u64, step: u32 },
    P2p { tag: u64 },
}

pub(super) struct Msg {
    src: usize,
    key: Key,
    kind: &'static str,
    total: usize,
    data: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq)]
enum Status {
    Running,
    Blocked { src: usize, key: Key },
    Finished,
    Crashed,
}

struct State {
    mailboxes: Vec<VecDeque<Msg>>,
    status: Vec<Status>,
    deadlock: bool,
    stuck: Vec<StuckInfo>,
}

impl State {
    fn has_match(&self, rank: usize, src: usize, key: Key) -> bool {
        self.mailboxes[rank].iter().any(|m| m.src == src && m.key == key)
    }

    /// Every rank finished or blocked, and no blocked rank can be served.
    fn is_deadlocked(&self) -> bool {
        self.status.iter().enumerate().all(|(r, s)| match s {
            Status::Finished | Status::Crashed => true,
            Status::Blocked { src, key } => !self.has_match(r, *src, *key) && !matches!(self.status[*src], Status::Crashed),
            Status::Running => false,
        })
    }
}

/// Shared by all rank threads of one run.
pub struct World {
    size: usize,
    opts: WorldOptions,
    state: Mutex<State>,
    /// One condition variable per rank, so a message wakes only its receiver.
    cvs: Vec<Condvar>,
    features: Mutex<BTreeSet<String>>,
}

impl World {
    pub fn new(size: usize, opts: WorldOptions) -> Arc<World> {
        Arc::new(World {
            size,
            opts,
            state: Mutex::new(State {
                mailboxes: (0..size).map(|_| VecDeque::new()).collect(),
                status: vec![Status::Running; size],
                deadlock: false,
                stuck: vec![],
            }),
            cvs: (0..size).map(|_| Condvar::new()).collect(),
            features: Mutex::new(BTreeSet::new()),
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    fn wake_all(&self) {
        self.cvs.iter().for_each(Condvar::notify_all);
    }

    /// The communicator of `rank`, for its thread only.
    pub fn comm(self: &Arc<World>, rank: usize) -> Comm {
        assert!(rank < self.size, "rank {rank} outside a world of {}", self.size);
        Comm { world: Arc::clone(self), rank, seq: RefCell::new(HashMap::new()), seen: RefCell::new(BTreeSet::new()) }
    }

    pub fn mark_crashed(&self, rank: usize, _message: &str) {
        let mut st = self.state.lock().expect("comm state");
        st.status[rank] = Status::Crashed;
        self.wake_all();
    }

    fn mark_finished(&self, rank: usize) {
        let mut st = self.state.lock().expect("comm state");
        if st.status[rank] != Status::Crashed {
            st.status[rank] = Status::Finished;
        }
        self.wake_all();
    }

    /// Ranks that failed with a deadlock or a timeout, and where they waited.
    pub fn stuck(&self) -> Vec<StuckInfo> {
        let mut s = self.state.lock().expect("comm state").stuck.clone();
        s.sort_by_key(|x| x.rank);
        s.dedup_by_key(|x| x.rank);
        s
    }

    /// Semantic coverage: every (collective, group name, group size) issued in this run.
    pub fn features(&self) -> Vec<String> {
        self.features.lock().expect("features").iter().cloned().collect()
    }

    pub(super) fn post(&self, dst: usize, msg: Msg) {
        let mut st = self.state.lock().expect("comm state");
        st.mailboxes[dst].push_back(msg);
        self.cvs[dst].notify_one();
    }

    pub(super) fn take(
        &self,
        rank: usize,
        src: usize,
        key: Key,
        kind: &'static str,
        total: Option<usize>,
        group: &Group,
    ) -> Result<Vec<f64>, CommError> {
        let deadline = Instant::now() + self.opts.timeout;
        let mut st = self.state.lock().expect("comm state");
        loop {
            if let Some(pos) = st.mailboxes[rank].iter().position(|m| m.src == src && m.key == key) {
                let m = st.mailboxes[rank].remove(pos).expect("position is valid");
                st.status[rank] = Status::Running;
                if m.kind != kind || total.is_some_and(|t| t != m.total) {
                    return Err(CommError::Mismatch {
                        rank,
                        group: group.label(),
                        detail: format!(
                            "rank {rank} is in {kind} of {} elements, rank {src} in {} of {} elements",
                            total.unwrap_or(0),
                            m.kind,
                            m.total
                        ),
                    });
                }
                return Ok(m.data);
            }
            if st.status[src] == Status::Crashed {
                st.status[rank] = Status::Running;
                return Err(CommError::PeerCrashed { rank, peer: src });
            }
            st.status[rank] = Status::Blocked { src, key };
            if st.deadlock || st.is_deadlocked() {
                st.deadlock = true;
                st.stuck.push(StuckInfo { rank, collective: kind.to_string(), group: group.label() });
                st.status[rank] = Status::Finished;
                self.wake_all();
                return Err(CommError::Deadlock { rank, collective: kind.to_string(), group: group.label(), waiting_for: src });
            }
            let now = Instant::now();
            if now >= deadline {
                st.stuck.push(StuckInfo { rank, collective: kind.to_string(), group: group.label() });
                st.status[rank] = Status::Finished;
                self.wake_all();
                return Err(CommError::Timeout { rank, collective: kind.to_string(), group: group.label() });
            }
            st = self.cvs[rank].wait_timeout(st, deadline - now).expect("comm state").0;
        }
    }
}

/// One rank's handle on the world. Not shared between threads.
pub struct Comm {
    pub(super) world: Arc<World>,
    pub(super) rank: usize,
    seq: RefCell<HashMap<u64, u64>>,
    seen: RefCell<BTreeSet<String>>,
}

impl Comm {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world.size
    }

    /// A group handle; no communication is needed to create one.
    pub fn group(&self, name: &str, ranks: Vec<usize>) -> Group {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes().chain(ranks.iter().flat_map(|r| (*r as u64).to_le_bytes())) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Group { name: name.to_string(), ranks, id: h }
    }

    /// Marks this rank finished (its peers can no longer expect messages from it).
    pub fn finish(&self) {
        let seen = std::mem::take(&mut *self.seen.borrow_mut());
        self.world.features.lock().expect("features").extend(seen);
        self.world.mark_finished(self.rank);
    }

    /// Records a code path this rank took (reported with the run's features).
    pub(super) fn note_path(&self, path: &str) {
        self.seen.borrow_mut().insert(format!("path:{path}"));
    }

    /// The next sequence number of a collective on `g`, counted by this rank.
    pub(super) fn next_seq(&self, g: &Group, kind: &'static str) -> u64 {
        self.seen.borrow_mut().insert(format!("coll:{kind}:{}:{}", g.name, g.size()));
        let mut seq = self.seq.borrow_mut();
        let s = seq.entry(g.id).or_insert(0);
        *s += 1;
        *s
    }

    pub(super) fn post(&self, dst: usize, key: Key, kind: &'static str, total: usize, data: Vec<f64>) {
        self.world.post(dst, Msg { src: self.rank, key, kind, total, data });
    }

    pub(super) fn take(&self, src: usize, key: Key, kind: &'static str, total: Option<usize>, g: &Group) -> Result<Vec<f64>, CommError> {
        self.world.take(self.rank, src, key, kind, total, g)
    }

    /// Point-to-point send (global ranks); never blocks.
    pub fn send(&self, dst: usize, tag: u64, data: Vec<f64>) -> Result<(), CommError> {
        self.seen.borrow_mut().insert("p2p:send".into());
        self.post(dst, Key::P2p { tag }, "send/recv", data.len(), data);
        Ok(())
    }

    pub fn recv(&self, src: usize, tag: u64) -> Result<Vec<f64>, CommError> {
        let g = Group { name: "p2p".into(), ranks: vec![src, self.rank], id: 0 };
        self.take(src, Key::P2p { tag }, "send/recv", None, &g)
    }
}
