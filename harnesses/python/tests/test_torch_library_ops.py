"""torch-dtensor's library ops (OpInfo) end to end through the worker, as the Rust side drives it: the
vocabulary, a handful of ops per family in float64 under shard / replicate / partial placements agreeing
with the float64 reference the worker sends, the single-device tensors the oracle needs, refusals, and a
test fault in one DTensor sharding rule that the comparison sees. Skipped where torch is not installed."""

import importlib.util
import json
import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from driver import Worker, extended_only  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None

#: (op, variant, sample, mesh, placements): a few ops per OpInfo family, sharded evenly and unevenly,
#: replicated and partial, on 1-D and 2-D meshes.
CASES = [
    ("neg", "", 6, [2], [["S(0)"]]),
    ("exp", "", 7, [2, 2], [["S(1)", "P"]]),
    ("add", "", 3, [2, 2], [["S(0)", "S(1)"], ["R", "P"]]),
    ("mul", "", 5, [3], [["S(1)"], ["S(1)"]]),
    ("where", "", 2, [2], [["S(0)"], ["S(0)"], ["R"]]),
    ("sum", "", 8, [2], [["S(0)"]]),
    ("amax", "", 6, [2], [["S(0)"]]),
    ("mean", "", 5, [3], [["S(1)"]]),
    ("logsumexp", "", 3, [2], [["S(0)"]]),
    ("mm", "", 0, [2], [["S(1)"], ["S(0)"]]),
    ("bmm", "", 0, [2, 2], [["S(0)", "R"], ["R", "S(2)"]]),
    ("addmm", "", 1, [2], [["R"], ["S(0)"], ["R"]]),
    ("matmul", "", 4, [4], [["P"], ["R"]]),
    ("cumsum", "", 2, [2], [["S(0)"]]),
    ("nn.functional.layer_norm", "", 3, [2], [["S(0)"], ["R"], ["R"]]),
    ("nn.functional.gelu", "", 1, [2, 2], [["S(0)", "R"]]),
    ("transpose", "", 3, [2], [["S(0)"]]),
    ("permute", "", 1, [2, 2], [["S(0)", "S(1)"]]),
    ("reshape", "", 1, [2], [["S(1)"]]),
    ("cat", "", 1, [2], [["S(0)"], ["S(0)"]]),
    ("index_select", "", 2, [2], [["S(1)"], ["R"]]),
    ("gather", "", 3, [2], [["S(0)"], ["S(0)"]]),
    ("nn.functional.cross_entropy", "", 1, [2], [["S(0)"], ["S(0)"]]),
    ("topk", "", 1, [2], [["S(0)"]]),
]


def library_case(name, variant, sample, mesh, placements, dtype="f64", seed=3):
    return {"schema": 1, "parallel": {"dp": 1, "tp": 1, "pp": 1},
            "library_op": {"name": name, "variant": variant, "sample": sample, "mesh": mesh, "placements": placements},
            "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.01}, "dtype": dtype},
            "data": {"seed": seed}}


def worst_against_reference(outputs):
    """(worst relative error of a compared tensor against its reference, its name)."""
    worst = (0.0, "")
    for name, ref in outputs.items():
        if not name.startswith("reference/"):
            continue
        got = outputs[name[len("reference/"):]]
        scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
        err = float(np.max(np.abs(got - ref))) / scale if ref.size else 0.0
        if np.shape(got) != np.shape(ref) or not np.isfinite(err):
            err = float("inf")
        worst = max(worst, (err, name))
    return worst


class LibraryWorker(unittest.TestCase):
    env = None

    @classmethod
    def setUpClass(cls):
        cls.worker = Worker("torch-dtensor", env=cls.env)
        assert cls.worker.hello["event"] == "ready", cls.worker.hello

    @classmethod
    def tearDownClass(cls):
        cls.worker.close()

    def run_case(self, case):
        return self.worker.run(case, {"none": np.zeros(0)})


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchLibraryOpsTest(LibraryWorker):
    def test_the_vocabulary_is_pytorchs_opinfo_database(self):
        w = self.worker
        w.proc.stdin.write(json.dumps({"cmd": "vocabulary", "id": 999}) + "\n")
        w.proc.stdin.flush()
        reply = json.loads(w.proc.stdout.readline())
        self.assertEqual(reply["status"], "ok")
        names = {(o["name"], o["variant"]) for o in reply["ops"]}
        self.assertGreaterEqual(len(names), 300)
        self.assertIn(("addmm", ""), names)
        self.assertNotIn(("bernoulli", ""), names, "random ops are left out")

    def test_ops_of_every_family_agree_with_the_float64_reference(self):
        for name, variant, sample, mesh, placements in CASES:
            with self.subTest(op=name, mesh=mesh, placements=placements):
                reply, outputs = self.run_case(library_case(name, variant, sample, mesh, placements))
                self.assertEqual(reply["status"], "completed", reply.get("reason"))
                self.assertIn("reference/out/0", outputs)
                err, tensor = worst_against_reference(outputs)
                self.assertLessEqual(err, 1e-9, tensor)
                self.assertIn(f"lib:op:{name}", reply["features"])

    def test_low_precision_cases_send_the_baseline_and_the_noise_members(self):
        reply, outputs = self.run_case(library_case("mm", "", 0, [2], [["S(1)"], ["S(0)"]], dtype="bf16"))
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        for prefix in ("reference", "baseline", "member/perturbed", "member/reordered"):
            self.assertIn(f"{prefix}/out/0", outputs)
            self.assertIn(f"{prefix}/grad/0", outputs)

    def test_the_perturbed_member_moves_the_upstream_gradients_too(self):
        # sum's gradient is its upstream gradient broadcast and nothing else: a member that perturbs the inputs
        # alone leaves it where the reference is (see jax's test of the same name).
        reply, outputs = self.run_case(library_case("sum", "", 0, [2], [["S(0)"]], dtype="f16"))
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertFalse(np.array_equal(outputs["member/perturbed/grad/0"], outputs["reference/grad/0"]))

    def test_replicated_copies_come_back_as_replicas(self):
        reply, outputs = self.run_case(library_case("add", "", 3, [2, 2], [["S(0)", "R"], ["R", "R"]]))
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertIn("replica/1/out/0", outputs)
        self.assertIn("replica/1/grad/0", outputs, "grad of a tensor replicated over mesh dim 1: a copy per column")

    def test_outputs_go_through_the_redistribution_chain_forward_and_backward(self):
        case = library_case("addmm", "", 1, [2, 2], [["P", "R"], ["S(0)", "S(1)"], ["R", "S(0)"]])
        case["library_op"]["redistribute"] = [["S(0)", "S(1)"], ["S(1)", "S(1)"], ["R", "S(0)"]]
        reply, outputs = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertIn("grad/1", outputs)
        self.assertLessEqual(worst_against_reference(outputs)[0], 1e-9)
        self.assertIn("lib:redistribute:S(1)/S(1)", reply["features"])

    def test_unknown_ops_and_data_dependent_ops_are_not_findings(self):
        reply, _ = self.run_case(library_case("no_such_op", "", 0, [2], []))
        self.assertEqual(reply["status"], "unsupported")
        reply, _ = self.run_case(library_case("nonzero", "", 1, [2], [["S(0)"]]))
        self.assertEqual(reply["status"], "rejected", reply.get("reason"))

    def test_sample_edits_reach_the_op_and_a_refused_sample_must_be_refused_sharded_too(self):
        # Sample 9 of sum: a [3, 5] input, dim 0, keepdim True.
        case = library_case("sum", "", 9, [2], [["S(0)"]])
        reply, plain = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        case["library_op"]["edits"] = [{"arg": 0, "edit": "wrap"}]
        reply, wrapped = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertIn("edit wrap: argument 1 0 → -2", " ".join(reply["notes"]))
        self.assertTrue(np.array_equal(plain["reference/out/0"], wrapped["reference/out/0"]), "dim -2 of 2 dims is dim 0")
        self.assertLessEqual(worst_against_reference(wrapped)[0], 1e-9)
        case["library_op"]["edits"] = [{"arg": 0, "edit": "flip"}, {"arg": 1, "edit": "flip"}]
        reply, flipped = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertEqual(np.shape(flipped["reference/out/0"]), (3,), "summed over dim 1, keepdim off")
        self.assertLessEqual(worst_against_reference(flipped)[0], 1e-9)
        case = library_case("gather", "", 0, [2], [["S(0)"], ["S(0)"]])
        case["library_op"]["edits"] = [{"arg": 1, "edit": "beyond"}]
        reply, _ = self.run_case(case)
        self.assertEqual(reply["status"], "rejected", reply.get("reason"))
        self.assertIn("out of bounds", reply["reason"])
        self.assertIn("sharded too", reply["reason"])

    def test_an_empty_edit_empties_a_dim_list(self):
        # Sample 12 of sum: a [3, 5] input, dim (0, -1), keepdim True; dim=() is every dim in ATen.
        case = library_case("sum", "", 12, [2], [["R"]])
        case["library_op"]["edits"] = [{"arg": 1, "edit": "empty"}]
        reply, outputs = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertIn("edit empty: list argument [0, -1] → []", " ".join(reply["notes"]))
        self.assertEqual(np.shape(outputs["reference/out/0"]), (1, 1))
        self.assertLessEqual(worst_against_reference(outputs)[0], 1e-9)

    def test_a_warm_up_call_runs_first_and_leaves_the_result_alone(self):
        # Sample 1 of constant_pad_nd: a [1, 3] input, pad (1, 2), value 1.0; the warm-up pads with 2.0.
        case = library_case("constant_pad_nd", "", 1, [2], [["P"]])
        case["library_op"]["warmup"] = [{"arg": 2, "edit": "increment"}]
        reply, outputs = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertIn("warm-up call", " ".join(reply["notes"]))
        self.assertIn("1.0 → 2.0", " ".join(reply["notes"]))
        self.assertIn("lib:warmup", reply["features"])
        self.assertEqual(outputs["reference/out/0"][0, 0], 1.0, "the case's own value pads")
        self.assertLessEqual(worst_against_reference(outputs)[0], 1e-9)

    def test_cotangents_enter_at_the_output_sharded_or_partial(self):
        # addmm sample 1 on a 2x2 mesh (the corpus case); the backward's cotangent enters at the output as a
        # DTensor split on one mesh dim and uneven summands on the other (`library_op.cotangent`).
        for cot in (["S(0)", "P"], ["P(avg)", "S(1)"], ["R", "S(0)"]):
            case = library_case("addmm", "", 1, [2, 2], [["P", "R"], ["S(0)", "S(1)"], ["R", "S(0)"]])
            case["library_op"]["cotangent"] = cot
            reply, outputs = self.run_case(case)
            self.assertEqual(reply["status"], "completed", reply.get("reason"))
            self.assertIn(f"lib:cotangent:{'/'.join('S' if p.startswith('S') else p for p in cot)}", reply["features"])
            self.assertIn("grad/1", outputs, cot)
            self.assertLessEqual(worst_against_reference(outputs)[0], 1e-9, cot)

    def test_a_cotangent_entered_with_a_wrong_value_is_seen(self):
        # The check can fail: in this process, the same sharded run with each rank's piece of the entering
        # cotangent doubled gives other gradients.
        from shardfuzz_worker.targets import torch_local_dtensor as local
        from shardfuzz_worker.targets.torch_opinfo import Prepared, find

        lib = library_case("addmm", "", 1, [2, 2], [["P", "R"], ["S(0)", "S(1)"], ["R", "S(0)"]])["library_op"]
        lib["cotangent"] = ["S(0)", "P"]
        prep = Prepared(find(lib), lib, 3, "f64")
        good = local.run_sharded(prep, lib, 3)["grads"]
        real = local.entering_cotangent
        local.entering_cotangent = lambda *a: real(*a) * 2
        try:
            bad = local.run_sharded(prep, lib, 3)["grads"]
        finally:
            local.entering_cotangent = real
        self.assertEqual(set(good), set(bad))
        for j in good:
            np.testing.assert_allclose(bad[j][1][0], 2 * good[j][1][0], rtol=1e-12, atol=1e-12)

    def test_on_real_ranks_too_a_call_the_op_refuses_on_one_device_is_rejected_not_a_crash(self):
        # (Older torch runs every library-op case this way, on a pool of gloo processes: an edited index
        # out of range raised on every rank and read as a crash of the framework.)
        case = library_case("gather", "", 0, [2], [["S(0)"], ["S(0)"]])
        case["library_op"]["edits"] = [{"arg": 1, "edit": "beyond"}]
        reply, _ = self.worker.run(case, {"none": np.zeros(0)}, processes=True)
        self.assertEqual(reply["status"], "rejected", reply.get("reason"))
        self.assertIn("out of bounds", reply["reason"])
        self.assertIn("sharded too", reply["reason"])

    def test_arguments_are_redistributed_from_their_sources_forward_and_backward(self):
        case = library_case("addmm", "", 1, [2, 2], [["R", "R"], ["S(0)", "S(1)"], ["S(1)", "R"]])
        case["library_op"]["sources"] = [["P(avg)", "S(0)"], ["P", "R"], ["S(0)", "S(1)"]]
        reply, outputs = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertIn("grad/1", outputs)
        self.assertLessEqual(worst_against_reference(outputs)[0], 1e-9)
        for f in ("lib:from:P(avg)>R", "lib:from:S>R", "lib:from:P>S", "lib:from:R>S", "lib:from:S>S"):
            self.assertIn(f, reply["features"])

    def test_an_edit_that_makes_a_call_random_makes_it_unsupported(self):
        # rrelu sample 44 (sample 4 of its list): a [5] input, training=False; OpInfo fixes the seed of its
        # call (wrapper_set_seed), which must not hide that training=True draws random slopes.
        case = library_case("nn.functional.rrelu", "", 44, [2], [["S(0)"]])
        reply, _ = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        case["library_op"]["edits"] = [{"arg": 0, "edit": "flip"}]
        reply, _ = self.run_case(case)
        self.assertEqual(reply["status"], "unsupported", reply.get("reason"))
        self.assertIn("random", reply["reason"])

    def test_outputs_go_through_the_views_forward_and_backward(self):
        case = library_case("addmm", "", 1, [2, 2], [["P", "R"], ["S(0)", "S(1)"], ["R", "S(0)"]])
        case["library_op"]["views"] = ["transpose", "narrow", "unsqueeze", "flatten"]
        case["library_op"]["redistribute"] = [["S(0)", "R"]]
        reply, outputs = self.run_case(case)
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertEqual(np.shape(outputs["reference/out/0"]), (6,), "[3, 3] transposed, narrowed to [2, 3], flattened")
        self.assertIn("grad/1", outputs)
        self.assertLessEqual(worst_against_reference(outputs)[0], 1e-9)
        self.assertIn("lib:view:narrow", reply["features"])

    def test_a_case_runs_on_real_gloo_ranks_with_the_same_answer(self):
        case = library_case("add", "", 3, [2, 2], [["S(0)", "S(1)"], ["R", "P"]])
        w = self.worker
        w.next_id += 1
        inputs = os.path.join(w.scratch, "none.safetensors")
        from safetensors.numpy import load_file, save_file

        save_file({"none": np.zeros(0)}, inputs)
        out = os.path.join(w.scratch, "gloo.safetensors")
        w.proc.stdin.write(json.dumps({"cmd": "run", "id": w.next_id, "case": case, "inputs": inputs, "output": out,
                                       "timeout_s": 120, "processes": True}) + "\n")
        w.proc.stdin.flush()
        reply = json.loads(w.proc.stdout.readline())
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertLessEqual(worst_against_reference(load_file(out))[0], 1e-9)
        self.assertIn("gloo", " ".join(reply["notes"]))


FAULTS = os.path.join(HERE, "faults")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class RefusedBothWaysTest(unittest.TestCase):
    """What a sample the single-device op refuses gives: rejected when the sharded op refuses it too, divergent
    when it returns a result, and a harness error when our own code is what raised."""

    def test_the_three_outcomes(self):
        import torch

        sys.path.insert(0, os.path.dirname(HERE))
        from shardfuzz_worker.targets.torch_library_op import Refused, refused_both_ways

        refusal = Refused("the single-device op fails on this sample in float64: IndexError: out of range")
        self.assertEqual(refused_both_ways(refusal, lambda: None)["status"], "divergent")
        got = refused_both_ways(refusal, lambda: torch.functional.einsum("ij,jk", torch.zeros(2, 2)))
        self.assertEqual(got["status"], "rejected", got)

        def ours():
            raise ValueError("a bug in the worker")

        with self.assertRaises(ValueError):
            refused_both_ways(refusal, ours)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class WrongShardingRuleTest(LibraryWorker):
    """A test fault in one DTensor rule (reductions over a sharded dim marked Replicate, not Partial)."""

    env = {"PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), FAULTS]),
           "SHARDFUZZ_TEST_FAULT": "dtensor-reduction-rule-replicate"}

    def test_a_reduction_over_a_sharded_dimension_is_wrong_under_the_fault(self):
        reply, outputs = self.run_case(library_case("sum", "", 8, [2], [["S(0)"]]))
        self.assertEqual(reply["status"], "completed", reply.get("reason"))
        self.assertGreater(worst_against_reference(outputs)[0], 1e-3)
        reply, outputs = self.run_case(library_case("neg", "", 6, [2], [["S(0)"]]))
        self.assertLessEqual(worst_against_reference(outputs)[0], 1e-9, "an op without a reduction is unaffected")


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class LibraryOpReproTest(unittest.TestCase):
    """The standalone script of a library-op finding: OK on the framework as it is, MISMATCH under the test
    fault's wrong reduction rule (the embedded sample, every rank's piece, the op by its public name)."""

    def test_the_repro_passes_clean_and_detects_the_wrong_rule(self):
        import shutil
        import tempfile

        from test_repro import generate, run_script

        case = library_case("sum", "", 8, [2], [["S(0)"]], dtype="f32")
        bounds = {"out/0": {"max": 1e-5, "rms": 1e-5}, "grad/0": {"max": 1e-5, "rms": 1e-5}}
        folder = tempfile.mkdtemp(prefix="shardfuzz-lib-repro-")
        try:
            status, command, err = generate("torch-dtensor", case, {"none": np.zeros(0)}, bounds, folder)
            self.assertEqual(status, 0, err)
            self.assertEqual(command.strip(), "torchrun --nproc_per_node 2 repro.py")
            with open(os.path.join(folder, "repro.py")) as f:
                self.assertIn('OP_PATH = \'torch.sum\'', f.read())
            clean = run_script(folder, command.strip())
            self.assertEqual(clean.returncode, 0, clean.stdout[-2000:] + clean.stderr[-2000:])
            self.assertIn("OK: all tensors within", clean.stdout)
            faulty = run_script(folder, command.strip(), fault="dtensor-reduction-rule-replicate")
            self.assertEqual(faulty.returncode, 1, faulty.stdout[-2000:])
            self.assertIn("MISMATCH: out/0", faulty.stdout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    @extended_only
    def test_the_repro_runs_the_redistribution_chain(self):
        import shutil
        import tempfile

        from test_repro import generate, run_script

        # mm with its contraction dim sharded: a Partial output, reduce-scattered by the chain's first step.
        case = library_case("mm", "", 0, [2], [["S(1)"], ["S(0)"]], dtype="f32")
        case["library_op"]["redistribute"] = [["S(0)"], ["R"]]
        bounds = {"out/0": {"max": 1e-4, "rms": 1e-4}, "grad/0": {"max": 1e-4, "rms": 1e-4}, "grad/1": {"max": 1e-4, "rms": 1e-4}}
        folder = tempfile.mkdtemp(prefix="shardfuzz-lib-repro-")
        try:
            status, command, err = generate("torch-dtensor", case, {"none": np.zeros(0)}, bounds, folder)
            self.assertEqual(status, 0, err)
            with open(os.path.join(folder, "repro.py")) as f:
                self.assertIn("REDISTRIBUTE = [['S(0)'], ['R']]", f.read())
            clean = run_script(folder, command.strip())
            self.assertEqual(clean.returncode, 0, clean.stdout[-2000:] + clean.stderr[-2000:])
            faulty = run_script(folder, command.strip(), fault="dtensor-partial-half")
            self.assertEqual(faulty.returncode, 1, faulty.stdout[-2000:])
            self.assertIn("MISMATCH: out/0", faulty.stdout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    @extended_only
    def test_the_repro_starts_arguments_at_their_sources_with_the_edited_sample(self):
        import shutil
        import tempfile

        from test_repro import generate, run_script

        # addmm sample 1 (beta, alpha as keywords): every argument redistributed to its placement, one from a
        # partial value (an all-reduce the fault halves); beta edited.
        case = library_case("addmm", "", 1, [2, 2], [["R", "R"], ["S(0)", "S(1)"], ["S(1)", "R"]], dtype="f32")
        case["library_op"]["sources"] = [["P(avg)", "S(0)"], ["P", "R"], ["S(0)", "S(1)"]]
        case["library_op"]["edits"] = [{"arg": 0, "edit": "increment"}]
        bounds = {n: {"max": 1e-5, "rms": 1e-5} for n in ("out/0", "grad/0", "grad/1", "grad/2")}
        folder = tempfile.mkdtemp(prefix="shardfuzz-lib-repro-")
        try:
            status, command, err = generate("torch-dtensor", case, {"none": np.zeros(0)}, bounds, folder)
            self.assertEqual(status, 0, err)
            with open(os.path.join(folder, "repro.py")) as f:
                text = f.read()
            self.assertIn("STARTS = [['P(avg)', 'S(0)'], ['P', 'R'], ['S(0)', 'S(1)']]", text)
            self.assertIn("edit increment", text)
            clean = run_script(folder, command.strip())
            self.assertEqual(clean.returncode, 0, clean.stdout[-2000:] + clean.stderr[-2000:])
            faulty = run_script(folder, command.strip(), fault="dtensor-partial-half")
            self.assertEqual(faulty.returncode, 1, faulty.stdout[-2000:])
            self.assertIn("MISMATCH: out/0", faulty.stdout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
