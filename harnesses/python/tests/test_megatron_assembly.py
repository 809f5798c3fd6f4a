"""How megatron-tp assembles its ranks' slices into full tensors (megatron_model.assemble_outputs) when a run resumes
into other degrees: the first step's logits and gradients over the ranks as laid out then, the final parameters over
the ranks as laid out at the end. Skipped where megatron-core is not installed (the module imports it lazily, torch
eagerly)."""

import importlib.util
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_TORCH = importlib.util.find_spec("torch") is not None

VOCAB, HIDDEN = 4, 2
FULL = np.arange(VOCAB * HIDDEN, dtype=np.float64).reshape(VOCAB, HIDDEN)  # a column-parallel weight [out, in]


def rank(tp_rank, tp, dp_rank, first=None, rows=(0, 8)):
    """One rank's output: the lm_head weight's rows of its tensor-parallel rank (gradients in the first layout
    `first` = (tp_rank, tp, dp_rank), parameters in the final one), a replicated norm, its logits' vocabulary shard."""
    g_tp_rank, g_tp, g_dp = first or (tp_rank, tp, dp_rank)
    n, gn = VOCAB // tp, VOCAB // g_tp
    out = {"tp_rank": tp_rank, "pp_rank": 0, "dp_rank": dp_rank, "rows": rows,
           "logits": np.full((2, gn), float(g_tp_rank)),
           "grads": {"lm_head.weight": 10 * FULL[g_tp_rank * gn:(g_tp_rank + 1) * gn], "final_norm.weight": np.ones(2)},
           "params": {"lm_head.weight": FULL[tp_rank * n:(tp_rank + 1) * n], "final_norm.weight": np.ones(2)}}
    if first:
        out["first"] = {"tp_rank": g_tp_rank, "pp_rank": 0, "dp_rank": g_dp}
    return out


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class AssembleOverTwoLayouts(unittest.TestCase):
    CASE = {"model": {"vocab": VOCAB}, "parallel": {"tp": 2}, "train": {}}

    def test_gradients_in_the_first_layout_and_parameters_in_the_final_one(self):
        from shardfuzz_worker.targets.megatron_model import assemble_outputs

        # Saved as dp 2 (tp 1), resumed as tp 2 (dp 1): rank r was data-parallel rank r, then tensor-parallel rank r.
        outs = [rank(r, 2, 0, first=(0, 1, r), rows=(4 * r, 4 * r + 4)) for r in range(2)]
        full = assemble_outputs(self.CASE, outs)
        for r in range(2):
            np.testing.assert_array_equal(full[r]["params"]["lm_head.weight"], FULL)
            np.testing.assert_array_equal(full[r]["grads"]["lm_head.weight"], 10 * FULL)
            self.assertEqual(full[r]["rows"], (4 * r, 4 * r + 4))  # (each its own replica's rows at the first step)
            self.assertEqual(full[r]["logits"].shape, (2, VOCAB))

    def test_without_a_first_layout_both_come_from_the_final_one(self):
        from shardfuzz_worker.targets.megatron_model import assemble_outputs

        outs = [rank(r, 2, 0) for r in range(2)]
        full = assemble_outputs(self.CASE, outs)
        np.testing.assert_array_equal(full[1]["grads"]["lm_head.weight"], 10 * FULL)
        np.testing.assert_array_equal(full[1]["params"]["lm_head.weight"], FULL)
        np.testing.assert_array_equal(full[0]["logits"][:, 2:], np.ones((2, 2)))  # (tp rank 1's vocabulary shard)

    def test_a_first_layout_ignored_would_mix_the_layouts(self):
        """What the test above guards: gradients assembled over the final layout's replicas would stitch slices of
        different widths (tp 1's whole weight twice)."""
        from shardfuzz_worker.targets.megatron_model import assemble_outputs

        outs = [rank(r, 2, 0, first=(0, 1, r)) for r in range(2)]
        for o in outs:
            del o["first"]
        full = assemble_outputs(self.CASE, outs)
        self.assertEqual(full[0]["grads"]["lm_head.weight"].shape, (2 * VOCAB, HIDDEN))


if __name__ == "__main__":
    unittest.main()
