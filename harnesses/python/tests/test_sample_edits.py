"""Sample edits (shardfuzz_worker/sample_edits.py): every edit applies to every kind of argument, index
edits never make two distinct indices name one element, and `arg` is taken modulo the editable ones.
numpy only."""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.sample_edits import BEYOND, EDITS, apply, edit_indices, edit_number, empty_lists  # noqa: E402


def is_index(x):
    return isinstance(x, np.ndarray) and x.dtype.kind == "i"


def run(leaves, edits, ndim=2):
    return apply(leaves, edits, is_index, ndim, lambda a: a, lambda a, like: a.astype(like.dtype))


class SampleEditsTest(unittest.TestCase):
    def test_numbers(self):
        self.assertEqual([edit_number(1, h, 3) for h in EDITS], [2, 0, -1, 0, 0, -2, 1 + BEYOND, 0])
        self.assertEqual(edit_number(-1, "wrap", 3), 2, "a negative dim wraps to the one it names")
        self.assertEqual([edit_number(True, h, 3) for h in EDITS], [False] * 8)
        self.assertEqual(edit_number(0.5, "flip", 1), 2.0)
        self.assertEqual(edit_number(0.0, "flip", 1), 0.0)
        self.assertEqual(edit_number(2.0, "wrap", 1), 2e4)

    def test_index_edits_keep_distinct_indices_distinct(self):
        size = 7
        a = np.array([[4, 0], [6, 2]])
        for how in EDITS:
            with self.subTest(edit=how):
                b = edit_indices(a, how)
                self.assertEqual(b.shape, a.shape if how != "empty" else (0, 2))
                in_range = b[(b >= -size) & (b < size)] % size
                self.assertEqual(len(set(in_range.tolist())), in_range.size, "two indices name one element")
        self.assertEqual(edit_indices(a, "wrap").tolist(), [[-3, -7], [-1, -5]])
        self.assertEqual(edit_indices(a, "negate").tolist(), [[-5, -1], [-7, -3]])
        self.assertEqual(edit_indices(a, "beyond").tolist(), [[4 + BEYOND, 0], [6, 2]])
        self.assertEqual(edit_indices(np.zeros((0,), dtype=np.int64), "beyond").size, 0)
        for how in EDITS:
            self.assertIsInstance(edit_indices(np.array(3), how), np.ndarray, "a 0-d index stays an array")

    def test_arg_counts_the_editable_arguments_only(self):
        x, idx = np.ones((2, 3)), np.array([0, 1])
        leaves = [x, 1, "mean", idx, True]
        out, notes = run(leaves, [{"arg": 1, "edit": "negate"}])
        self.assertEqual(out[3].tolist(), [-1, -2])
        self.assertIs(out[0], x, "tensors of floats are never edited")
        self.assertEqual(out[2], "mean")
        out, _ = run(leaves, [{"arg": 5, "edit": "increment"}, {"arg": 0, "edit": "wrap"}])
        self.assertEqual((out[1], out[4]), (-1, False), "arg 5 is arg 2 (the bool, flipped); wrap of dim 1 on 2 dims is -1")
        self.assertEqual(leaves[1], 1, "the sample itself is not changed")
        self.assertEqual(len(notes), 1)

    def test_a_sample_with_nothing_to_edit_runs_unchanged_and_says_so(self):
        out, notes = run([np.ones(3)], [{"arg": 0, "edit": "zero"}])
        self.assertEqual(len(out), 1)
        self.assertIn("no editable argument", notes[0])

    def test_an_unknown_edit_names_the_field(self):
        with self.assertRaisesRegex(ValueError, "library_op.edits"):
            run([1], [{"arg": 0, "edit": "halve"}])


class ReproLiteralTest(unittest.TestCase):
    """A repro script writes the sample's arguments as literals: an infinite or NaN float must read back (its
    repr, `inf`, is not Python: the norm.inf repro once failed with NameError)."""

    def test_non_finite_floats_read_back(self):
        from shardfuzz_worker.repro.common import literal

        value = {"leaves": [None, float("inf"), -float("inf"), 1.5, (2,), ("x", (1, 2))], "nested": {"k": float("inf")}}
        ns = {}
        exec(literal("X", value), ns)
        self.assertEqual(ns["X"]["leaves"][1:], [float("inf"), -float("inf"), 1.5, (2,), ("x", (1, 2))])
        self.assertEqual(ns["X"]["nested"], {"k": float("inf")})
        exec(literal("Y", [float("nan")]), ns)
        self.assertTrue(np.isnan(ns["Y"][0]))


if __name__ == "__main__":
    unittest.main()


class EmptyListsTest(unittest.TestCase):
    def test_an_int_in_a_dim_list_empties_the_list(self):
        x = np.ones((2, 3))
        tree = ((x, [0, 1]), {"keepdim": True})
        out, rest, notes = empty_lists(tree, [{"arg": 1, "edit": "empty"}, {"arg": 0, "edit": "negate"}], is_index)
        self.assertEqual(out[0][1], [])
        self.assertIs(out[0][0], x)
        self.assertEqual(out[1], {"keepdim": True})
        self.assertEqual(rest, [{"arg": 0, "edit": "negate"}], "the other edits go on to apply()")
        self.assertEqual(notes, ["edit empty: list argument [0, 1] → []"])
        self.assertEqual(tree[0][1], [0, 1], "the sample itself is not changed")

    def test_a_lone_int_a_bool_and_indices_are_left_to_apply(self):
        tree = ((np.ones(3), 2, (True, 1)), {})
        out, rest, notes = empty_lists(tree, [{"arg": 0, "edit": "empty"}, {"arg": 1, "edit": "empty"}], is_index)
        self.assertEqual(out, tree, "2 is no list element; (True, 1) is not a list of ints")
        self.assertEqual(len(rest), 2)
        self.assertEqual(notes, [])
        leaves, _ = run([np.ones(3), 2, np.array([[1, 2], [0, 1]])], [{"arg": 0, "edit": "empty"}, {"arg": 1, "edit": "empty"}])
        self.assertEqual((leaves[1], leaves[2].shape), (0, (0, 2)))

    def test_the_positional_arguments_themselves_are_not_a_list_argument(self):
        # signal.windows.blackman(7): the call's positional tuple holds only ints, and emptying it
        # left no argument at all (an IndexError in our worker); the edit goes on to apply() instead.
        tree = ((7,), {"sym": True})
        out, rest, notes = empty_lists(tree, [{"arg": 0, "edit": "empty"}], is_index)
        self.assertEqual((out, notes), (tree, []))
        self.assertEqual(rest, [{"arg": 0, "edit": "empty"}])

    def test_sorted_dict_keys_as_jax_flattens_them(self):
        tree = {"b": (1, 2), "a": (3,)}
        out, _, _ = empty_lists(tree, [{"arg": 0, "edit": "empty"}], is_index, sort_dicts=True)
        self.assertEqual(out, {"b": (1, 2), "a": ()})
        out, _, _ = empty_lists(tree, [{"arg": 0, "edit": "empty"}], is_index)
        self.assertEqual(out, {"b": (), "a": (3,)})
