"""Repro scripts (shardfuzz_worker.repro): generated through the CLI into an empty folder and run there with only
the test faults on PYTHONPATH, each one passes on the framework as it is and reports a MISMATCH (exit status 1)
under a test fault that breaks the framework's sharded path (tests/faults/sitecustomize.py); it imports nothing but
the framework, numpy and the standard library; the sharded results of torch-dtensor and of every model-case target
but torch-tp are the worker's, bit for bit; a case the generator cannot express exits 2. Skipped where the
framework is not installed."""

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

from driver import Worker, extended_only, op_inputs, worst_error  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_JAX = importlib.util.find_spec("jax") is not None
HAVE_DEEPSPEED = HAVE_TORCH and importlib.util.find_spec("deepspeed") is not None
HAVE_MEGATRON = HAVE_TORCH and importlib.util.find_spec("megatron") is not None
#: Variants whose fault another class already catches on the same target (about 5 min on 2 cores) run only in the
#: extended suite (scripts/test-extended.sh), so that scripts/test.sh fits CI's 90 min.
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


def model_case(name, parallel, steps=2, grad_accumulation=1, optimizer=None, dtype="f32", clip=None,
               per_token_loss=False, **model):
    """A small dense model case (layernorm with bias, gelu) on `parallel` (what differs from dp = tp = pp = 1)."""
    m = {"vocab": 13, "hidden": 8, "ffn": 12, "heads": 2, "kv_heads": 2, "seq": 4, "batch": 4,
         "layers": ["attention", "mlp"], "norm": "layernorm", "activation": "gelu", "bias": True,
         "tied_embeddings": False, **model}
    train = {"steps": steps, "optimizer": optimizer or {"kind": "sgd", "lr": 0.1}, "dtype": dtype}
    if grad_accumulation > 1:
        train["grad_accumulation"] = grad_accumulation
    if clip is not None:
        train["clip_grad_norm"] = clip
    if per_token_loss:
        train["per_token_loss"] = True
    return {"schema": 1, "name": name, "parallel": {"dp": 1, "tp": 1, "pp": 1, **parallel}, "model": m,
            "train": train, "data": {"seed": 11, "distribution": "normal"}}


def model_bounds(case, inputs):
    """Every tensor a model case compares, bounded by what f32 against float64 leaves after a few steps: a few
    1e-7 relative."""
    params = [n for n in inputs if n not in ("tokens", "targets")]
    losses = [f"loss/step{k}" for k in range(case["train"]["steps"])]
    names = ["logits"] + losses + [f"{k}/{n}" for k in ("grad", "param") for n in params]
    return {n: {"max": 1e-5, "rms": 1e-5, "norm": 1e-5} for n in names}


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
    #: Framework packages the scripts may import besides torch, jax, numpy and the standard library.
    extra_imports = ()

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="shardfuzz-repro-")
        cls.generated = {}
        cls.worker = None
        for key, (case, inputs, bounds) in cls.make_cases().items():
            folder = os.path.join(cls.root, key)
            rc, out, err = generate(cls.target, case, inputs, bounds, folder)
            assert rc == 0, f"{key}: exit {rc}: {err[-2000:]}"
            assert os.listdir(folder) == ["repro.py"], os.listdir(folder)
            cls.generated[key] = (folder, out.strip(), case, inputs)

    @classmethod
    def tearDownClass(cls):
        if cls.worker is not None:
            cls.worker.close()
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

    def check_matches_worker(self, key, dump, expected):
        """The script's sharded tensors (`expected`: their names) are what the worker returns for the case, bit
        for bit."""
        _, _, case, inputs = self.generated[key]
        if self.worker is None:
            type(self).worker = Worker(self.target)  # one per class, closed in tearDownClass
        reply, outputs = self.worker.run(case, inputs)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        with np.load(dump) as z:
            names = [n[len("sharded/"):] for n in z.files if n.startswith("sharded/")]
            self.assertEqual(sorted(names), sorted(expected))
            for name in names:
                got = z[f"sharded/{name}"]
                np.testing.assert_array_equal(got, outputs[name].reshape(got.shape), f"{key}: {name}")

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
                self.assertLessEqual(modules, ALLOWED_IMPORTS | set(self.extra_imports))


class ModelReproChecks(ReproChecks):
    """One model case on `parallel` (case options `options`): the script passes, reports a MISMATCH under the
    target's fault, and its sharded tensors are the worker's."""

    parallel = {}
    options = {}

    @classmethod
    def make_cases(cls):
        case = model_case(f"{cls.target}-model", cls.parallel, **cls.options)
        inputs = model_inputs(case)
        return {"model": (case, inputs, model_bounds(case, inputs))}

    def test_detects_the_fault_and_matches_the_worker(self):
        dump = self.check_detects_fault("model")
        _, _, case, inputs = self.generated["model"]
        self.check_matches_worker("model", dump, model_bounds(case, inputs))

    def test_the_command_runs_one_process_per_rank(self):
        p = self.generated["model"][2]["parallel"]
        self.assertEqual(self.generated["model"][1], f"torchrun --nproc_per_node {p['dp'] * p['tp']} repro.py")


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

    def test_a_partial_input_detects_a_halved_reduction(self):
        dump = self.check_detects_fault("partial")
        self.check_matches_worker("partial", dump, op_bounds(self.generated["partial"][2]))

    def test_a_contracted_dim_sharded_on_both_sides_detects_a_halved_reduction(self):
        dump = self.check_detects_fault("contracted")
        self.check_matches_worker("contracted", dump, op_bounds(self.generated["contracted"][2]))


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


@unittest.skipUnless(HAVE_JAX, "jax is not installed")
class JaxShardMapReproTest(ReproChecks, unittest.TestCase):
    target = "jax-shardmap"
    fault = "jax-psum-scale"

    @classmethod
    def make_cases(cls):
        # Rows over dp, the contraction dim over tp on both sides (local matmul + psum), a Partial bias.
        linear = op_case("linear-psum", "linear", [4, 6, 8], {"x": ["S(0)", "S(1)"], "w": ["R", "S(0)"],
                                                              "bias": ["R", "P"]}, dp=2)
        # Vocab-parallel: pmax, psum of the exp-sums and of the target logits.
        xent = op_case("xent-vocab", "cross_entropy", [4, 8], {"logits": ["S(0)", "S(1)"]}, dp=2)
        return {k: (c, op_inputs(c), op_bounds(c)) for k, c in (("linear", linear), ("xent", xent))}

    def test_a_sharded_contraction_detects_a_scaled_psum(self):
        dump = self.check_detects_fault("linear")
        self.check_matches_worker("linear", dump, op_bounds(self.generated["linear"][2]))

    def test_a_vocab_parallel_cross_entropy_detects_a_scaled_psum(self):
        dump = self.check_detects_fault("xent")
        self.check_matches_worker("xent", dump, op_bounds(self.generated["xent"][2]))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchTpReproTest(ReproChecks, unittest.TestCase):
    target = "torch-tp"
    fault = "dtensor-partial-half"

    @classmethod
    def make_cases(cls):
        case = model_case("tp2-f32", {"tp": 2})
        inputs = model_inputs(case)
        bounds = model_bounds(case, inputs)
        bounds["replicas/grad/embed.weight"] = {"max": 1e-6}  # not computed: dropped, named in the header
        gathered = model_case("tp2-gathered-f32", {"tp": 2, "vocab_loss": "gathered"})
        g_inputs = model_inputs(gathered)
        return {"tp2": (case, inputs, bounds), "gathered": (gathered, g_inputs, model_bounds(gathered, g_inputs))}

    def test_a_row_parallel_model_detects_a_halved_reduction(self):
        self.check_detects_fault("tp2")

    def test_a_replicated_lm_head_output_without_loss_parallel_detects_a_halved_reduction(self):
        folder, _, _, _ = self.generated["gathered"]
        with open(os.path.join(folder, "repro.py")) as f:
            self.assertIn("VOCAB_SHARDED_LOSS = False", f.read())
        self.check_detects_fault("gathered")

    def test_the_header_names_the_bounds_it_drops(self):
        folder, command, _, _ = self.generated["tp2"]
        self.assertEqual(command, "torchrun --nproc_per_node 2 repro.py")
        with open(os.path.join(folder, "repro.py")) as f:
            head = f.read().split('"""')[1]
        self.assertIn("replicas/grad/embed.weight", head)
        self.assertIn("tp=2", head)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchFsdp2ReproTest(ModelReproChecks, unittest.TestCase):
    target = "torch-fsdp2"
    fault = "fsdp2-avg-off-by-one"
    # ZeRO-3 (reshard after forward), two micro-batches per rank, weight decay. (Not Adam: it would turn the
    # round-off gradient of the key bias, zero in exact arithmetic, into a whole step.)
    parallel = {"dp": 2, "zero_stage": 3}
    options = {"grad_accumulation": 2, "optimizer": {"kind": "sgd", "lr": 0.1, "weight_decay": 0.1}}

    def test_the_script_reshards_over_the_cases_group(self):
        case = model_case("dp4-reshard2-f32", {"dp": 4, "zero_stage": 3, "reshard_group": 2})
        inputs = model_inputs(case)
        out = tempfile.mkdtemp(prefix="shardfuzz-repro-reshard-")
        try:
            status, _, err = generate(self.target, case, inputs, model_bounds(case, inputs), out)
            self.assertEqual(status, 0, err)
            with open(os.path.join(out, "repro.py")) as f:
                self.assertIn("'RESHARD_AFTER_FORWARD': 2,", f.read())
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def test_the_script_resumes_into_the_cases_resumed_layout(self):
        case = model_case("dp4-resumed-into-hsdp2-f32", {"dp": 4, "zero_stage": 3}, steps=2)
        case["train"] |= {"resume_after": 1, "resume_parallel": {**case["parallel"], "zero_shard_group": 2}}
        inputs = model_inputs(case)
        out = tempfile.mkdtemp(prefix="shardfuzz-repro-resumed-")
        try:
            status, _, err = generate(self.target, case, inputs, model_bounds(case, inputs), out)
            self.assertEqual(status, 0, err)
            with open(os.path.join(out, "repro.py")) as f:
                script = f.read()
            layouts = script.split("RESUMED_LAYOUT = ", 1)
            self.assertIn("'MESH_SHAPE': (4,),", layouts[0])
            self.assertIn("'MESH_SHAPE': (2, 2),", layouts[1].split("}", 1)[0])
            self.assertIn("named = sharded(RESUMED_LAYOUT or LAYOUT)", script)
        finally:
            shutil.rmtree(out, ignore_errors=True)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
@extended_only
class TorchFsdp2BesideTpReproTest(ModelReproChecks, unittest.TestCase):
    target = "torch-fsdp2"
    fault = "dtensor-partial-half"
    # FSDP2 (ZeRO-3) over the dp sub-mesh of a 2 x 2 mesh beside torch's tensor parallel plan with sequence parallelism:
    # the fault halves the tensor-parallel reductions, which only the plan's DTensors run.
    parallel = {"dp": 2, "tp": 2, "zero_stage": 3, "sequence_parallel": True}
    options = {"optimizer": {"kind": "sgd", "lr": 0.1}}


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchPpReproTest(ModelReproChecks, unittest.TestCase):
    target = "torch-pp"
    fault = "fsdp2-avg-off-by-one"
    # Two pipeline stages under 1F1B, each in FSDP2 (ZeRO-3) over two data-parallel ranks: the fault is FSDP2's
    # divide factor, which the schedule's own gradient reduction of FSDP2 stages runs.
    parallel = {"dp": 2, "pp": 2, "zero_stage": 3, "microbatches": 2, "pipeline_schedule": "1f1b"}

    def test_the_command_runs_one_process_per_rank(self):
        p = self.generated["model"][2]["parallel"]
        self.assertEqual(self.generated["model"][1], f"torchrun --nproc_per_node {p['dp'] * p['pp']} repro.py")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchDdpReproTest(ModelReproChecks, unittest.TestCase):
    target = "torch-ddp"
    fault = "ddp-avg-off-by-one"
    # no_sync() on the first of two micro-batches; gradient clipping.
    parallel = {"dp": 2}
    options = {"grad_accumulation": 2, "clip": 0.5}


@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed")
class MegatronTpReproTest(ModelReproChecks, unittest.TestCase):
    target = "megatron-tp"
    fault = "megatron-reduce-half"
    extra_imports = ("megatron",)
    parallel = {"tp": 2}
    options = {"vocab": 14}  # megatron shards the vocabulary evenly (13 would fail its divisibility assert)


@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed")
@extended_only
class MegatronTpDpReproTest(ModelReproChecks, unittest.TestCase):
    target = "megatron-tp"
    fault = "megatron-ddp-grads-summed"
    extra_imports = ("megatron",)
    # Two tensor-parallel ranks in each of two data-parallel replicas under the distributed optimizer, two
    # micro-batches per replica (eps 1e-3: as MegatronDdpReproTest's).
    parallel = {"tp": 2, "dp": 2, "zero_stage": 1}
    options = {"vocab": 14, "grad_accumulation": 2, "optimizer": {"kind": "adam", "lr": 0.01, "eps": 1e-3}}


@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed")
@extended_only
class MegatronTpPipelineReproTest(ModelReproChecks, unittest.TestCase):
    target = "megatron-tp"
    fault = "megatron-reduce-half"
    extra_imports = ("megatron",)
    # Two pipeline stages of two tensor-parallel ranks, megatron's 1F1B schedule over two micro-batches.
    parallel = {"tp": 2, "pp": 2, "microbatches": 2, "pipeline_schedule": "1f1b"}
    options = {"vocab": 14}

    def test_the_command_runs_one_process_per_rank(self):
        self.assertEqual(self.generated["model"][1], "torchrun --nproc_per_node 4 repro.py")


@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed")
@extended_only
class MegatronTpPerTokenReproTest(ModelReproChecks, unittest.TestCase):
    target = "megatron-tp"
    fault = "megatron-per-token-count-local"
    extra_imports = ("megatron",)
    # Megatron's per-token loss over two replicas of two tensor-parallel ranks, two micro-batches per replica.
    parallel = {"tp": 2, "dp": 2}
    options = {"vocab": 14, "grad_accumulation": 2, "per_token_loss": True}


@extended_only
@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed")
class MegatronDdpPerTokenReproTest(ModelReproChecks, unittest.TestCase):
    target = "megatron-ddp"
    fault = "megatron-per-token-count-local"
    extra_imports = ("megatron",)
    # Megatron's per-token loss under plain DDP over three uneven ranks (batch 7).
    parallel = {"dp": 3}
    options = {"per_token_loss": True, "batch": 7}


@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed")
class MegatronDdpReproTest(ModelReproChecks, unittest.TestCase):
    target = "megatron-ddp"
    fault = "megatron-ddp-grads-summed"
    extra_imports = ("megatron",)
    # The distributed optimizer (reduce-scatter of the buckets; it steps Adam, not SGD), two micro-batches per rank.
    # eps 1e-3: the key bias's gradient is zero up to round-off, which Adam with a tiny eps turns into a whole step of
    # either sign (the fuzzer's oracle samples that; these fixed bounds do not).
    parallel = {"dp": 2, "zero_stage": 1}
    options = {"grad_accumulation": 2, "optimizer": {"kind": "adam", "lr": 0.01, "eps": 1e-3}}


@unittest.skipUnless(HAVE_DEEPSPEED, "deepspeed is not installed")
class DeepSpeedZeroReproTest(ModelReproChecks, unittest.TestCase):
    target = "deepspeed-zero"
    fault = "deepspeed-reduce-half"
    extra_imports = ("deepspeed",)
    # ZeRO-2 (partitioned gradients), two micro-batches per rank: the engine's own accumulation.
    parallel = {"dp": 2, "zero_stage": 2}
    options = {"grad_accumulation": 2}

    def test_the_script_resumes_through_a_universal_checkpoint_into_the_resumed_layout(self):
        """ZeRO-2 into ZeRO-1 through ds_to_universal: OK; ZeRO-3 with optimizer sub-groups through it: the shared
        step count of docs/findings/deepspeed-0.19.8-zero3-universal-checkpoint-shared-step-across-sub-groups.py."""
        # (No biases: Adam would turn the key bias's round-off gradient, zero in exact arithmetic, into a whole step.)
        adam = {"kind": "adam", "lr": 0.01}
        into = model_case("dp2-zero2-universal-into-zero1", {"dp": 2, "zero_stage": 2}, steps=3, optimizer=adam,
                          bias=False)
        into["train"] |= {"resume_after": 1, "checkpoint_layout": "universal",
                          "resume_parallel": {**into["parallel"], "zero_stage": 1}}
        groups = model_case("dp2-zero3-sub-groups-universal", {"dp": 2, "zero_stage": 3, "optimizer_sub_group": 100},
                            steps=3, optimizer=adam, bias=False)
        groups["train"] |= {"resume_after": 1, "checkpoint_layout": "universal"}
        for case, verdict, rc in ((into, "OK: all tensors within the fuzzer's noise bounds", 0), (groups, "\nMISMATCH: ", 1)):
            inputs = model_inputs(case)
            out = tempfile.mkdtemp(prefix="shardfuzz-repro-universal-")
            try:
                status, command, err = generate(self.target, case, inputs, model_bounds(case, inputs), out)
                self.assertEqual(status, 0, err)
                with open(os.path.join(out, "repro.py")) as f:
                    resumed = f.read().split("RESUMED_DS_CONFIG = ", 1)[1].split("\n\n", 1)[0]
                self.assertIn("'load_universal': True", resumed)
                run = run_script(out, command.strip())
                self.assertIn(verdict, run.stdout, run.stdout[-3000:] + run.stderr[-3000:])
                self.assertEqual(run.returncode, rc, run.stdout[-3000:] + run.stderr[-3000:])
            finally:
                shutil.rmtree(out, ignore_errors=True)


@unittest.skipUnless(HAVE_DEEPSPEED, "deepspeed is not installed")
class DeepSpeedPpReproTest(unittest.TestCase):
    def test_the_script_runs_the_workers_pipeline_through_a_universal_checkpoint(self):
        """The script embeds the worker's PipelineRun, whose resume writes and converts the checkpoint through the
        worker's deepspeed_checkpoint module (embedded too): pp 2 x dp 2 at ZeRO-1, resumed as it was and over 4
        stages (RESUMED_DS_CONFIG), OK."""
        layout = {"dp": 2, "pp": 2, "zero_stage": 1, "microbatches": 2, "pipeline_schedule": "1f1b"}
        case = model_case("pp2-dp2-zero1-universal", layout, steps=3, optimizer={"kind": "adam", "lr": 0.01},
                          bias=False)
        case["train"] |= {"resume_after": 1, "checkpoint_layout": "universal"}
        case["model"]["layers"] = ["attention", "mlp"] * 2  # (a block for each of 4 stages)
        over4 = json.loads(json.dumps(case))
        over4["train"]["resume_parallel"] = {**layout, "dp": 1, "pp": 4}
        for case in (case, over4):
            inputs = model_inputs(case)
            out = tempfile.mkdtemp(prefix="shardfuzz-repro-pp-universal-")
            try:
                status, command, err = generate("deepspeed-pp", case, inputs, model_bounds(case, inputs), out)
                self.assertEqual(status, 0, err)
                with open(os.path.join(out, "repro.py")) as f:
                    self.assertEqual("RESUMED_DS_CONFIG = None" in f.read(), "resume_parallel" not in case["train"])
                run = run_script(out, command.strip())
                self.assertIn("Converting DeepSpeed checkpoint", run.stdout + run.stderr)
                self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
                self.assertIn("OK: all tensors within the fuzzer's noise bounds", run.stdout)
            finally:
                shutil.rmtree(out, ignore_errors=True)


class KnownFixesTest(unittest.TestCase):
    """A repro applies the fixes of known bugs the finding was found under (SHARDFUZZ_KNOWN_FIXES, those concerning
    its target) before its run, so that it shows the finding rather than a bug already known; embedded worker code
    that calls `known_fixes.batch_tokens` finds it."""

    def section(self, fixes, target, script):
        from shardfuzz_worker.repro.common import with_known_fixes

        saved = os.environ.pop("SHARDFUZZ_KNOWN_FIXES", None)
        try:
            if fixes:
                os.environ["SHARDFUZZ_KNOWN_FIXES"] = fixes
            return with_known_fixes(target, script)
        finally:
            os.environ.pop("SHARDFUZZ_KNOWN_FIXES", None)
            if saved is not None:
                os.environ["SHARDFUZZ_KNOWN_FIXES"] = saved

    def test_the_fixes_of_the_target_are_embedded_and_applied_before_the_entry_point(self):
        script = 'import sys\n\n\ndef main():\n    return 0\n\n\nif __name__ == "__main__":\n    sys.exit(main())\n'
        text = self.section("megatron-distopt-empty-optimizer-state-dict,colossalai-row-bias-sp", "megatron-tp", script)
        ast.parse(text)
        self.assertIn("def _megatron_distopt_empty_optimizer_state_dict():", text)
        self.assertNotIn("_colossalai_row_bias_sp", text, "a fix of another target's framework")
        self.assertIn("KNOWN_FIXES = ['megatron-distopt-empty-optimizer-state-dict']", text)
        applied = text.index("    _megatron_distopt_empty_optimizer_state_dict()\n")
        self.assertLess(applied, text.index('if __name__ == "__main__":'))
        self.assertEqual(self.section("", "megatron-tp", script), script, "no fix, no call: the script as it was")

    def test_a_fixes_helpers_come_along_and_batch_tokens_is_the_modules(self):
        script = 'def f():\n    known_fixes.batch_tokens(3, 2)\n\n\nif __name__ == "__main__":\n    f()\n'
        text = self.section("megatron-distopt-dp-reshardable-bucket-padding", "megatron-tp", script)
        self.assertIn("def _dp_reshardable_buckets(", text)
        plain = self.section("", "megatron-tp", script)
        self.assertNotIn("KNOWN_FIXES", plain)
        module = type(sys)("repro_under_test")
        sys.modules["repro_under_test"] = module
        try:
            exec(compile(plain, "repro.py", "exec"), module.__dict__)
            module.f()
            self.assertEqual(module._BATCH, {"count": 3, "divided_by": 2})
        finally:
            del sys.modules["repro_under_test"]


class RefusalTest(unittest.TestCase):
    def test_a_target_or_case_it_cannot_express_exits_2(self):
        case = op_case("m", "matmul", [2, 3, 2], {})
        folder = tempfile.mkdtemp(prefix="shardfuzz-repro-")
        try:
            rc, out, err = generate("no-such-target", case, op_inputs(case), op_bounds(case), folder)
            self.assertEqual((rc, out), (2, ""))
            self.assertIn("no repro generator for target 'no-such-target'", err)
            if HAVE_TORCH:
                model = {k: v for k, v in case.items() if k != "op"} | {"model": {"vocab": 5}}
                rc, _, err = generate("torch-dtensor", model, op_inputs(case), op_bounds(case), folder)
                self.assertEqual(rc, 2)
                self.assertIn("case.op", err)
                rc, _, err = generate("torch-ddp", case, op_inputs(case), op_bounds(case), folder)
                self.assertEqual(rc, 2)
                self.assertIn("runs model cases only", err)
            self.assertFalse(os.path.exists(os.path.join(folder, "repro.py")))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    @unittest.skipUnless(HAVE_TORCH, "torch is not installed")
    def test_a_model_case_a_data_parallel_target_cannot_run_names_the_case_fields(self):
        case = model_case("ddp-tp", {"dp": 2, "tp": 2})
        inputs = model_inputs(case)
        folder = tempfile.mkdtemp(prefix="shardfuzz-repro-")
        try:
            rc, out, err = generate("torch-ddp", case, inputs, model_bounds(case, inputs), folder)
            self.assertEqual((rc, out), (2, ""))
            self.assertIn("case.parallel", err)
            self.assertIn("DDP expresses data (and torch's context) parallelism only", err)
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

    @unittest.skipUnless(HAVE_JAX, "jax is not installed")
    def test_jax_shardmap(self):
        self.check_worker_sees("jax-shardmap", "jax-psum-scale")


if __name__ == "__main__":
    unittest.main()
