"""The framework-mutant benchmark (scripts/bench/mutants/) still applies to the pinned frameworks: each mutant's
old text occurs exactly once in the installed module, and the import hook really loads a module mutated in a
fresh process (and leaves it alone without SHARDFUZZ_MUTANT)."""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MUTANTS_DIR = os.path.join(ROOT, "scripts", "bench", "mutants")
HOOK_DIR = os.path.join(ROOT, "harnesses", "python", "tests", "faults")
REQUIREMENTS = os.path.join(ROOT, "harnesses", "python", "requirements")
sys.path.insert(0, MUTANTS_DIR)

from mutant_table import MUTANTS  # noqa: E402


def pinned(environment="main"):
    """{distribution: version} of an environment's requirement file."""
    pins = {}
    with open(os.path.join(REQUIREMENTS, f"{environment}.txt")) as f:
        for line in f:
            name, sep, version = line.split("#", 1)[0].strip().partition("==")
            if sep:
                pins[name.lower()] = version
    return pins


def installed_as_pinned(*distributions, environment="main"):
    pins = pinned(environment)
    try:
        return all(importlib.metadata.version(d).split("+")[0] == pins.get(d) for d in distributions)
    except importlib.metadata.PackageNotFoundError:
        return False


# A mutated module's top-level package: (its distribution, the environment that pins it).
DISTRIBUTION = {"torch": ("torch", "main"), "megatron": ("megatron-core", "main"), "deepspeed": ("deepspeed", "main"),
                "jax": ("jax", "main"), "colossalai": ("colossalai", "colossalai")}


class MutantTableTest(unittest.TestCase):
    def test_every_old_text_occurs_once_in_the_pinned_framework(self):
        checked = 0
        for name, (_target, module, old, new, _what) in MUTANTS.items():
            distribution, environment = DISTRIBUTION[module.split(".")[0]]
            if not installed_as_pinned(distribution, environment=environment):
                continue
            spec = importlib.util.find_spec(module)
            with open(spec.origin, encoding="utf-8") as f:
                source = f.read()
            self.assertEqual(source.count(old), 1, f"{name}: its old text in {spec.origin}")
            self.assertNotEqual(old, new, name)
            checked += 1
        if not checked:
            self.skipTest("none of the mutated frameworks is installed at its pinned version")

    @unittest.skipUnless(installed_as_pinned("torch"), "torch is not the pinned release")
    def test_the_hook_mutates_in_a_fresh_process_and_only_when_asked(self):
        probe = ("import torch; from torch.distributed.tensor._ops import _math_ops as m; "
                 "print(m.LINEAR_REDUCTION_OP_MAP[torch.ops.aten.sum.dim_IntList], getattr(m, '__shardfuzz_mutant__', None))")
        env = {k: v for k, v in os.environ.items() if k not in ("SHARDFUZZ_MUTANT", "SHARDFUZZ_TEST_FAULT")}
        env["PYTHONPATH"] = HOOK_DIR
        plain = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        self.assertEqual(plain.stdout.split(), ["sum", "None"])
        env["SHARDFUZZ_MUTANT"] = "dt-sum-reduce-op-max"
        mutated = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        self.assertEqual(mutated.stdout.split(), ["max", "dt-sum-reduce-op-max"])


if __name__ == "__main__":
    unittest.main()
