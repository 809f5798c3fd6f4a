"""shardfuzz worker: runs cases through a real framework's sharded path for the Rust fuzzer.

Protocol (one JSON object per line; stdout is reserved for it, everything else goes to stderr):
  worker -> fuzzer, once:  {"event": "ready", "target": NAME, "versions": {...}}
                           or {"event": "unavailable", "target": NAME, "reason": "..."}
  fuzzer -> worker:        {"cmd": "run", "id": N, "case": {...}, "inputs": PATH, "output": PATH,
                            "timeout_s": T}
  worker -> fuzzer:        {"id": N, "status": "completed" | "unsupported" | "rejected" | "crash" | "hang"
                                            | "harness_error",
                            "reason": "...", "rank": R, "features": [...], "coverage": [u32...],
                            "notes": [...], "stats": {"skipped_steps": [bool...]}, "stuck": [...]}
  fuzzer -> worker:        {"cmd": "quit"}
Statuses: `unsupported` is decided before running (the target cannot express the case, e.g. an op kind it
does not implement); `rejected` means the framework's own validation refused the configuration on every
rank, `crash` that it failed anywhere else, both decided by the frame that raised (validation.py);
`harness_error` that our own worker failed, not the framework: an exception raised in shardfuzz_worker's
code or one that never entered the framework, a gradient or output tensor the target did not produce
(reason "<type>: <message> (at <frame>)"). It is neither a pass nor a finding.
A run command may carry "test_hook" (the fuzzer's tests set it): "sleep", "sleep-last-rank", "kill-rank",
"abort-rank", "abort-without-exit", "kill-worker", and "worker-raises" (our worker code raises on every rank,
a harness_error).
Tensors travel as safetensors files in the fuzzer's scratch directory: inputs are float64 (integer
ids as int64); outputs are float64, named as the Rust `RunOutput` names them, replicas of tensors
held by several ranks as `replica/{rank}/{name}`.
"""
