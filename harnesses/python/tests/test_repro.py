"""Repro scripts (shardfuzz_worker.repro): generated through the CLI into an empty folder and run there with only
the test faults on PYTHONPATH, each one passes on the framework as it is and reports a MISMATCH (exit status 1)
under a test fault that breaks the framework (tests/faults/sitecustomize.py); it imports nothing but the framework,
numpy and the standard library; torch-dtensor's sharded results are the worker's, bit for bit; a case the
generator cannot express exits 2. Skipped where torch or jax is not installed."""

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_DIR = os.path.dirname(HERE)
FAULTS_DIR = os.path.join(HERE, "faults")
sys.path.insert(0, HERE)

from driver import Worker, op_inputs, worst_error  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_JAX = importlib.util.find_spec("jax") is not None
ALLOWED_IMPORTS = {"torch", "jax", "numpy"} | set(sys.stdlib_module_names)
TIGHT = {"max": 1e-6, "rms": 1e-6, "norm": 1e-6}


def op_case(name, kind, shape, placements, dp=1, tp=2, dtype="f32", seed=7):
    return {"schema": 1, "name": name, "parallel": {"dp": dp, "tp": tp, "pp": 1},
            "op": {"kind": kind, "shape": shape, "placements": placements},
            "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.01}, "dtype": dtype},
            "data": {"seed": seed, "distribution": "normal"}}


def op_bounds(case):
    from shardfuzz_worker.targets.base import input_shapes

    names = ["out"] + [f"grad/{n}" for n, _ in input_shapes(case["op"])]
    return {n: dict(TIGHT) for n in names}


def model_params(m):
    """(name, shape) of every parameter as the Rust side names and lays them out (harnesses/src/case/model.rs
    `params`: linear weights [in, out]); dense layers, layernorm with bias, gelu."""
    v, h, f, d = m["vocab"], m["hidden"], m["ffn"], m["hidden"] // m["heads"]
    out = [("embed.weight", (v, h))]
    for i, kind in enumerate(m["layers"]):
        pre = f"layers.{i}"
        out += [(f"{pre}.norm.weight", (h,)), (f"{pre}.norm.bias", (h,))]
        if kind == "attention":
            widths = [("q", m["heads"] * d), ("k", m["kv_heads"] * d), ("v", m["kv_heads"] * d)]
            linears = [(f"attn.{n}", h, w) for n, w in widths] + [("attn.o", m["heads"] * d, h)]
        else:
            linears = [("mlp.up", h, f), ("mlp.down", f, h)]
        for n, fan_in, width in linears:
            out += [(f"{pre}.{n}.weight", (fan_in, width)), (f"{pre}.{n}.bias", (width,))]
    return out + [("final_norm.weight", (h,)), ("final_norm.bias", (h,)), ("lm_head.weight", (v, h))]


def model_inputs(case):
    """Inputs of a model case as the Rust side names and sizes them (not the same values), rounded to f32."""
    m = case["model"]
    rng = np.random.default_rng(case["data"]["seed"])
    inputs = {}
    for name, shape in model_params(m):
        if "norm.weight" in name:
            v = 1.0 + 0.1 * rng.normal(size=shape)
        elif name.endswith("bias"):
            v = 0.1 * rng.normal(size=shape)
        else:
            v = rng.normal(size=shape) / np.sqrt(shape[0] if "layers." in name else 1)
        inputs[name] = v.astype(np.float32).astype(np.float64)
    n = m["batch"] * m["seq"]
    inputs["tokens"] = rng.integers(0, m["vocab"], size=n).astype(np.int64)
    inputs["targets"] = rng.integers(0, m["vocab"], size=n).astype(np.int64)
    return inputs


def generate(target, case, inputs, bounds, out_dir):
    """Runs the CLI; returns (exit status, stdout, stderr)."""
    from safetensors.numpy import save_file

    scratch = tempfile.mkdtemp(prefix="shardfuzz-repro-in-")
    try:
        paths = {k: os.path.join(scratch, f"{k}.{ext}") for k, ext in (("case", "json"), ("bounds", "json"),
                                                                     ("inputs", "safetensors"))}
        for k in ("case", "bounds"):
            with open(paths[k], "w") as f:
                json.dump(case if k == "case" else bounds, f)
        save_file(inputs, paths["inputs"])
        argv = [sys.executable, "-m", "shardfuzz_worker.repro", "--target", target, "--out", out_dir]
        for k, p in paths.items():
            argv += [f"--{k}", p]
        env = dict(os.environ, PYTHONPATH=PKG_DIR, PYTHONDONTWRITEBYTECODE="1")
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_script(folder, command, fault=None, dump=None):
    """Runs the printed command in `folder` with PYTHONPATH = the faults folder only."""
    argv = command.split()
    bindir = os.path.dirname(sys.executable)
    argv[0] = sys.executable if argv[0] == "python" else os.path.join(bindir, argv[0])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDFUZZ_TEST_FAULT", "REPRO_DUMP")}
    env["PYTHONPATH"] = FAULTS_DIR
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if fault:
        env["SHARDFUZZ_TEST_FAULT"] = fault
    if dump:
        env["REPRO_DUMP"] = dump
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


class ReproChecks:
    """Generates each of `cases` ({key: (case, inputs, bounds)}) once; checks shared by every target."""

    target = None
    fault = None

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="shardfuzz-repro-")
        cls.generated = {}
        for key, (case, inputs, bounds) in cls.make_cases().items():
            folder = os.path.join(cls.root, key)
            rc, out, err = generate(cls.target, case, inputs, bounds, folder)
            assert rc == 0, f"{key}: exit {rc}: {err[-2000:]}"
            assert os.listdir(folder) == ["repro.py"], os.listdir(folder)
            cls.generated[key] = (folder, out.strip(), case, inputs)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def check_detects_fault(self, key):
        """Runs the script as it is (OK, exit 0) and under the fault (MISMATCH, exit 1); returns the path of the
        first run's tensors (REPRO_DUMP)."""
        folder, command, _, _ = self.generated[key]
        dump = os.path.join(self.root, f"{key}.npz")
        ok = run_script(folder, command, dump=dump)
        self.assertEqual(ok.returncode, 0, ok.stdout[-3000:] + ok.stderr[-3000:])
        self.assertIn("OK: all tensors within the fuzzer's noise bounds", ok.stdout)
        bad = run_script(folder, command, fault=self.fault)
        self.assertEqual(bad.returncode, 1, bad.stdout[-3000:] + bad.stderr[-3000:])
        self.assertRegex(bad.stdout, r"(?m)^MISMATCH: \S+ (max|rms|norm) \S+ > bound ")
        return dump

    def test_imports_only_the_framework_numpy_and_the_standard_library(self):
        for key, (folder, _, _, _) in self.generated.items():
            with open(os.path.join(folder, "repro.py")) as f:
                tree = ast.parse(f.read())
            modules = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    self.assertEqual(node.level, 0, f"{key}: relative import")
                    modules.add(node.module.split(".")[0])
            with self.subTest(key):
                self.assertLessEqual(modules, ALLOWED_IMPORTS)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchDTensorReproTest(ReproChecks, unittest.TestCase):
    target = "torch-dtensor"
    fault = "dtensor-partial-half"

    @classmethod
    def make_cases(cls):
        partial = op_case("matmul-partial", "matmul", [4, 6, 5], {"a": ["R", "P"], "b": ["R", "S(1)"]})
        contracted = op_case("matmul-contracted", "matmul", [3, 7, 4], {"a": ["R", "S(1)"], "b": ["R", "S(0)"]},
                             dtype="f64")
        return {k: (c, op_inputs(c), op_bounds(c)) for k, c in (("partial", partial), ("contracted", contracted))}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.worker = Worker(cls.target)

    @classmethod
    def tearDownClass(cls):
        cls.worker.close()
        super().tearDownClass()

    def test_a_partial_input_detects_a_halved_reduction(self):
        self.check_matches_worker("partial", self.check_detects_fault("partial"))

    def test_a_contracted_dim_sharded_on_both_sides_detects_a_halved_reduction(self):
        self.check_matches_worker("contracted", self.check_detects_fault("contracted"))

    def check_matches_worker(self, key, dump):
        """The script's sharded output and gradients are what the worker returns for the case, bit for bit."""
        _, _, case, inputs = self.generated[key]
        reply, outputs = self.worker.run(case, inputs)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        with np.load(dump) as z:
            names = [n[len("sharded/"):] for n in z.files if n.startswith("sharded/")]
            self.assertEqual(sorted(names), sorted(op_bounds(case)))
            for name in names:
                got = z[f"sharded/{name}"]
                np.testing.assert_array_equal(got, outputs[name].reshape(got.shape), f"{key}: {name}")


@unittest.skipUnless(HAVE_JAX, "jax is not installed")
class JaxGspmdReproTest(ReproChecks, unittest.TestCase):
    target = "jax-gspmd"
    fault = "jax-wsc-scale"

    @classmethod
    def make_cases(cls):
        case = op_case("linear-sharded", "linear", [5, 6, 8], {"x": ["S(0)", "R"], "w": ["R", "S(1)"],
                                                               "bias": ["R", "P"]}, dp=2)
        return {"linear": (case, op_inputs(case), op_bounds(case))}

    def test_a_sharded_input_detects_a_scaled_sharding_constraint(self):
        self.check_detects_fault("linear")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchTpReproTest(ReproChecks, unittest.TestCase):
    target = "torch-tp"
    fault = "dtensor-partial-half"

    @classmethod
    def make_cases(cls):
        model = {"vocab": 13, "hidden": 8, "ffn": 12, "heads": 2, "kv_heads": 2, "seq": 4, "batch": 4,
                 "layers": ["attention", "mlp"], "norm": "layernorm", "activation": "gelu", "bias": True,
                 "tied_embeddings": False}
        case = {"schema": 1, "name": "tp2-f32", "parallel": {"dp": 1, "tp": 2, "pp": 1}, "model": model,
                "train": {"steps": 2, "optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32"},
                "data": {"seed": 11, "distribution": "normal"}}
        inputs = model_inputs(case)
        params = [n for n in inputs if n not in ("tokens", "targets")]
        names = ["logits", "loss/step0", "loss/step1"] + [f"{k}/{n}" for k in ("grad", "param") for n in params]
        # f32 against float64 after two steps: a few 1e-7 relative.
        bounds = {n: {"max": 1e-5, "rms": 1e-5, "norm": 1e-5} for n in names}
        bounds["replicas/grad/embed.weight"] = {"max": 1e-6}  # not computed: dropped, named in the header
        return {"tp2": (case, inputs, bounds)}

    def test_a_row_parallel_model_detects_a_halved_reduction(self):
        self.check_detects_fault("tp2")

    def test_the_header_names_the_bounds_it_drops(self):
        folder, command, _, _ = self.generated["tp2"]
        self.assertEqual(command, "torchrun --nproc_per_node 2 repro.py")
        with open(os.path.join(folder, "repro.py")) as f:
            head = f.read().split('"""')[1]
        self.assertIn("replicas/grad/embed.weight", head)
        self.assertIn("tp=2", head)


class RefusalTest(unittest.TestCase):
    def test_a_target_or_case_it_cannot_express_exits_2(self):
        case = op_case("m", "matmul", [2, 3, 2], {})
        folder = tempfile.mkdtemp(prefix="shardfuzz-repro-")
        try:
            rc, out, err = generate("deepspeed-zero", case, op_inputs(case), op_bounds(case), folder)
            self.assertEqual((rc, out), (2, ""))
            self.assertIn("no repro generator for target 'deepspeed-zero'", err)
            if HAVE_TORCH:
                model = {k: v for k, v in case.items() if k != "op"} | {"model": {"vocab": 5}}
                rc, _, err = generate("torch-dtensor", model, op_inputs(case), op_bounds(case), folder)
                self.assertEqual(rc, 2)
                self.assertIn("case.op", err)
            self.assertFalse(os.path.exists(os.path.join(folder, "repro.py")))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class FaultsInTheWorkerTest(unittest.TestCase):
    """The test faults reach the worker and its ranks too (the fuzzer runs them with the same PYTHONPATH)."""

    def check_worker_sees(self, target, fault):
        env = {"PYTHONPATH": os.pathsep.join([PKG_DIR, FAULTS_DIR]), "SHARDFUZZ_TEST_FAULT": fault}
        worker = Worker(target, env=env)
        try:
            case = op_case("mm", "matmul", [4, 6, 4], {"a": ["R", "S(1)"], "b": ["R", "S(0)"]})
            inputs = op_inputs(case)
            reply, outputs = worker.run(case, inputs)
            self.assertEqual(reply["status"], "completed", reply.get("reason"))
            err, name = worst_error(case, inputs, outputs)
            self.assertGreater(err, 0.1, name)
        finally:
            worker.close()

    @unittest.skipUnless(HAVE_TORCH, "torch is not installed")
    def test_torch_dtensor(self):
        self.check_worker_sees("torch-dtensor", "dtensor-partial-half")

    @unittest.skipUnless(HAVE_JAX, "jax is not installed")
    def test_jax_gspmd(self):
        self.check_worker_sees("jax-gspmd", "jax-wsc-scale")


if __name__ == "__main__":
    unittest.main()
