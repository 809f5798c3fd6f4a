"""The partial split (shardfuzz_worker/partial.py): exact in every dtype, uneven, deterministic. numpy and
ml_dtypes only (ml_dtypes comes with jax)."""

import os
import sys
import unittest
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.partial import partial_parts, round_to, split, split_rng  # noqa: E402

DTYPES = ("f64", "f32", "f16", "bf16")


def values(dtype, seed=0):
    """Normal values at several scales, rounded to the dtype, with a zero among them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(40, 6)) * np.array([1.0, 8.0, 1e-3, 100.0, 0.25, 3.0])
    x[0, 0] = 0.0
    return round_to(x, dtype)


class SplitTest(unittest.TestCase):
    def test_summands_are_representable_and_sum_exactly(self):
        for dtype in DTYPES:
            x = values(dtype)
            for k in (2, 3, 4, 8):
                parts = split(x, k, dtype, split_rng(7, "x"))
                self.assertEqual(parts.shape, (k,) + x.shape)
                np.testing.assert_array_equal(round_to(parts, dtype), parts, err_msg=f"{dtype} k={k}")
                for idx in np.ndindex(x.shape):
                    exact = sum(Fraction(float(p)) for p in parts[(slice(None),) + idx])
                    self.assertEqual(exact, Fraction(float(x[idx])), f"{dtype} k={k} at {idx}")

    def test_every_order_of_addition_is_exact_in_the_dtype_itself(self):
        # A sharded reduction adds the summands in its own order (ring, tree), rounding each addition to the
        # dtype: every order, and a pairwise tree, must give the value exactly (an ulp off flipped an
        # argmax tie: the module doc).
        import itertools

        for dtype in DTYPES:
            x = values(dtype, seed=5)
            for k in (3, 4):
                parts = split(x, k, dtype, split_rng(9, "x"))
                for order in itertools.permutations(range(k)):
                    total = parts[order[0]]
                    for i in order[1:]:
                        total = round_to(total + parts[i], dtype)
                    np.testing.assert_array_equal(total, x, err_msg=f"{dtype} k={k} order {order}")
                tree = round_to(round_to(parts[0] + parts[2], dtype) + round_to(parts[1] + parts[-1], dtype), dtype)
                if k == 4:
                    np.testing.assert_array_equal(tree, x, err_msg=f"{dtype} pairwise")

    def test_summands_are_nonzero_and_differ_across_coordinates(self):
        for dtype in DTYPES:
            x = values(dtype)
            nonzero = x != 0
            for k in (2, 4):
                parts = split(x, k, dtype, split_rng(3, "w"))
                for c in range(k):
                    self.assertTrue(np.any(parts[c] != 0), f"{dtype} k={k}: summand {c} is all zero")
                    # No coordinate holds the whole value, as the old zeros-elsewhere scheme did.
                    self.assertLess(np.mean(parts[c][nonzero] == x[nonzero]), 0.1, f"{dtype} k={k} coordinate {c}")
                self.assertGreater(np.mean(np.all(parts != 0, axis=0)[nonzero]), 0.95, f"{dtype} k={k}")
                for a in range(k):
                    for b in range(a + 1, k):
                        self.assertFalse(np.array_equal(parts[a], parts[b]), f"{dtype} k={k}: {a} == {b}")

    def test_summands_differ_per_element(self):
        x = np.ones((8, 8))
        parts = split(x, 2, "f32", split_rng(1, "x"))
        self.assertGreater(len(np.unique(parts[0])), 16)

    def test_deterministic_by_seed_and_name(self):
        x = values("f32")
        a = partial_parts(x, [2, 2], "f32", 11, "a")
        np.testing.assert_array_equal(a, partial_parts(x, [2, 2], "f32", 11, "a"))
        self.assertFalse(np.array_equal(a, partial_parts(x, [2, 2], "f32", 11, "b")))
        self.assertFalse(np.array_equal(a, partial_parts(x, [2, 2], "f32", 12, "a")))
        self.assertEqual(a.shape, (2, 2) + x.shape)

    def test_subnormals_fall_back_to_one_whole_summand(self):
        tiny = np.array([2.0**-24, 3 * 2.0**-24, 2.0**-14])  # f16 subnormals and the smallest normal
        parts = split(tiny, 4, "f16", split_rng(0, "t"))
        np.testing.assert_array_equal(round_to(parts, "f16"), parts)
        for i, v in enumerate(tiny):
            self.assertEqual(sum(Fraction(float(p)) for p in parts[:, i]), Fraction(float(v)))

    def test_one_summand_is_the_value(self):
        x = values("bf16")
        np.testing.assert_array_equal(partial_parts(x, [], "bf16", 1, "x"), x)
        np.testing.assert_array_equal(partial_parts(x, [1], "bf16", 1, "x")[0], x)


if __name__ == "__main__":
    unittest.main()
