//! Targets backed by a persistent Python worker (`harnesses/python/shardfuzz_worker`): PyTorch, JAX,
//! DeepSpeed and Megatron-core run a case's sharded path there.
//!
//! The worker speaks JSON lines on stdin/stdout; tensors travel as safetensors files in a scratch
//! directory (on tmpfs when there is one). The worker keeps its rank processes alive between cases;
//! this side restarts the worker only when it died or stopped answering. The worker runs in its own
//! process group, killed as a whole when the target is dropped, and polls its parent so that it
//! also goes away when the fuzzer is killed.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::{Outcome, RunOutput, RunStats, StuckRank, Target};
use crate::case::{Case, VocabularyEntry};
use crate::inputs::Inputs;
use crate::tensor::Tensor;

/// Environment variable naming the Python interpreter (the `--python` flag sets it).
pub const PYTHON_ENV: &str = "SHARDFUZZ_PYTHON";
/// Environment variable naming the directory that holds the `shardfuzz_worker` package.
pub const WORKER_PATH_ENV: &str = "SHARDFUZZ_WORKER_PATH";
/// Environment variable with a test hook the worker obeys on the first case (`sleep`, `kill-rank`,
/// `kill-worker`, `worker-raises`, …: see `shardfuzz_worker/__main__.py`).
pub const TEST_HOOK_ENV: &str = "SHARDFUZZ_TEST_HOOK";

/// Environment variable that makes the target restart its worker after every case (benchmarks).
pub const RESPAWN_ENV: &str = "SHARDFUZZ_RESPAWN_EVERY_CASE";

/// How long the worker may take to import its framework and say it is ready.
const STARTUP: Duration = Duration::from_secs(300);
/// Extra time this side waits beyond the case timeout before it declares the worker itself hung:
/// the worker's own timeout excludes starting a rank pool (import, fork, gloo rendezvous).
const GRACE: Duration = Duration::from_secs(150);
/// The same for a case the worker runs in its own process (simulated ranks, JAX host devices): no
/// rank pool to start, and nothing in the worker bounds a Python loop that never ends.
const IN_PROCESS_GRACE: Duration = Duration::from_secs(10);
const STDERR_LINES: usize = 200;

/// How long this side waits for the worker's reply to a case whose own timeout is `timeout`.
fn reply_deadline(timeout: Duration, in_process: bool) -> Duration {
    timeout + if in_process { IN_PROCESS_GRACE } else { GRACE }
}

/// The interpreter a target runs in. `$SHARDFUZZ_PYTHON` (what `--python` sets) is a comma-separated list
/// of `TARGET=PATH` entries and at most one plain `PATH`: a target's own entry wins, then the plain path;
/// without either, the environment the target declares (`env`: `main` is the project's `.venv`, any other
/// name `.venv-NAME`, as `scripts/setup-python.sh` builds them), else `python3`.
pub fn python_interpreter_for(target: &str, env: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(PYTHON_ENV) {
        let spec = p.to_string_lossy().into_owned();
        let entries: Vec<&str> = spec.split(',').filter(|e| !e.is_empty()).collect();
        let own = entries.iter().find_map(|e| e.strip_prefix(target).and_then(|rest| rest.strip_prefix('=')));
        let plain = entries.iter().find(|e| !is_target_entry(e));
        if let Some(path) = own.or(plain.copied()) {
            return PathBuf::from(path);
        }
    }
    let dir = if env == MAIN_ENV { ".venv".to_string() } else { format!(".venv-{env}") };
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir).join("bin/python");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

/// The environment most targets run in (`.venv`).
pub const MAIN_ENV: &str = "main";

/// Whether a `--python` entry is `TARGET=PATH` (a target name has no `/`).
pub fn is_target_entry(entry: &str) -> bool {
    entry.split_once('=').is_some_and(|(t, _)| !t.is_empty() && !t.contains('/'))
}

pub fn worker_path() -> PathBuf {
    std::env::var_os(WORKER_PATH_ENV).map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("python"))
}

/// The worker's `PYTHONPATH`: the worker package first, then what the user's environment adds.
pub fn worker_pythonpath() -> std::ffi::OsString {
    let mut paths = vec![worker_path()];
    if let Some(extra) = std::env::var_os("PYTHONPATH") {
        paths.extend(std::env::split_paths(&extra));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| worker_path().into_os_string())
}

fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new().prefix("shardfuzz-").tempdir_in(shm) {
            return Ok(d);
        }
    }
    tempfile::Builder::new().prefix("shardfuzz-").tempdir()
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Worker {
    /// The reply to request `id` (anything else on the line, a stale reply, is skipped).
    fn reply(&self, id: u64, within: Duration) -> Result<Value, RecvTimeoutError> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let line = self.lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))?;
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["id"].as_u64() == Some(id) {
                    return Ok(v);
                }
            }
        }
    }

    fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().map(|l| l.iter().cloned().collect::<Vec<_>>()).unwrap_or_default();
        lines.join("\n")
    }

    fn kill(&mut self) {
        let pgid = self.child.id() as i32;
        // SAFETY: plain syscall; the worker leads its own process group (spawned with process_group(0)).
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A target whose sharded path runs in a Python worker.
pub struct PythonTarget {
    name: String,
    python: PathBuf,
    scratch: tempfile::TempDir,
    /// Time a case may take before it is a hang.
    timeout: Duration,
    /// The same for a library-op case.
    op_timeout: Duration,
    /// Multiplies the timeouts while a hang is confirmed (1 otherwise); above 1 the worker also
    /// waits out a known hang's site instead of cutting it.
    patience: u32,
    /// The last case hung in the worker's own process and was waited out in full (not cut at a
    /// known hang's site): a model case there is given more time before its hang stands.
    waited_out_in_process: bool,
    worker: Option<Worker>,
    versions: BTreeMap<String, String>,
    next_id: u64,
    coverage: Vec<u64>,
    respawn_every_case: bool,
    /// The worker's library ops, once asked for.
    vocabulary: Option<Vec<VocabularyEntry>>,
}

impl PythonTarget {
    /// Starts the worker for `name`; fails when Python or the framework is not available.
    pub fn new(name: &str, env: &str, timeout: Duration, op_timeout: Duration) -> Result<PythonTarget, String> {
        let mut t = PythonTarget {
            name: name.to_string(),
            python: python_interpreter_for(name, env),
            scratch: scratch_dir().map_err(|e| format!("scratch directory: {e}"))?,
            timeout,
            op_timeout,
            patience: 1,
            waited_out_in_process: false,
            worker: None,
            versions: BTreeMap::new(),
            next_id: 0,
            coverage: vec![],
            respawn_every_case: std::env::var_os(RESPAWN_ENV).is_some(),
            vocabulary: None,
        };
        t.start()?;
        Ok(t)
    }

    fn start(&mut self) -> Result<(), String> {
        let mut cmd = Command::new(&self.python);
        cmd.args(["-u", "-m", "shardfuzz_worker", "--target", &self.name])
            .env("PYTHONPATH", worker_pythonpath())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("OMP_NUM_THREADS", "1")
            .env("TOKENIZERS_PARALLELISM", "false")
            .env("SHARDFUZZ_PARENT_PID", std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| format!("{}: cannot start {}: {e}", self.name, self.python.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail2 = tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if std::env::var_os("SHARDFUZZ_WORKER_STDERR").is_some() {
                    eprintln!("[worker] {line}");
                }
                if let Ok(mut t) = tail2.lock() {
                    if t.len() == STDERR_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }
        });
        let mut w = Worker { child, stdin, lines, stderr: tail };
        let hello = match w.lines.recv_timeout(STARTUP) {
            Ok(l) => l,
            Err(_) => {
                let tail = w.stderr_tail();
                w.kill();
                return Err(format!("{}: the worker did not start ({}): {tail}", self.name, self.python.display()));
            }
        };
        let v: Value = serde_json::from_str(&hello).map_err(|e| format!("{}: bad hello from the worker: {e}: {hello}", self.name))?;
        match v["event"].as_str() {
            Some("ready") => {
                self.versions = v["versions"]
                    .as_object()
                    .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
                    .unwrap_or_default();
                self.versions.insert("python-executable".into(), self.python.display().to_string());
                self.worker = Some(w);
                Ok(())
            }
            _ => {
                w.kill();
                Err(format!("{}: unavailable: {}", self.name, v["reason"].as_str().unwrap_or(&hello)))
            }
        }
    }

    fn ensure_worker(&mut self) -> Result<(), String> {
        if self.worker.is_none() {
            self.start()?;
        }
        Ok(())
    }

    fn drop_worker(&mut self) {
        if let Some(mut w) = self.worker.take() {
            w.kill();
        }
    }

    // The error is the run's outcome (a crash or hang), returned once per case: its size is no cost.
    #[allow(clippy::result_large_err)]
    fn request(&mut self, case: &Case, inputs: &Inputs, processes: bool) -> Result<Value, Outcome> {
        self.ensure_worker().map_err(|e| Outcome::Crash { rank: None, message: e, features: vec![] })?;
        self.next_id += 1;
        let id = self.next_id;
        let in_path = self.scratch.path().join("inputs.safetensors");
        let out_path = self.scratch.path().join("outputs.safetensors");
        let _ = std::fs::remove_file(&out_path);
        write_inputs(&in_path, inputs).map_err(|e| Outcome::Crash {
            rank: None,
            message: format!("writing inputs: {e}"),
            features: vec![],
        })?;
        let op = case.library_op.is_some();
        let timeout = if op { self.op_timeout } else { self.timeout } * self.patience.max(1);
        let mut msg = json!({
            "cmd": "run", "id": id, "case": case, "inputs": in_path, "output": out_path,
            "timeout_s": timeout.as_secs_f64(), "processes": processes, "patient": self.patience > 1,
        });
        // Test hooks apply to the first case only, so that a test sees the next case recover.
        if let (Ok(hook), 1) = (std::env::var(TEST_HOOK_ENV), id) {
            msg["test_hook"] = json!(hook);
        }
        let sent = self.send(&msg);
        let w = self.worker.as_mut().expect("started above");
        // A worker whose library-op cases start a rank pool says so (`library-op-ranks`); JAX's
        // host devices and torch's simulated ranks live in the worker itself.
        let pool = self.versions.get("library-op-ranks").is_some_and(|v| !v.starts_with("LocalTensorMode"));
        let deadline = reply_deadline(timeout, op && !processes && !pool);
        let reply = match sent {
            Err(e) => Err(format!("cannot write to the worker: {e}")),
            Ok(()) => match w.reply(id, deadline) {
                Ok(v) => Ok(v),
                Err(RecvTimeoutError::Timeout) => {
                    self.drop_worker();
                    return Err(Outcome::Hang {
                        stuck: vec![],
                        detail: format!("the worker did not answer within {:.0} s", deadline.as_secs_f64()),
                        features: vec![],
                    });
                }
                Err(RecvTimeoutError::Disconnected) => Err("the worker exited".to_string()),
            },
        };
        match reply {
            Ok(v) => Ok(v),
            Err(why) => {
                let mut w = self.worker.take().expect("present");
                std::thread::sleep(Duration::from_millis(50));
                let status = w.child.try_wait().ok().flatten().map(|s| format!(" ({s})")).unwrap_or_default();
                let tail = w.stderr_tail();
                w.kill();
                let last = abort_line(&tail);
                Err(Outcome::Crash { rank: None, message: format!("{why}{status} mid-case: {last}"), features: vec![] })
            }
        }
    }
}

impl Drop for PythonTarget {
    fn drop(&mut self) {
        if let Some(w) = self.worker.as_mut() {
            let _ = writeln!(w.stdin, "{}", json!({"cmd": "quit"}));
            let _ = w.stdin.flush();
        }
        std::thread::sleep(Duration::from_millis(20));
        self.drop_worker();
    }
}

impl Target for PythonTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn versions(&self) -> BTreeMap<String, String> {
        self.versions.clone()
    }

    fn run(&mut self, case: &Case, inputs: &Inputs) -> Outcome {
        let mut outcome = self.run_in_worker(case, inputs, false);
        if matches!(outcome, Outcome::Hang { .. }) && case.library_op.is_some() {
            if let Some(reason) = self.single_device_too_slow(case) {
                outcome = Outcome::Unsupported { reason };
            }
        }
        if self.respawn_every_case {
            self.drop_worker();
        }
        outcome
    }

    fn take_coverage(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.coverage)
    }

    fn rerun_fresh(&mut self, case: &Case, inputs: &Inputs) -> Option<Outcome> {
        if case.library_op.is_some() {
            return None; // (confirmed on real ranks instead, see `confirm`)
        }
        let coverage = std::mem::take(&mut self.coverage);
        self.drop_worker(); // its rank pools die with it
        let outcome = self.run_in_worker(case, inputs, false);
        self.coverage = coverage;
        Some(outcome)
    }

    fn confirm(&mut self, case: &Case, inputs: &Inputs, patience: u32) -> Option<Outcome> {
        if case.library_op.is_none() {
            return self.patient_model_case(case, inputs, patience);
        }
        // Only a worker that simulated its ranks in one process has real ones to confirm on (JAX's
        // host devices are real already).
        let simulated = self.versions.get("library-op-ranks").is_some_and(|v| v.starts_with("LocalTensorMode"));
        if !simulated {
            return None;
        }
        let coverage = std::mem::take(&mut self.coverage);
        // A hang gets more time in the simulation first (one process, where real ranks would
        // each redo the sharding work on the same cores): a case that is only slow finishes there.
        let patient = (patience > 1).then(|| {
            self.patience = patience;
            let outcome = self.run_in_worker(case, inputs, false);
            self.patience = 1;
            outcome
        });
        // A case that still does not finish is not taken to real ranks: they redo the sharding work
        // each, on the same cores, and at the plain timeout they could not tell slow from hung either.
        let outcome = match patient {
            Some(o) => o,
            None => self.run_in_worker(case, inputs, true),
        };
        self.coverage = coverage;
        Some(outcome)
    }

    fn vocabulary(&mut self) -> Result<Vec<VocabularyEntry>, String> {
        if let Some(v) = &self.vocabulary {
            return Ok(v.clone());
        }
        self.ensure_worker()?;
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"cmd": "vocabulary", "id": id})).map_err(|e| format!("{}: {e}", self.name))?;
        let w = self.worker.as_mut().expect("started above");
        let reply = w
            .reply(id, STARTUP)
            .map_err(|_| format!("{}: no vocabulary within {} s: {}", self.name, STARTUP.as_secs(), w.stderr_tail()))?;
        if reply["status"] != "ok" {
            return Err(format!("{}: reading its op vocabulary failed: {}", self.name, reply["reason"].as_str().unwrap_or_default()));
        }
        let ops: Vec<VocabularyEntry> =
            serde_json::from_value(reply["ops"].clone()).map_err(|e| format!("{}: bad vocabulary from the worker: {e}", self.name))?;
        self.vocabulary = Some(ops.clone());
        Ok(ops)
    }
}

impl PythonTarget {
    /// Writes one request line to the started worker.
    fn send(&mut self, msg: &Value) -> std::io::Result<()> {
        let w = self.worker.as_mut().ok_or_else(|| std::io::Error::other("no worker"))?;
        writeln!(w.stdin, "{msg}")?;
        w.stdin.flush()
    }

    /// Why a library-op case whose sharded run hung is no finding: its op alone, on one device in
    /// float64, does not finish within the case's time either (an edit that made a call exponential).
    /// None when it finishes, raises, or the worker cannot tell.
    fn single_device_too_slow(&mut self, case: &Case) -> Option<String> {
        self.ensure_worker().ok()?;
        self.next_id += 1;
        let id = self.next_id;
        let limit = self.op_timeout;
        let msg = json!({"cmd": "single_device", "id": id, "case": case, "timeout_s": limit.as_secs_f64()});
        self.send(&msg).ok()?;
        let w = self.worker.as_mut()?;
        let slow = match w.reply(id, reply_deadline(limit, true)) {
            Ok(v) => v["status"] == "timeout",
            // Stuck in native code, where the worker's alarm cannot interrupt it.
            Err(RecvTimeoutError::Timeout) => {
                self.drop_worker();
                true
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.drop_worker();
                false
            }
        };
        slow.then(|| {
            format!(
                "the op alone does not finish on one device within {:.0} s on this call either (float64): a slow call, not a sharding hang",
                limit.as_secs_f64()
            )
        })
    }

    /// A model case that hung in the worker's own process, waited out in full, run again with
    /// `patience` times its timeout: compiling a large program there (JAX, host devices) is work on
    /// the shared cores that a loaded machine can stretch past the timeout. A rank pool's hang is
    /// the ranks' own report of where each waits, and a cut at a known site a hang already waited
    /// out: both stand as they are.
    fn patient_model_case(&mut self, case: &Case, inputs: &Inputs, patience: u32) -> Option<Outcome> {
        if patience <= 1 || !self.waited_out_in_process {
            return None;
        }
        let coverage = std::mem::take(&mut self.coverage);
        self.patience = patience;
        let outcome = self.run_in_worker(case, inputs, false);
        self.patience = 1;
        self.coverage = coverage;
        Some(outcome)
    }

    fn run_in_worker(&mut self, case: &Case, inputs: &Inputs, processes: bool) -> Outcome {
        self.waited_out_in_process = false;
        let v = match self.request(case, inputs, processes) {
            Ok(v) => v,
            Err(outcome) => return outcome,
        };
        self.coverage = v["coverage"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
        self.waited_out_in_process = v["waited_out_in_process"] == true;
        let features: Vec<String> = strings(&v["features"]);
        let reason = v["reason"].as_str().unwrap_or_default().to_string();
        let stats = match run_stats(&v) {
            Ok(stats) => stats,
            Err(e) => return Outcome::HarnessError { message: format!("worker sent unreadable stats: {e}") },
        };
        match v["status"].as_str().unwrap_or_default() {
            "completed" => match read_outputs(Path::new(v["output"].as_str().unwrap_or_default())) {
                Ok((tensors, replicas)) => {
                    let (baseline, tensors) = strip_prefix(tensors, FRAMEWORK_BASELINE);
                    let (reference, tensors) = strip_prefix(tensors, FRAMEWORK_REFERENCE);
                    let (members, tensors) = strip_prefix(tensors, FRAMEWORK_MEMBER);
                    let mut noise: BTreeMap<String, Vec<(String, Tensor)>> = BTreeMap::new();
                    for (name, t) in members {
                        if let Some((member, tensor)) = name.split_once('/') {
                            noise.entry(member.to_string()).or_default().push((tensor.to_string(), t));
                        }
                    }
                    Outcome::Completed(RunOutput {
                        tensors,
                        replicas,
                        features,
                        notes: strings(&v["notes"]),
                        baseline,
                        reference,
                        noise: noise.into_iter().collect(),
                        stats,
                    })
                }
                Err(e) => Outcome::Crash { rank: None, message: format!("worker output unreadable: {e}"), features },
            },
            "unsupported" => Outcome::Unsupported { reason },
            "rejected" => Outcome::Rejected { reason, features },
            "divergent" => Outcome::Divergent { reason, features },
            "harness_error" => Outcome::HarnessError { message: reason },
            "hang" => {
                let stuck = v["stuck"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|r| r.as_u64())
                            .map(|r| StuckRank { rank: r as usize, collective: hang_site(&reason, r), group: "world".into() })
                            .collect()
                    })
                    .unwrap_or_default();
                Outcome::Hang { stuck, detail: reason, features }
            }
            _ => Outcome::Crash { rank: v["rank"].as_u64().map(|r| r as usize), message: reason, features },
        }
    }
}

/// Where a stuck rank of a Python target waits, as the worker's reason says it (`…; rank R waits at
/// FRAME, entered from OURS via CALL`): our frame and the framework call it made, line numbers dropped,
/// or the innermost frame alone when no frame of ours is named; `unknown` when the reason names none.
/// The innermost frame of a loop differs from one interrupt to the next, the call into it does not.
fn hang_site(reason: &str, rank: u64) -> String {
    let marker = format!("rank {rank} waits at ");
    let Some(start) = reason.find(&marker) else { return "unknown".into() };
    let at = reason[start + marker.len()..].split("; rank ").next().unwrap_or("");
    let site = at.split_once(", entered from ").map_or(at, |(_, ours)| ours);
    let mut out = String::with_capacity(site.len());
    let mut rest = site;
    while let Some(colon) = rest.find(':') {
        let digits = rest[colon + 1..].chars().take_while(char::is_ascii_digit).count();
        out.push_str(&rest[..colon]);
        rest = &rest[colon + 1 + digits..];
        if digits == 0 {
            out.push(':');
        }
    }
    out.push_str(rest);
    out
}

/// What a worker that died printed about why: the line of a failed check or an abort (XLA's
/// `Check failed: …`, C++'s `terminate called …`) when there is one, else its last line (a stack
/// frame of the abort handler says nothing, and its addresses would split one abort into many).
fn abort_line(stderr: &str) -> String {
    const WHY: [&str; 4] = ["Check failed", "terminate called", "Fatal Python error", "what():"];
    stderr.lines().rev().find(|l| WHY.iter().any(|w| l.contains(w))).or_else(|| stderr.lines().last()).unwrap_or("").trim().to_string()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
}

/// Writes the inputs as the worker reads them (float64 tensors, int64 ids), atomically.
pub fn write_inputs(path: &Path, inputs: &Inputs) -> std::io::Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let mut bufs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
    for (name, t) in &inputs.tensors {
        bufs.push((name.clone(), Dtype::F64, t.shape.clone(), t.data.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    if !inputs.class_weights.is_empty() {
        let w = &inputs.class_weights;
        bufs.push(("class_weights".into(), Dtype::F64, vec![w.len()], w.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    for (name, ids) in [("tokens", &inputs.tokens), ("targets", &inputs.targets)] {
        let label = |x: usize| if x == crate::inputs::IGNORED { crate::inputs::IGNORE_INDEX } else { x as i64 };
        bufs.push((name.to_string(), Dtype::I64, vec![ids.len()], ids.iter().flat_map(|&x| label(x).to_le_bytes()).collect()));
    }
    let views: Vec<(String, TensorView)> =
        bufs.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("sizes match by construction"))).collect();
    let tmp = path.with_extension("tmp");
    safetensors::serialize_to_file(views, &None, &tmp).map_err(std::io::Error::other)?;
    std::fs::rename(tmp, path)
}

/// The typed run statistics a worker sent (`stats`: skipped steps of its loss scaler); none sent
/// reads as none.
fn run_stats(v: &serde_json::Value) -> Result<RunStats, String> {
    match &v["stats"] {
        serde_json::Value::Null => Ok(RunStats::default()),
        s => serde_json::from_value(s.clone()).map_err(|e| e.to_string()),
    }
}

/// Prefix of the tensors of a worker's own single-device run in the case dtype.
const FRAMEWORK_BASELINE: &str = "baseline/";
/// Prefix of the framework's own float64 reference (library-op cases).
const FRAMEWORK_REFERENCE: &str = "reference/";
/// Prefix of the framework's own noise members, `member/{name}/{tensor}` (library-op cases).
const FRAMEWORK_MEMBER: &str = "member/";

/// Tensors whose names start with `prefix` (the prefix removed), and the others.
type Named = Vec<(String, Tensor)>;

fn strip_prefix(tensors: Named, prefix: &str) -> (Named, Named) {
    let (with, without): (Vec<_>, Vec<_>) = tensors.into_iter().partition(|(n, _)| n.starts_with(prefix));
    (with.into_iter().map(|(n, t)| (n[prefix.len()..].to_string(), t)).collect(), without)
}

type Replicas = Vec<(String, Vec<(usize, Tensor)>)>;

fn read_outputs(path: &Path) -> Result<(Vec<(String, Tensor)>, Replicas), String> {
    use safetensors::SafeTensors;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
    let mut tensors = vec![];
    let mut replicas: BTreeMap<String, Vec<(usize, Tensor)>> = BTreeMap::new();
    let mut names: Vec<String> = st.names().into_iter().cloned().collect();
    names.sort();
    for name in names {
        let view = st.tensor(&name).map_err(|e| e.to_string())?;
        if view.dtype() != safetensors::Dtype::F64 {
            return Err(format!("{name}: expected float64, got {:?}", view.dtype()));
        }
        let data: Vec<f64> = view.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let t = Tensor::new(view.shape().to_vec(), data);
        match name.strip_prefix("replica/").and_then(|r| r.split_once('/')) {
            Some((rank, base)) => {
                let rank = rank.parse().map_err(|_| format!("{name}: bad replica rank"))?;
                replicas.entry(base.to_string()).or_default().push((rank, t));
            }
            None => tensors.push((name, t)),
        }
    }
    Ok((tensors, replicas.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_in_the_worker_process_waits_its_timeout_and_a_short_grace_a_rank_pool_the_long_one() {
        let t = Duration::from_secs(20);
        assert_eq!(reply_deadline(t, true), Duration::from_secs(30));
        assert_eq!(reply_deadline(t, false), Duration::from_secs(170));
    }

    #[test]
    fn a_python_hang_is_sited_at_the_framework_call_our_code_made_whatever_line_the_loop_was_at() {
        let at = |inner: &str| {
            format!(
                "the case did not finish within 10.0 s in the worker; rank 0 waits at {inner}, entered from \
                 shardfuzz_worker/targets/torch_opinfo.py:204 in viewed via torch/distributed/tensor/_dispatch.py:299 in slow_path"
            )
        };
        let one = hang_site(&at("torch/fx/experimental/symbolic_shapes.py:1585 in guard_or_false"), 0);
        let two = hang_site(&at("torch/distributed/tensor/_ops/_view_ops.py:77 in view_groups"), 0);
        assert_eq!(one, "shardfuzz_worker/targets/torch_opinfo.py in viewed via torch/distributed/tensor/_dispatch.py in slow_path");
        assert_eq!(one, two);
        let pool = "ranks [0, 1] did not finish within 20.0 s; rank 0 waits at a.py:3 in f; rank 1 waits at b.py:9 in g";
        assert_eq!(hang_site(pool, 1), "b.py in g");
        assert_eq!(hang_site(pool, 0), "a.py in f");
        assert_eq!(hang_site("ranks [2] did not finish within 20.0 s", 2), "unknown");
    }
}
