"""Release differences of megatron-core in one place (targets/megatron_release.py): an option the installed release
lacks is dropped where the case leaves it off and refuses the case where the case needs it; against the installed
release, every option of the table is one it has (the table names options newer than older releases only)."""

import dataclasses
import importlib.util
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfuzz_worker.targets import megatron_release  # noqa: E402

HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None


@dataclasses.dataclass
class OldConfig:
    """A config as a release before `reduce_scatter_with_fp32_accumulation` has it."""

    use_distributed_optimizer: bool = False
    bucket_size: int = None


def old_release():
    return mock.patch.multiple(megatron_release, config_class=lambda _name: OldConfig, installed_version=lambda: "0.0.1")


class OlderReleaseOptions(unittest.TestCase):
    def test_an_option_left_off_is_dropped(self):
        with old_release():
            kwargs = {"use_distributed_optimizer": True, "reduce_scatter_with_fp32_accumulation": False}
            self.assertIsNone(megatron_release.unsupported_options("DistributedDataParallelConfig", kwargs))
            config = megatron_release.new_config("DistributedDataParallelConfig", **kwargs)
        self.assertEqual(config, OldConfig(use_distributed_optimizer=True))

    def test_an_option_the_case_needs_refuses_it_naming_release_and_option(self):
        kwargs = {"use_distributed_optimizer": True, "reduce_scatter_with_fp32_accumulation": True}
        with old_release():
            why = megatron_release.unsupported_options("DistributedDataParallelConfig", kwargs)
            self.assertEqual(why, "megatron-core 0.0.1 has no DistributedDataParallelConfig."
                                  "reduce_scatter_with_fp32_accumulation (the case needs True)")
            # (reaching the ranks unrefused is our error, raised in the worker's own code: a harness error)
            with self.assertRaisesRegex(TypeError, "the case was not refused"):
                megatron_release.new_config("DistributedDataParallelConfig", **kwargs)

    def test_an_option_outside_the_table_is_never_dropped(self):
        with old_release():
            why = megatron_release.unsupported_options("DistributedDataParallelConfig", {"no_such_option": False})
        self.assertIn("no_such_option", why)


@unittest.skipUnless(HAVE_MEGATRON, "megatron-core is not installed")
class InstalledRelease(unittest.TestCase):
    def test_the_installed_release_has_every_option_of_the_table(self):
        for name, options in megatron_release.OPTIONS_OFF.items():
            for option, off in options.items():
                self.assertIsNone(megatron_release.unsupported_options(name, {option: not off}), (name, option))


if __name__ == "__main__":
    unittest.main()
