"""Verdicts by the frame that raised (shardfuzz_worker/validation.py, verdicts.py): synthetic failures with
frames in the installed frameworks' files, real exceptions, and the table against the installed sources."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker import validation  # noqa: E402
from shardfuzz_worker.targets.base import HarnessError, grad_or_fail  # noqa: E402
from shardfuzz_worker.validation import FORMER_LOCATIONS, FRAMEWORKS, VALIDATION, classify, describe  # noqa: E402
from shardfuzz_worker.verdicts import classify_failures  # noqa: E402

OURS = os.path.join(os.path.dirname(validation.__file__), "targets", "torch_dtensor.py")
OPINFO = os.path.join(os.path.dirname(validation.__file__), "targets", "torch_opinfo.py")
POOL = os.path.join(os.path.dirname(validation.__file__), "pool.py")


def installed(pkg):
    spec = importlib.util.find_spec(pkg)
    return spec.submodule_search_locations[0] if spec else None


def fw(pkg, rel, func, line=1):
    return (os.path.join(installed(pkg), rel), line, func)


def failure(*links):
    """A failure as describe() makes it from (type, message, frames) links, outermost first."""
    chain = [{"type": t, "message": m, "frames": [(POOL, 1, "_rank_main"), (OURS, 2, "run_rank")] + list(f)}
             for t, m, f in links]
    return {"type": chain[0]["type"], "module": "", "message": chain[0]["message"], "traceback": "", "chain": chain}


class Target:
    def __init__(self, name):
        self.name = name


@unittest.skipUnless(installed("torch"), "torch is not installed")
class TorchFramesTest(unittest.TestCase):
    def test_a_sharding_strategy_refusal_is_rejected(self):
        f = failure(("NotImplementedError", "Operator aten.foo does not have a sharding strategy registered.",
                     [fw("torch", "distributed/tensor/_sharding_prop.py", "propagate_op_sharding_non_cached")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "rejected")

    def test_the_conv_handlers_support_check_is_rejected(self):
        f = failure(("RuntimeError", "Stride must be 1 when there is padding for tensor parallel convolution.",
                     [fw("torch", "distributed/tensor/_tp_conv.py", "_is_supported")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "rejected")
        # The same file's assertions in the convolution itself stay crashes.
        f = failure(("AssertionError", "", [fw("torch", "distributed/tensor/_tp_conv.py", "tp_convolution")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "crash")

    def test_dynamos_refusal_of_flat_fsdp1_parameters_is_rejected(self):
        builder = fw("torch", "_dynamo/variables/builder.py", "wrap_module")
        f = failure(("AssertionError", "Dynamo only supports FSDP with use_orig_params=True", [builder]))
        self.assertEqual(classify("torch-fsdp1", f)[0], "rejected")
        # Any other assertion of Dynamo's stays a crash.
        f = failure(("AssertionError", "unexpected guard", [builder]))
        self.assertEqual(classify("torch-fsdp1", f)[0], "crash")

    @unittest.skipUnless(installed("deepspeed"), "deepspeed is not installed")
    def test_autotps_check_of_vocabulary_shards_is_rejected_and_its_sharding_a_crash(self):
        message = "vocab_parallel_lm_head requires nonempty vocabulary shards for tp_size=4, but 'lm_head' has 3 rows"
        f = failure(("ValueError", message, [fw("deepspeed", "module_inject/auto_tp.py", "_validate_vocab_parallel_layer")]))
        self.assertEqual(classify("deepspeed-zero", f)[0], "rejected")
        f = failure(("ValueError", "bad shard", [fw("deepspeed", "module_inject/auto_tp.py", "_replace")]))
        self.assertEqual(classify("deepspeed-zero", f)[0], "crash")

    def test_the_same_type_elsewhere_in_the_framework_is_a_crash(self):
        f = failure(("NotImplementedError", "something deep",
                     [fw("torch", "distributed/tensor/_redistribute.py", "redistribute_local_tensor")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "crash")

    def test_our_own_not_implemented_error_is_a_harness_error(self):
        f = failure(("NotImplementedError", "op conv", []))
        self.assertEqual(classify("torch-dtensor", f)[0], "harness_error")

    def test_a_message_fragment_narrows_a_location(self):
        rule = fw("torch", "distributed/tensor/_ops/_view_ops.py", "f")
        f = failure(("RuntimeError", "an assertion in a view rule", [rule]))
        self.assertEqual(classify("torch-dtensor", f)[0], "crash")

    def test_a_wrapped_refusal_is_rejected(self):
        wrapper = fw("torch", "distributed/tensor/_dispatch.py", "_propagate_op_sharding_dispatch_slow_path")
        rule = fw("torch", "distributed/tensor/_ops/_view_ops.py", "analyze")
        f = failure(("RuntimeError", "... Please redistribute ...\n\nSharding propagation failed", [wrapper]),
                    ("RuntimeError", "Please redistribute the tensor before this operation.", [wrapper, rule]))
        self.assertEqual(classify("torch-dtensor", f)[0], "rejected")
        # The same refusal from inside a parallelized module is no user call to fix: torch-tp has no such entry.
        self.assertEqual(classify("torch-tp", f)[0], "crash")

    def test_a_framework_error_caused_by_our_code_is_a_harness_error(self):
        autograd = fw("torch", "autograd/__init__.py", "backward")
        f = failure(("RuntimeError", "wrapped", [autograd]), ("ValueError", "ours", [autograd, (OURS, 9, "hook")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "harness_error")

    def test_a_jax_transformation_error_is_not_placed_at_the_traced_operation(self):
        jax_dir = installed("jax")
        if jax_dir is None:
            self.skipTest("jax is not installed")
        transpose = (os.path.join(jax_dir, "_src", "lax", "parallel.py"), 7, "_psum_transpose_rule")
        f = failure(("AttributeError", "'Zero' object has no attribute 'reshape'", [transpose]),
                    ("JaxStackTraceBeforeTransformation", "AttributeError: ...", [(OURS, 9, "body")]))
        self.assertEqual(classify("jax-shardmap", f)[0], "crash")
        ours = failure(("ValueError", "ours", [(OURS, 9, "body")]))
        self.assertEqual(classify("jax-shardmap", ours)[0], "harness_error")

    def test_standard_library_frames_count_for_their_caller(self):
        stdlib = (os.path.join(os.path.dirname(os.__file__), "json", "decoder.py"), 3, "decode")
        self.assertEqual(classify("torch-dtensor", failure(("JSONDecodeError", "x", [stdlib])))[0], "harness_error")
        deep = fw("torch", "distributed/tensor/_api.py", "from_local")
        self.assertEqual(classify("torch-dtensor", failure(("ValueError", "x", [deep, stdlib])))[0], "crash")

    def test_throw_helpers_are_skipped(self):
        init, throw = fw("torch", "nn/parallel/distributed.py", "__init__"), fw("torch", "nn/parallel/distributed.py", "_log_and_throw")
        f = failure(("ValueError", "device_ids can only be None or contain a single element.", [init, throw]))
        self.assertEqual(classify("torch-ddp", f)[0], "rejected")
        f["chain"][0]["frames"][-2] = fw("torch", "nn/parallel/distributed.py", "forward")
        self.assertEqual(classify("torch-ddp", f)[0], "crash")

    def test_a_missing_module_attribute_counts_for_the_caller(self):
        # nn.Module.__getattr__ raises for the name its caller asked for: our code asking for a name an older
        # release lacks is our error; the framework asking is its crash.
        lookup = fw("torch", "nn/modules/module.py", "__getattr__")
        f = failure(("AttributeError", "'Linear' object has no attribute 'bias_ready'", [lookup]))
        self.assertEqual(classify("torch-tp", f)[0], "harness_error")
        f["chain"][0]["frames"][-1:] = [fw("torch", "distributed/tensor/parallel/style.py", "_partition_linear_fn"), lookup]
        self.assertEqual(classify("torch-tp", f)[0], "crash")
        # Any other error type raised there stays where it was raised.
        f = failure(("RuntimeError", "x", [lookup]))
        self.assertEqual(classify("torch-tp", f)[0], "crash")

    def test_native_code_raising_under_a_native_caller_is_the_frameworks(self):
        # A DTensor whose metadata disagrees with its local shard fails in C++ inside `t.reshape(-1)`:
        # no Python frame below ours (torch 2.15, conv_transpose3d's output on real gloo ranks).
        viewed = (OPINFO, 218, "viewed")
        f = failure(("RuntimeError", "shape '[1120]' is invalid for input of size 560", [(OPINFO, 180, "run"), viewed]))
        f["traceback"] = f'  File "{OPINFO}", line 218, in viewed\n    t = t.reshape(-1)\nRuntimeError: ...'
        self.assertEqual(classify("torch-dtensor", f), ("crash", viewed))
        reply = classify_failures(Target("torch-dtensor"), [(0, f)], 1)
        self.assertEqual(reply["status"], "crash")
        self.assertIn("(raised in the framework's native code, called at File", reply["reason"])
        # Anything below it (here the standard library) means our call went elsewhere first: ours.
        stdlib = (os.path.join(os.path.dirname(os.__file__), "json", "decoder.py"), 3, "decode")
        f["chain"][0]["frames"].append(stdlib)
        self.assertEqual(classify("torch-dtensor", f)[0], "harness_error")
        # Another function of ours at the bottom is ours.
        f["chain"][0]["frames"][-2:] = [(OPINFO, 180, "run")]
        self.assertEqual(classify("torch-dtensor", f)[0], "harness_error")

    def test_our_model_code_failing_as_a_checkpoint_recomputes_it_is_a_crash(self):
        # The forward ran the same code moments before: what failed is what the checkpoint restored.
        model = (os.path.join(os.path.dirname(validation.__file__), "targets", "torch_model.py"), 30, "forward")
        engine = [fw("torch", "autograd/graph.py", "_engine_run_backward"),
                  fw("torch", "utils/checkpoint.py", "backward", 282), fw("torch", "nn/modules/module.py", "_call_impl")]
        f = failure(("IndexError", "tuple index out of range", engine + [model]))
        f["traceback"] = f'  File "{model[0]}", line 30, in forward\n    b, s, h = x.shape\nIndexError: ...'
        self.assertEqual(classify("torch-fsdp2", f), ("crash", engine[1]))
        reply = classify_failures(Target("torch-fsdp2"), [(0, f)], 1)
        self.assertEqual(reply["status"], "crash")
        self.assertIn("(in the model code recomputed by File", reply["reason"])
        self.assertIn("utils/checkpoint.py\", line 282, in backward)", reply["reason"])
        # The same failure in the forward (no recomputation outside it) is ours, and so is our other code
        # failing under a recomputation (a hook of ours, not the model).
        f = failure(("IndexError", "tuple index out of range", [fw("torch", "nn/modules/module.py", "_call_impl"), model]))
        self.assertEqual(classify("torch-fsdp2", f)[0], "harness_error")
        f = failure(("IndexError", "tuple index out of range", engine + [(OURS, 9, "hook")]))
        self.assertEqual(classify("torch-fsdp2", f)[0], "harness_error")

    def test_a_harness_error_is_one_whatever_its_frames(self):
        f = failure(("HarnessError", "no gradient came back for w", [fw("torch", "autograd/__init__.py", "backward")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "harness_error")

    def test_every_rank_must_refuse(self):
        t = Target("torch-dtensor")
        refusal = failure(("NotImplementedError", "Operator x does not have a sharding strategy registered.",
                           [fw("torch", "distributed/tensor/_sharding_prop.py", "propagate_op_sharding_non_cached")]))
        stranded = {"type": "Stranded", "module": "", "message": "left waiting", "traceback": ""}
        self.assertEqual(classify_failures(t, [(0, refusal), (1, refusal)], 2)["status"], "rejected")
        self.assertEqual(classify_failures(t, [(0, refusal)], 2)["status"], "crash")
        self.assertEqual(classify_failures(t, [(0, refusal), (1, stranded)], 2)["status"], "crash")
        # Across pipeline stages (which run different layers) a refusal of one stage, the others waiting, is one.
        gone = failure(("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
                        [fw("torch", "distributed/distributed_c10d.py", "recv")]))
        for waiting in (stranded, gone):
            reply = classify_failures(t, [(0, refusal), (1, refusal), (2, waiting), (3, waiting)], 4, stages=2)
            self.assertEqual(reply["status"], "rejected", reply)
            self.assertIn("raised on rank(s) 0, 1; the other pipeline stages were left waiting", reply["reason"])
        crash = failure(("IndexError", "list index out of range", [fw("torch", "distributed/tensor/_api.py", "f")]))
        self.assertEqual(classify_failures(t, [(0, refusal), (1, crash)], 2, stages=2)["status"], "crash")
        self.assertEqual(classify_failures(t, [(0, gone), (1, stranded)], 2, stages=2)["status"], "crash")
        ours = failure(("KeyError", "'x'", []))
        reply = classify_failures(t, [(0, refusal), (1, ours)], 2)
        self.assertEqual(reply["status"], "harness_error")
        self.assertIn("KeyError: 'x' (at shardfuzz_worker/targets/torch_dtensor.py:2 in run_rank)", reply["reason"])


    def test_a_crash_names_the_rank_whose_error_is_its_own(self):
        t = Target("torch-dtensor")
        gone = failure(("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                        "[127.0.0.1]:29841", [fw("torch", "distributed/distributed_c10d.py", "recv")]))
        cause = failure(("IndexError", "list index out of range", [fw("torch", "distributed/tensor/_api.py", "f")]))
        reply = classify_failures(t, [(0, gone), (1, cause)], 2)
        self.assertEqual((reply["status"], reply["rank"]), ("crash", 1))
        self.assertIn("IndexError", reply["reason"])
        self.assertEqual(classify_failures(t, [(0, gone), (1, gone)], 2)["rank"], 0)

    def test_a_crash_beside_a_refusal_is_told_by_the_crashing_rank(self):
        # torch 2.4.1, linalg.svd on uneven shards: rank 0 refuses `diagonal` in the backward, rank 1 crashes
        # padding its empty shard first. The case is a crash, named after rank 1's error, not rank 0's refusal.
        t = Target("torch-dtensor")
        refusal = failure(("NotImplementedError", "Operator aten.diagonal.default does not have a sharding strategy registered.",
                           [fw("torch", "distributed/tensor/_sharding_prop.py", "propagate_op_sharding_non_cached")]))
        cause = failure(("RuntimeError", "The input size 0, plus negative padding 0 and 0 resulted in a negative output size",
                         [fw("torch", "nn/functional.py", "pad")]))
        reply = classify_failures(t, [(0, refusal), (1, cause)], 2)
        self.assertEqual((reply["status"], reply["rank"]), ("crash", 1))
        self.assertIn("negative output size", reply["reason"])

    def test_a_wrapped_error_is_told_by_its_cause(self):
        # torch.distributed.pipelining re-raises every stage failure as "[Stage 0] failed to run forward" from the
        # real error (here DDP's reducer assert): one message for all of them would merge distinct bugs.
        t = Target("torch-pp")
        stage = fw("torch", "distributed/pipelining/stage.py", "forward_one_chunk", 1201)
        ddp = fw("torch", "nn/parallel/distributed.py", "_pre_forward", 1538)
        f = failure(("RuntimeError", "\n    [Stage 0] failed to run forward:\n    args: ('Tensor(...)',)\n", [stage]),
                    ("RuntimeError", "rebuilt parameter indices size is not same as original model parameters size.",
                     [stage, ddp]))
        reply = classify_failures(t, [(0, f)], 1)
        self.assertEqual(reply["status"], "crash")
        self.assertTrue(reply["reason"].startswith("RuntimeError: rebuilt parameter indices size"), reply["reason"])
        self.assertIn("(wrapped as RuntimeError: [Stage 0] failed to run forward:)", reply["reason"])
        self.assertIn('nn/parallel/distributed.py", line 1538, in _pre_forward)', reply["reason"])
        # Re-raised with the same words (DTensor's dispatcher re-raises sharding propagation's error): told once.
        prop = fw("torch", "distributed/tensor/_ops/_view_ops.py", "_analyze_flatten", 947)
        same = "Cannot flatten unevenly sharded tensor: dimension 0 (size 13)"
        f = failure(("RuntimeError", same + "\n\nSharding propagation failed for aten.view.default", [stage]),
                    ("RuntimeError", same, [stage, prop]))
        reply = classify_failures(t, [(0, f)], 1)
        self.assertEqual(reply["reason"].count("Cannot flatten"), 1, reply["reason"])

    def test_gloos_refusal_of_an_average_is_rejected(self):
        # torch 2.4.1 / 2.5.1: a Partial(avg) reduced on gloo raises in C++ under the functional collective.
        f = failure(("RuntimeError", "Cannot use ReduceOp.AVG with Gloo",
                     [fw("torch", "distributed/_functional_collectives.py", "all_reduce")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "rejected")
        f = failure(("RuntimeError", "Cannot use ReduceOp.PREMUL_SUM with Gloo",
                     [fw("torch", "distributed/_functional_collectives.py", "all_reduce")]))
        self.assertEqual(classify("torch-dtensor", f)[0], "crash")


class RealExceptionsTest(unittest.TestCase):
    def test_an_exception_raised_by_our_code_is_a_harness_error(self):
        try:
            grad_or_fail("w", None)
        except HarnessError as e:
            f = describe(e)
        self.assertEqual(classify("torch-dtensor", f)[0], "harness_error")
        reply = classify_failures(Target("torch-dtensor"), [(0, f)], 1)
        self.assertEqual(reply["status"], "harness_error")
        self.assertIn("no gradient came back for w", reply["reason"])

    def test_chained_causes_are_described(self):
        try:
            try:
                raise ValueError("inner")
            except ValueError as e:
                raise RuntimeError("outer") from e
        except RuntimeError as e:
            f = describe(e)
        self.assertEqual([c["type"] for c in f["chain"]], ["RuntimeError", "ValueError"])
        self.assertEqual(f["chain"][1]["frames"][-1][2], "test_chained_causes_are_described")

    @unittest.skipUnless(installed("megatron"), "megatron-core is not installed")
    def test_megatron_divisibility_assert_is_rejected(self):
        from megatron.core.utils import divide

        try:
            divide(3, 2)
        except AssertionError as e:
            f = describe(e)
        self.assertEqual(classify("megatron-tp", f)[0], "rejected")
        # The same assert type raised by us is ours.
        try:
            assert False, "ours"
        except AssertionError as e:
            self.assertEqual(classify("megatron-tp", describe(e))[0], "harness_error")


class TableTest(unittest.TestCase):
    def test_every_target_has_a_table_and_frameworks(self):
        from shardfuzz_worker.targets import REGISTRY

        self.assertEqual(set(VALIDATION), set(REGISTRY))
        self.assertEqual(set(FRAMEWORKS), set(REGISTRY))

    def test_every_location_exists_in_the_installed_framework(self):
        for target, rows in VALIDATION.items():
            for fragment, function, _ in rows:
                pkg, rel = fragment.split("/", 1)
                root = installed(pkg)
                if root is None:
                    continue
                self.assertIn(pkg, FRAMEWORKS[target], f"{target}: {fragment} is not in its frameworks")
                path = os.path.join(root, rel)
                source = ""
                if os.path.isfile(path):
                    with open(path, encoding="utf-8") as f:
                        source = f.read()
                present = os.path.exists(path) and (function is None or f"def {function}(" in source)
                if fragment.startswith(FORMER_LOCATIONS) and not present:
                    continue
                self.assertTrue(os.path.exists(path), f"{target}: {fragment} does not exist")
                if function:
                    self.assertIn(f"def {function}(", source, f"{target}: {function} is not in {fragment}")

    def test_every_recompute_location_exists_in_the_installed_framework(self):
        for fragment, functions in validation.RECOMPUTE:
            pkg, rel = fragment.split("/", 1)
            if installed(pkg) is None:
                continue
            with open(os.path.join(installed(pkg), rel), encoding="utf-8") as f:
                text = f.read()
            for function in functions:
                self.assertIn(f"def {function}(", text, f"{function} is not in {fragment}")


if __name__ == "__main__":
    unittest.main()
