"""Drives a worker as the Rust side does (harnesses/src/target/python.rs): JSON lines on stdin/stdout, inputs
and outputs as safetensors files. Also: op-case inputs and a float64 numpy reference of every op.

    python harnesses/python/tests/driver.py TARGET CASE.json... [--hook HOOK]
prints each case's status, reason, and for a completed op case its worst error against the reference.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_DIR = os.path.dirname(HERE)
sys.path.insert(0, PKG_DIR)

from shardfuzz_worker.partial import round_to  # noqa: E402
from shardfuzz_worker.targets.base import input_shapes, op_dim, output_shape  # noqa: E402

#: Tests that only scripts/test-extended.sh runs (SHARDFUZZ_EXTENDED_TESTS=1): kept out of scripts/test.sh for CI's 90 min.
EXTENDED = os.environ.get("SHARDFUZZ_EXTENDED_TESTS") == "1"
extended_only = unittest.skipUnless(EXTENDED, "extended suite: scripts/test-extended.sh")

LN_EPS = 1e-5
#: Allowed max |error| / max(1, max |reference|) per dtype: a few units of rounding, summed over short dots.
TOLERANCE = {"f64": 1e-12, "f32": 2e-5, "f16": 1e-2, "bf16": 6e-2}


class Worker:
    def __init__(self, target, python=sys.executable, env=None):
        env = {**os.environ, "PYTHONPATH": PKG_DIR, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen([python, "-u", "-m", "shardfuzz_worker", "--target", target], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = json.loads(self.proc.stdout.readline())
        self.scratch = tempfile.mkdtemp(prefix="shardfuzz-driver-")
        self.next_id = 0

    def run(self, case, inputs, hook=None, timeout_s=120, processes=False):
        """The reply, and the output tensors of a completed run (replicas as `replica/{rank}/{name}`)."""
        from safetensors.numpy import load_file, save_file

        self.next_id += 1
        in_path = os.path.join(self.scratch, "inputs.safetensors")
        out_path = os.path.join(self.scratch, "out.safetensors")
        save_file(inputs, in_path)
        msg = {"cmd": "run", "id": self.next_id, "case": case, "inputs": in_path, "output": out_path,
               "timeout_s": timeout_s, "processes": processes}
        if hook:
            msg["test_hook"] = hook
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.next_id:
                break
        outputs = load_file(out_path) if reply["status"] == "completed" else {}
        return reply, outputs

    def close(self):
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(60)
        self.proc.stdout.close()


def op_inputs(case):
    """Inputs of an op case as the Rust side generates them (not the same values): normal floats rounded to the
    case dtype, grad_out, token ids / targets as int64."""
    op, dt = case["op"], case["train"]["dtype"]
    rng = np.random.default_rng(case["data"]["seed"])
    s = [int(d) for d in op["shape"]]
    out = {n: round_to(rng.normal(size=shape), dt) for n, shape in input_shapes(op)}
    out["grad_out"] = round_to(rng.normal(size=output_shape(op)), dt)
    out["tokens"] = np.zeros(0, dtype=np.int64)
    out["targets"] = np.zeros(0, dtype=np.int64)
    ids = {"embedding": "tokens", "cross_entropy": "targets"}.get(op["kind"])
    if ids:
        out[ids] = rng.integers(0, s[1], size=s[0]).astype(np.int64)
    return out


def reference(case, inputs):
    """The op and the gradient of every float input in float64 numpy: {"out": ..., "grad/NAME": ...}."""
    op = case["op"]
    x = {n: inputs[n] for n, _ in input_shapes(op)}
    y, grads = FORWARD_BACKWARD[op["kind"]](op, x, inputs, inputs["grad_out"])
    return {"out": y} | {f"grad/{n}": g for n, g in grads.items()}


def _matmul(op, x, ins, g):
    a, b = x["a"], x["b"]
    return a @ b, {"a": g @ b.T, "b": a.T @ g}


def _linear(op, x, ins, g):
    xx, w = x["x"], x["w"]
    return xx @ w + x["bias"], {"x": g @ w.T, "w": xx.T @ g, "bias": g.sum(0)}


def _sum(op, x, ins, g):
    d = op_dim(op)
    return x["x"].sum(d, keepdims=True), {"x": np.broadcast_to(g, x["x"].shape).copy()}


def _max(op, x, ins, g):
    d, xx = op_dim(op), x["x"]
    idx = np.argmax(xx, axis=d)[..., None] if d == 1 else np.argmax(xx, axis=0)[None]
    gx = np.zeros_like(xx)
    np.put_along_axis(gx, idx, g, axis=d)
    return np.take_along_axis(xx, idx, axis=d), {"x": gx}


def _softmax(op, x, ins, g):
    d, xx = op_dim(op), x["x"]
    e = np.exp(xx - xx.max(d, keepdims=True))
    y = e / e.sum(d, keepdims=True)
    return y, {"x": y * (g - (g * y).sum(d, keepdims=True))}


def _layernorm(op, x, ins, g):
    xx, w = x["x"], x["w"]
    n = xx.shape[1]
    xc = xx - xx.mean(1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(1, keepdims=True) + LN_EPS)
    xhat = xc * rstd
    gh = g * w
    gx = rstd * (gh - gh.mean(1, keepdims=True) - xhat * (gh * xhat).mean(1, keepdims=True))
    assert gx.shape[1] == n
    return xhat * w + x["bias"], {"x": gx, "w": (g * xhat).sum(0), "bias": g.sum(0)}


def _embedding(op, x, ins, g):
    t, ids = x["table"], ins["tokens"]
    gt = np.zeros_like(t)
    np.add.at(gt, ids, g)
    return t[ids], {"table": gt}


def _cross_entropy(op, x, ins, g):
    z, t = x["logits"], ins["targets"]
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    lse = np.log(e.sum(1, keepdims=True)) + m
    onehot = np.eye(z.shape[1])[t]
    return lse - (z * onehot).sum(1, keepdims=True), {"logits": (e / e.sum(1, keepdims=True) - onehot) * g}


def _reshape(op, x, ins, g):
    return x["x"].reshape(output_shape(op)), {"x": g.reshape(x["x"].shape)}


def _transpose(op, x, ins, g):
    return x["x"].T, {"x": g.T}


FORWARD_BACKWARD = {
    "matmul": _matmul, "linear": _linear, "sum": _sum, "max": _max, "softmax": _softmax, "layernorm": _layernorm,
    "embedding": _embedding, "cross_entropy": _cross_entropy, "reshape": _reshape, "transpose": _transpose,
}


def worst_error(case, inputs, outputs):
    """Max over the reference's tensors (and every replica of them) of |error| / max(1, max |reference|),
    and the name where it is."""
    worst = (0.0, "")
    for name, want in reference(case, inputs).items():
        replicas = [v for k, v in outputs.items() if k.startswith("replica/") and k.split("/", 2)[2] == name]
        scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
        for got in [outputs[name]] + replicas:
            err = float(np.max(np.abs(got.reshape(want.shape) - want), initial=0.0)) / scale
            worst = max(worst, (err, name))
    return worst


def main():
    args = sys.argv[1:]
    hook = None
    if "--hook" in args:
        i = args.index("--hook")
        hook = args[i + 1]
        del args[i:i + 2]
    target, paths = args[0], args[1:]
    w = Worker(target)
    try:
        for path in paths:
            case = json.load(open(path))
            inputs = op_inputs(case)
            reply, outputs = w.run(case, inputs, hook)
            line = f"{os.path.basename(path)}: {reply['status']} {reply.get('reason', '')[:300]}"
            if reply["status"] == "completed":
                err, name = worst_error(case, inputs, outputs)
                tol = TOLERANCE[case["train"]["dtype"]]
                line += f"worst error {err:.3g} at {name} (tolerance {tol:g}): {'ok' if err <= tol else 'TOO LARGE'}"
            print(line, flush=True)
    finally:
        w.close()


if __name__ == "__main__":
    main()
