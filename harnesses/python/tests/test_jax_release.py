"""Release differences of JAX in one place (targets/jax_release.py, jax_ops.api): shard_map found where the
installed release keeps it, its check named as the release names it and retried off only where the check
cannot infer what the program guarantees; all_gather's `to=` passed only where the release takes it; an op of
the table that the release lacks left out of the vocabulary and refused by name. Mocked releases stand in for
the older ones (the test suite runs the real jax 0.4.38 in tests/python_targets.rs).

    cd harnesses/python && ../../.venv/bin/python -m unittest tests.test_jax_release
"""

import importlib.util
import os
import sys
import types
import unittest
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_JAX = importlib.util.find_spec("jax") is not None
REFUSAL = "shard_map applied to the function 'f' was given out_specs which require replication which can't be statically inferred"


def old_shard_map(calls, refuse_checked):
    """A shard_map as jax 0.4 has it (`check_rep`), recording how it is built and called."""

    def shard_map(f, mesh, in_specs, out_specs, check_rep=True):
        def call(*args):
            calls.append(("call", check_rep))
            if check_rep and refuse_checked:
                raise ValueError(REFUSAL)
            return f(*args)

        calls.append(("build", check_rep))
        return call

    return shard_map


@unittest.skipUnless(HAVE_JAX, "jax is not installed")
class ShardMapOfOlderReleases(unittest.TestCase):
    def setUp(self):
        from shardfuzz_worker.targets import jax_release

        self.release = jax_release
        self.calls = []

    def patched(self, refuse_checked, gather_takes_to=False):
        # No jax.shard_map: a release before 0.7 (its all_gather without `to=` unless asked).
        gather = (lambda x, axes, axis=0, tiled=False, to=None: x) if gather_takes_to else (lambda x, axes, axis=0, tiled=False: x)
        fake_jax = types.SimpleNamespace(lax=types.SimpleNamespace(all_gather=gather))
        module = types.ModuleType("jax.experimental.shard_map")
        module.shard_map = old_shard_map(self.calls, refuse_checked)
        return mock.patch.multiple(self.release, jax=fake_jax), mock.patch.dict(sys.modules, {"jax.experimental.shard_map": module})

    def build_and_call(self, refuse_checked, check=True):
        a, b = self.patched(refuse_checked)
        with a, b:
            f = self.release.shard_map(lambda x: x + 1, mesh=None, in_specs=None, out_specs=None, check=check)
            return f(1)

    def test_the_experimental_shard_map_runs_checked_first(self):
        self.assertEqual(self.build_and_call(refuse_checked=False), 2)
        self.assertEqual([c for c in self.calls if c[0] == "call"], [("call", True)])

    def test_a_program_the_old_check_cannot_infer_runs_unchecked(self):
        self.assertEqual(self.build_and_call(refuse_checked=True), 2)
        self.assertEqual([c for c in self.calls if c[0] == "call"], [("call", True), ("call", False)])

    def test_check_off_is_check_rep_off(self):
        self.assertEqual(self.build_and_call(refuse_checked=True, check=False), 2)
        self.assertEqual([c for c in self.calls if c[0] == "call"], [("call", False)])

    def test_a_release_whose_collectives_take_to_keeps_the_check_strict(self):
        a, b = self.patched(refuse_checked=True, gather_takes_to=True)
        with a, b:
            f = self.release.shard_map(lambda x: x + 1, mesh=None, in_specs=None, out_specs=None)
            with self.assertRaisesRegex(ValueError, "can't be statically inferred"):
                f(1)
        self.assertEqual([c for c in self.calls if c[0] == "call"], [("call", True)])

    def test_another_refusal_is_not_retried(self):
        a, b = self.patched(refuse_checked=False)
        with a, b:
            def bad(_x):
                raise ValueError("shard_map applied to the function 'f' was given argument arrays with axis sizes that"
                                 " are not evenly divisible")

            f = self.release.shard_map(bad, mesh=None, in_specs=None, out_specs=None)
            with self.assertRaisesRegex(ValueError, "evenly divisible"):
                f(1)

    def test_all_gather_takes_to_only_where_the_release_does(self):
        seen = []
        old = types.SimpleNamespace(lax=types.SimpleNamespace(all_gather=lambda x, axes, axis=0, tiled=False: seen.append({})))
        new = types.SimpleNamespace(lax=types.SimpleNamespace(
            all_gather=lambda x, axes, axis=0, tiled=False, to=None: seen.append({"to": to})))
        for fake in (old, new):
            with mock.patch.multiple(self.release, jax=fake):
                self.release.all_gather_invarying(np.zeros(2), ("tp",), 0)
        self.assertEqual(seen, [{}, {"to": "invarying"}])


@unittest.skipUnless(HAVE_JAX, "jax is not installed")
class InstalledRelease(unittest.TestCase):
    def test_a_psum_program_agrees_checked_and_unchecked(self):
        import jax
        from jax.sharding import Mesh, PartitionSpec

        from shardfuzz_worker.targets import jax_common  # noqa: F401 - 8 host devices, x64
        from shardfuzz_worker.targets import jax_release

        mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
        x = np.arange(4.0)
        outs = [jax.jit(jax_release.shard_map(lambda v: jax.lax.psum(v, "tp"), mesh, PartitionSpec("tp"), PartitionSpec(),
                                              check=check))(x) for check in (True, False)]
        for out in outs:
            np.testing.assert_array_equal(np.asarray(out), [2.0, 4.0])


@unittest.skipUnless(HAVE_JAX, "jax is not installed")
class OpsAReleaseLacks(unittest.TestCase):
    def setUp(self):
        from shardfuzz_worker.targets import jax_library_op, jax_ops

        self.ops, self.lib = jax_ops, jax_library_op
        self.name = "jax.numpy.no_such_function"
        self.addCleanup(self.ops.MISSING.pop, self.name, None)
        self.ops.op(self.name, "unary", self.ops.api(self.name), [self.ops.S(self.ops.N(3))])

    def test_api_resolves_nested_names_and_none_where_absent(self):
        import jax

        self.assertIs(self.ops.api("jax.numpy.linalg.norm"), jax.numpy.linalg.norm)
        self.assertIsNone(self.ops.api("jax.lax.no_such_module.fn"))

    def test_it_is_left_out_of_the_vocabulary_and_refused_by_name(self):
        self.assertNotIn(self.name, {e["name"] for e in self.ops.vocabulary()})
        self.assertIn(self.name, self.ops.MISSING)
        case = {"library_op": {"name": self.name, "variant": "", "sample": 0, "mesh": [2], "placements": []},
                "train": {"dtype": "f64"}}
        why = self.lib.unsupported(case)
        self.assertIn(f"{self.name} is not in jax ", why)
