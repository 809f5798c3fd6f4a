"""JAX library ops (targets/jax_ops.py, targets/jax_library_op.py) for jax-gspmd and jax-shardmap, run in
this process as the worker's `run_local` runs them: the vocabulary, two ops of every family sharded over
meshes [2] and [2, 2] agreeing with the float64 reference, uneven and empty shards under GSPMD (and
shard_map's clean refusal of them), Partial inputs, the low-precision tensors, unsupported cases, and one
case through the worker protocol. Skipped where jax is not installed.

The placements here are chosen to pass on a correct JAX. jax 0.12.0.1 (CPU, 8 host devices) has real
GSPMD bugs that these library ops find, and the tests stay clear of them: the vjp of cummax /
cumprod / cumlogsumexp with the scan dim sharded and a cotangent that arrives replicated comes out wrong;
so do max-pool gradients (reduce_window) in f32 on a 2-D sharding, conv / jnp.convolve with both operands
sharded unevenly on a 2-D mesh, and scatter-min / segment_min / segment_prod with index arrays split
unevenly over the second mesh axis. Some sort, median, take and gather cases with uneven shards on a 2-D
mesh abort the process in XLA's spmd_partitioner_util.h (IsScalarWithElementType check).

    cd harnesses/python && ../../.venv/bin/python -m unittest tests.test_jax_library_ops
"""

import importlib.util
import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

HAVE_JAX = importlib.util.find_spec("jax") is not None
#: Relative agreement of a sharded float64 run with the float64 reference.
RTOL = 1e-9


def lib_case(name, sample=0, mesh=(2,), placements=(), dtype="f64", seed=5, backward=True):
    return {"schema": 1, "name": f"lib-{name}",
            "library_op": {"name": name, "variant": "", "sample": sample, "mesh": list(mesh),
                           "placements": [list(p) for p in placements], "backward": backward},
            "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.01}, "dtype": dtype},
            "data": {"seed": seed, "distribution": "normal"}}


def pick(op, mesh, seed=5):
    """(sample index, placements) sharding one argument of one of the op's samples over every dim of `mesh`
    ([2] or [2, 2]) evenly (so that shard_map runs it too), or None."""
    for i, (xs, _) in enumerate(op.samples(seed)):
        for j, x in enumerate(xs):
            shape = np.shape(x)
            even = [d for d, n in enumerate(shape) if n % 2 == 0]
            if not even:
                continue
            # One tensor dim, over every mesh dim that divides it. (Not two dims: a cumulative op's scan
            # dim sharded with a replicated cotangent hits a JAX bug, see the note at the top.)
            if len(mesh) == 1:
                places = [f"S({even[0]})"]
            elif shape[even[0]] % 4 == 0:
                places = [f"S({even[0]})", f"S({even[0]})"]
            else:
                places = [f"S({even[0]})", "R"]
            return i, [["R"] * len(mesh)] * j + [places]
    return None


@unittest.skipUnless(HAVE_JAX, "jax is not installed")
class JaxLibraryOps(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from shardfuzz_worker.targets import jax_gspmd, jax_library_op, jax_ops, jax_shardmap

        cls.ops, cls.lib = jax_ops, jax_library_op
        cls.targets = {"gspmd": jax_gspmd.TARGET, "shardmap": jax_shardmap.TARGET}

    def run_case(self, case, kind="gspmd"):
        target = self.targets[kind]
        self.assertIsNone(target.unsupported(case))
        self.assertEqual(target.world(case), 0)
        return target.run_local(case, {})

    def assert_close(self, got, want, what):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        self.assertEqual(got.shape, want.shape, what)
        if got.size == 0:
            return
        scale = max(float(np.nanmax(np.abs(want))), 1e-30)
        same_nan = np.isnan(got) == np.isnan(want)
        self.assertTrue(same_nan.all(), f"{what}: NaN where the reference has none (or the other way)")
        err = float(np.nanmax(np.abs(got - want))) if not np.isnan(want).all() else 0.0
        self.assertLessEqual(err, RTOL * scale, f"{what}: max error {err:.3g} against max |reference| {scale:.3g}")

    def assert_matches_reference(self, reply, what):
        self.assertNotIn("status", reply, f"{what}: {reply.get('reason')}")
        tensors = reply["tensors"]
        ref = {n[len("reference/"):]: t for n, t in tensors.items() if n.startswith("reference/")}
        self.assertIn("out/0", ref, what)
        for name, want in ref.items():
            self.assert_close(tensors[name], want, f"{what} {name}")
        for name, copies in reply["replicas"].items():
            for rank, copy in copies:
                self.assert_close(copy, tensors[name], f"{what} {name} replica {rank}")

    # ------------------------------------------------------------------------------------------------

    def test_vocabulary(self):
        vocab = self.targets["gspmd"].vocabulary()
        self.assertGreaterEqual(len(vocab), 100)
        names = [e["name"] for e in vocab]
        self.assertEqual(len(names), len(set(names)))
        self.assertTrue(all(e["variant"] == "" and e["family"] for e in vocab))
        self.assertTrue(all(n.startswith(("jax.numpy.", "jax.lax.", "jax.nn.", "jax.ops.", "shardfuzz.")) for n in names))
        self.assertEqual(self.targets["shardmap"].vocabulary(), vocab)
        families = {e["family"] for e in vocab}
        for f in ("unary", "binary", "reduction", "cumulative", "matmul", "conv", "indexing", "gather_scatter", "shape",
                  "sort", "pad_concat", "softmax_loss", "shift_rotate"):
            self.assertIn(f, families)

    def test_two_ops_per_family_f64(self):
        by_family = {}
        for e in self.targets["gspmd"].vocabulary():
            by_family.setdefault(e["family"], []).append(e["name"])
        for family, names in sorted(by_family.items()):
            for name in sorted(names)[:2]:
                op = self.ops.find(name)
                for mesh in ((2,), (2, 2)):
                    got = pick(op, mesh)
                    self.assertIsNotNone(got, f"{name}: no sample with a dim the mesh {mesh} divides")
                    sample, places = got
                    for kind in ("gspmd", "shardmap"):
                        with self.subTest(family=family, op=name, mesh=mesh, target=kind):
                            reply = self.run_case(lib_case(name, sample, mesh, places), kind)
                            what = f"{kind} {name} sample {sample} mesh {list(mesh)} {places}"
                            self.assert_matches_reference(reply, what)
                            feats = reply["features"]
                            self.assertIn(f"lib:op:{name}", feats)
                            self.assertIn(f"lib:family:{family}", feats)
                            self.assertIn(f"lib:mesh:{len(mesh)}d", feats)
                            self.assertIn("lib:shard:even", feats)

    def test_uneven_and_empty_shards_under_gspmd(self):
        # jax.numpy.cumsum sample 0: one (5,) argument.
        reply = self.run_case(lib_case("jax.numpy.cumsum", 0, (2,), [["S(0)"]]))
        self.assert_matches_reference(reply, "cumsum 5 over 2")
        self.assertIn("lib:shard:uneven", reply["features"])
        self.assertIn("grad/0", reply["tensors"])
        reply = self.run_case(lib_case("jax.numpy.cumsum", 0, (8,), [["S(0)"]]))
        self.assert_matches_reference(reply, "cumsum 5 over 8")
        self.assertIn("lib:shard:empty", reply["features"])
        # Two mesh axes on one dim, the matmul's contraction dim (4) split unevenly over 3 x 2 devices.
        reply = self.run_case(lib_case("jax.numpy.matmul", 0, (3, 2), [["S(1)", "S(1)"], ["S(0)", "R"]]))
        self.assert_matches_reference(reply, "matmul, contraction dim over 3 x 2")

    def test_outputs_go_through_the_redistribution_chain_under_gspmd(self):
        case = lib_case("jax.numpy.matmul", 0, (3, 2), [["S(1)", "S(1)"], ["S(0)", "R"]])
        case["library_op"]["redistribute"] = [["S(0)", "S(1)"], ["R", "S(0)"]]
        reply = self.run_case(case)
        self.assert_matches_reference(reply, "matmul through S(0)/S(1) then R/S(0)")
        self.assertIn("lib:redistribute:R/S(0)", reply["features"])

    def test_arguments_are_resharded_from_their_sources_under_gspmd(self):
        case = lib_case("jax.numpy.matmul", 0, (3, 2), [["S(1)", "S(1)"], ["S(0)", "R"]])
        case["library_op"]["sources"] = [["P", "S(0)"], ["R", "S(1)"]]
        reply = self.run_case(case)
        self.assert_matches_reference(reply, "matmul from P/S(0) and R/S(1)")
        for f in ("lib:from:P>S", "lib:from:S>S", "lib:from:R>S", "lib:from:S>R"):
            self.assertIn(f, reply["features"])

    def test_shard_map_redistributes_with_explicit_collectives(self):
        # jax.numpy.add sample 5: two (6, 2) arguments. Chains end split (out_specs), pass through an all_to_all
        # (one axis moving between dims) and ring all-gathers (ppermute; rings of 3 differ from their transpose).
        chains = {(2, 2): [["S(0)", "S(1)"], ["S(1)", "S(0)"], ["R", "R"]], (2,): [["S(0)"], ["S(1)"], ["R"]],
                  (3,): [["S(0)"], ["R"], ["S(0)"]]}
        for mesh, chain in chains.items():
            with self.subTest(mesh=mesh):
                case = lib_case("jax.numpy.add", 5, mesh, [["S(0)"] + ["R"] * (len(mesh) - 1), ["R"] * len(mesh)])
                case["library_op"]["redistribute"] = chain
                reply = self.run_case(case, "shardmap")
                self.assert_matches_reference(reply, f"add through {chain} on {mesh}")
                self.assertIn("hlo:collective-permute", reply["features"])
        # Sources: partial summands reduce-scattered into a split, a split moved by all_to_all.
        case = lib_case("jax.numpy.add", 5, (2, 2), [["S(0)", "S(1)"], ["S(1)", "R"]])
        case["library_op"]["sources"] = [["P", "P"], ["S(0)", "R"]]
        reply = self.run_case(case, "shardmap")
        self.assert_matches_reference(reply, "add from P/P and S(0)/R")
        for f in ("hlo:reduce-scatter", "hlo:all-to-all"):
            self.assertIn(f, reply["features"])
        # A source or a step that would split unevenly is left out, said so.
        case = lib_case("jax.numpy.add", 5, (4,), [["R"], ["R"]])
        case["library_op"]["redistribute"] = [["S(1)"]]
        reply = self.run_case(case, "shardmap")
        self.assert_matches_reference(reply, "add, an uneven step left out")
        self.assertTrue(any("does not divide" in n for n in reply["notes"]), reply["notes"])

    def test_a_wrong_collective_under_shard_map_is_seen(self):
        # psum_scatter returning half the sum (a wrong reduction) must show in the partial argument's output.
        case = lib_case("jax.numpy.add", 5, (2, 2), [["P", "R"], ["R", "R"]])
        real = self.lib.jax.lax.psum_scatter
        self.lib._COMPILED.clear()
        self.lib.jax.lax.psum_scatter = lambda *a, **k: real(*a, **k) * 0.5
        try:
            reply = self.run_case(case, "shardmap")
        finally:
            self.lib.jax.lax.psum_scatter = real
            self.lib._COMPILED.clear()
        t = reply["tensors"]
        self.assertGreater(float(np.max(np.abs(t["out/0"] - t["reference/out/0"]))), 0.1)

    def test_shards_that_disagree_with_their_sharding_are_the_frameworks_failure(self):
        # A JAX that labels an array with the wrong sharding (its shards hold other slices than the sharding names)
        # fails in JAX's own check, a framework crash, not in our assembly of the copies (a harness error).
        import types

        from shardfuzz_worker.targets import jax_common
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        jax = jax_common.jax
        mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        arr = jax.device_put(np.arange(4.0), NamedSharding(mesh, PartitionSpec()))
        self.assertEqual(len(jax_common.device_copies(arr)), 2)
        halves = jax.device_put(np.arange(4.0), NamedSharding(mesh, PartitionSpec("x"))).addressable_shards
        wrong = [types.SimpleNamespace(data=h.data, index=s.index, device=s.device, replica_id=s.replica_id)
                 for h, s in zip(halves, arr.addressable_shards)]
        from shardfuzz_worker import validation

        try:
            jax_common.check_shards(arr, wrong)
        except Exception as e:  # noqa: BLE001
            kind, _frame = validation.classify("jax-gspmd", validation.describe(e))
        else:
            self.fail("shards of the wrong shape were accepted")
        self.assertEqual(kind, "crash")

    def test_outputs_go_through_the_views(self):
        case = lib_case("jax.numpy.matmul", 0, (3, 2), [["S(1)", "S(1)"], ["S(0)", "R"]])
        case["library_op"]["views"] = ["transpose", "narrow", "flatten"]
        case["library_op"]["redistribute"] = [["S(0)", "R"]]
        reply = self.run_case(case)
        self.assert_matches_reference(reply, "matmul's output transposed, narrowed, flattened")
        self.assertEqual(np.ndim(reply["tensors"]["reference/out/0"]), 1)
        self.assertIn("lib:view:transpose", reply["features"])

    def test_sample_edits_change_the_static_arguments(self):
        # jax.numpy.cumsum sample 1: a (3, 5) argument, axis=0.
        case = lib_case("jax.numpy.cumsum", 1, (2,), [["S(1)"]])
        case["library_op"]["edits"] = [{"arg": 0, "edit": "flip"}]
        reply = self.run_case(case)
        self.assert_matches_reference(reply, "cumsum over axis 1")
        self.assertIn("edit flip: argument 0 0 → 1", " ".join(reply["notes"]))
        case["library_op"]["edits"] = [{"arg": 0, "edit": "beyond"}]
        reply = self.run_case(case)
        self.assertEqual(reply.get("status"), "unsupported", "an axis past the array's dims: the op refuses it")
        # jnp.tile with negative reps traces to a negative size (and fails in MLIR): unsupported, not our error.
        tile = next(i for i, (_, kw) in enumerate(self.ops.find("jax.numpy.tile").samples(5)) if "reps" in kw)
        case = lib_case("jax.numpy.tile", tile, (2,), [["R"]])
        case["library_op"]["edits"] = [{"arg": 0, "edit": "negate"}]
        reply = self.run_case(case)
        self.assertEqual(reply.get("status"), "unsupported", reply)

    def test_a_warm_up_call_runs_first_and_leaves_the_result_alone(self):
        # jax.numpy.cumsum sample 1: axis 0; the warm-up sums over axis 1 first.
        case = lib_case("jax.numpy.cumsum", 1, (2,), [["S(1)"]])
        case["library_op"]["warmup"] = [{"arg": 0, "edit": "flip"}]
        reply = self.run_case(case)
        self.assert_matches_reference(reply, "cumsum over axis 0 after a warm-up over axis 1")
        self.assertIn("warm-up call", " ".join(reply["notes"]))
        self.assertIn("edit flip: argument 0 0 → 1", " ".join(reply["notes"]))
        self.assertIn("lib:warmup", reply["features"])

    def test_cotangents_enter_sharded_partial_or_in_the_case_dtype(self):
        # jax.lax.dot_general sample 0 ([S(1)/R, R/S(1)], even shards for shard_map); the cotangent split over one mesh dim and entering as
        # uneven summands over the other (`library_op.cotangent`), in float64 or in the case dtype.
        for kind in ("gspmd", "shardmap"):
            for cot, in_dtype in ((["S(0)", "P"], False), (["P", "S(1)"], True), (["R", "S(0)"], True)):
                places = [["S(1)", "R"], ["R", "S(1)"]] if kind == "gspmd" else [["R", "R"], ["S(0)", "R"]]
                case = lib_case("jax.lax.dot_general", 0, (2, 2), places, seed=4)
                case["library_op"]["cotangent"] = cot
                case["library_op"]["cotangent_in_dtype"] = in_dtype
                what = f"{kind} dot_general, cotangent {cot}{' in the case dtype' if in_dtype else ''}"
                reply = self.run_case(case, kind)
                self.assert_matches_reference(reply, what)
                self.assertIn("grad/0", reply["tensors"], what)
                self.assertIn(f"lib:cotangent:{'/'.join('S' if p.startswith('S') else p for p in cot)}", reply["features"])
                self.assertEqual("lib:cotangent-in-dtype" in reply["features"], in_dtype, what)

    def test_a_partial_cotangent_whose_summands_are_not_added_is_seen(self):
        # The check can fail: the same partial cotangent with its summands' sum replaced by one summand.
        case = lib_case("jax.lax.dot_general", 0, (2, 2), [["S(1)", "R"], ["R", "S(1)"]], seed=4)
        case["library_op"]["cotangent"] = ["P", "R"]
        real = self.lib.cotangent_in

        def first_summand_only(cot_lays, m):
            inner = real(cot_lays, m)
            return lambda k, c: inner(k, c[:1] if cot_lays[k].partial else c)

        self.lib.cotangent_in = first_summand_only
        try:
            self.lib._COMPILED.clear()
            reply = self.run_case(case)
        finally:
            self.lib.cotangent_in = real
            self.lib._COMPILED.clear()
        tensors = reply["tensors"]
        got, want = np.asarray(tensors["grad/0"]), np.asarray(tensors["reference/grad/0"])
        self.assertGreater(float(np.abs(got - want).max()), 1e-3 * float(np.abs(want).max()))

    def test_uneven_shard_map_is_rejected(self):
        from shardfuzz_worker.validation import describe
        from shardfuzz_worker.verdicts import classify_failures

        target = self.targets["shardmap"]
        try:
            target.run_local(lib_case("jax.numpy.cumsum", 0, (2,), [["S(0)"]]), {})
        except Exception as e:  # noqa: BLE001
            verdict = classify_failures(target, [(None, describe(e))], 1)
        else:
            self.fail("shard_map ran a (5,) argument split over 2 devices")
        self.assertEqual(verdict["status"], "rejected", verdict)

    def test_partial_inputs(self):
        # A partial sum over both mesh dims of the matmul's left operand, its right one sharded on a0.
        case = lib_case("jax.numpy.matmul", 0, (2, 2), [["P", "P"], ["S(0)", "R"]])
        for kind in ("gspmd", "shardmap"):
            with self.subTest(target=kind):
                reply = self.run_case(case, kind)
                self.assert_matches_reference(reply, f"{kind} partial matmul")
                self.assertIn("lib:partial:P", reply["features"])
                # Every summand's gradient is the value's: 4 summands, each a copy of grad/0.
                labels = {rank for rank, _ in reply["replicas"]["grad/0"]}
                self.assertGreaterEqual(len(labels), 4)
        reply = self.run_case(lib_case("jax.numpy.matmul", 0, (2,), [["P(avg)"]]))
        self.assert_matches_reference(reply, "P(avg) run as replicated")
        self.assertTrue(any("P(avg)" in n for n in reply["notes"]), reply["notes"])
        self.assertIn("lib:place:0:R", reply["features"])

    def test_low_precision_tensors(self):
        reply = self.run_case(lib_case("jax.numpy.matmul", 0, (2, 2), [["S(0)", "R"], ["R", "S(1)"]], dtype="bf16"))
        tensors = reply["tensors"]
        for prefix in ("reference", "baseline", "member/perturbed", "member/reordered"):
            for name in ("out/0", "grad/0", "grad/1"):
                self.assertIn(f"{prefix}/{name}", tensors)
        # The inputs are rounded to bf16: the baseline (bf16 on one device) is near the reference.
        ref, base = tensors["reference/out/0"], tensors["baseline/out/0"]
        self.assertLess(np.abs(base - ref).max(), 0.1 * max(1.0, np.abs(ref).max()))
        self.assertLess(np.abs(tensors["out/0"] - ref).max(), 0.1 * max(1.0, np.abs(ref).max()))
        reply = self.run_case(lib_case("jax.numpy.matmul", 0, (2,), [["S(0)"]], dtype="f64"))
        self.assertFalse([n for n in reply["tensors"] if n.startswith(("baseline/", "member/reordered/"))])
        self.assertIn("member/perturbed/out/0", reply["tensors"])
        # Integer outputs in low precision are compared only where the bf16 single-device run agrees with
        # float64 (here it does: the reference comes with them); else they come without reference or members.
        reply = self.run_case(lib_case("jax.numpy.argmax", 1, (2,), [["S(1)"]], dtype="bf16"))
        self.assertIn("out/0", reply["tensors"])
        tensors = reply["tensors"]
        if "reference/out/0" in tensors:
            np.testing.assert_array_equal(tensors["baseline/out/0"], tensors["reference/out/0"])
        else:
            self.assertIn("not compared", " ".join(reply["notes"]))

    def test_the_perturbed_member_moves_the_cotangents_too(self):
        # broadcast_to's gradient sums its cotangent and nothing else: a member that perturbs the inputs alone
        # leaves it where the reference is, while a sharded run rounds each device's partial sum of it (a clean
        # f16 campaign case came out 14 ε from members that did not move).
        reply = self.run_case(lib_case("jax.numpy.broadcast_to", 0, (2,), [["R"]], dtype="f16"))
        tensors = reply["tensors"]
        self.assertIn("member/perturbed/grad/0", tensors)
        self.assertFalse(np.array_equal(tensors["member/perturbed/grad/0"], tensors["reference/grad/0"]))

    def test_unsupported(self):
        target = self.targets["gspmd"]
        self.assertIn("not in the JAX", target.unsupported(lib_case("jax.numpy.no_such_op")))
        self.assertIn("not in the JAX", self.targets["shardmap"].unsupported(lib_case("addmm")))
        variant = lib_case("jax.numpy.sum")
        variant["library_op"]["variant"] = "dim"
        self.assertIsNotNone(target.unsupported(variant))
        self.assertIsNotNone(target.unsupported(lib_case("jax.numpy.sum", mesh=(4, 4))))
        self.assertIsNone(target.unsupported(lib_case("jax.numpy.sum", mesh=(2, 2, 2))))

    def test_through_the_worker(self):
        from safetensors.numpy import save_file  # noqa: F401 - the driver needs it

        from driver import Worker

        worker = Worker("jax-gspmd")
        try:
            self.assertEqual(worker.hello["event"], "ready", worker.hello)
            case = lib_case("jax.nn.softmax", 1, (2, 2), [["S(1)", "R"]], dtype="f32")
            reply, outputs = worker.run(case, {"unused": np.zeros(1)})
            self.assertEqual(reply["status"], "completed", reply)
            self.assertIn("lib:op:jax.nn.softmax", reply["features"])
            for name in ("out/0", "grad/0", "reference/out/0", "baseline/grad/0", "member/reordered/out/0"):
                self.assertIn(name, outputs)
            reply, _ = worker.run(lib_case("jax.numpy.no_such_op"), {"unused": np.zeros(1)})
            self.assertEqual(reply["status"], "unsupported", reply)
        finally:
            worker.close()


if __name__ == "__main__":
    unittest.main()
