"""megatron_common.model_parallel's layout cache on two gloo ranks: more layouts than it keeps leave a bounded number
of gloo threads behind, and a layout it tore down works again when a case asks for it."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None

# (tp, pp, vs, instances, ep, etp) over two ranks: more than KEPT_LAYOUTS, the first asked for again at the end.
LAYOUTS = [(1, 1, 1, 1, 1, None), (2, 1, 1, 1, 1, None), (1, 2, 1, 1, 1, None), (1, 1, 1, 2, 1, None),
           (1, 1, 1, 1, 2, None), (2, 1, 1, 1, 1, 1), (1, 2, 2, 1, 1, None)]


def _threads():
    return len(os.listdir(f"/proc/{os.getpid()}/task"))


def _switch_layouts(rank, port, out):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from shardfuzz_worker.targets import megatron_common as mc

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mc.patch_cuda()
    threads, groups = [], []
    for layout in LAYOUTS * 3:
        mc.model_parallel(*layout)
        ones = torch.ones(1)
        dist.all_reduce(ones, group=ps.get_data_parallel_group())
        dist.all_reduce(ones, group=ps.get_tensor_model_parallel_group())  # (dp × tp: the ranks of a stage)
        threads.append(_threads())
        groups.append(len(ps._global_process_group_list))
        assert ones.item() == 2 // layout[1] and ps.get_tensor_model_parallel_world_size() == layout[0], (layout, ones)
    out[rank] = (threads, groups, len(mc._LAYOUTS["kept"]))
    dist.destroy_process_group()


@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed in this environment")
class LayoutCacheTest(unittest.TestCase):
    def test_layouts_beyond_those_kept_are_torn_down_and_built_again(self):
        import torch.multiprocessing as mp

        from shardfuzz_worker.targets.megatron_common import KEPT_LAYOUTS

        out = mp.Manager().dict()
        mp.spawn(_switch_layouts, args=(29583, out), nprocs=2)
        full = KEPT_LAYOUTS - 1  # (the step after which the cache is full: from then on, one layout in, one out)
        for rank in range(2):
            threads, groups, kept = out[rank]
            self.assertEqual(kept, KEPT_LAYOUTS)
            # Layouts differ by a few groups; keeping all seven would hold 7/4 of the full cache's.
            self.assertLessEqual(max(groups), groups[full] * 1.25, groups)
            self.assertLessEqual(max(threads), threads[full] * 1.25, threads)

if __name__ == "__main__":
    unittest.main()
