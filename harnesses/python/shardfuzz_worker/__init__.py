"""shardfuzz worker: runs cases through a real framework's sharded path for the Rust fuzzer.

Protocol (one JSON object per line; stdout is reserved for it, everything else goes to stderr):
  worker -> fuzzer, once:  {"event": "ready", "target": NAME, "versions": {...}}
                           or {"event": "unavailable", "target": NAME, "reason": "..."}
  fuzzer -> worker:        {"cmd": "run", "id": N, "case": {...}, "inputs": PATH, "output": PATH,
                            "timeout_s": T}
  worker -> fuzzer:        {"id": N, "status": "completed" | "unsupported" | "rejected" | "crash" | "hang",
                            "reason": "...", "rank": R, "features": [...], "coverage": [u32...],
                            "notes": [...], "stuck": [...]}
  fuzzer -> worker:        {"cmd": "quit"}
Tensors travel as safetensors files in the fuzzer's scratch directory: inputs are float64 (integer
ids as int64); outputs are float64, named as the Rust `RunOutput` names them, replicas of tensors
held by several ranks as `replica/{rank}/{name}`.
"""
