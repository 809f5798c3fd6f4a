"""Source-text framework mutants for `scripts/bench/mutants/run.py`, installed by the test-fault hook
(harnesses/python/tests/faults/sitecustomize.py) when SHARDFUZZ_MUTANT=<name> names a key of
mutant_table.MUTANTS: every Python process started with that folder on PYTHONPATH (the worker, its rank
processes, a forkserver) loads the named framework module from its source with one exact text replaced (the old
text must occur exactly once), compiled under the original filename.
SHARDFUZZ_MUTANT_TRACE=<file> appends "<pid> applied <name> to <module>" to that file at each application.
"""

import importlib.abc
import importlib.util
import os


class _MutatedLoader(importlib.abc.Loader):
    """Executes the module from its (mutated) source instead of its own loader's code."""

    def __init__(self, inner, origin, old, new, name):
        self.inner, self.origin, self.old, self.new, self.name = inner, origin, old, new, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        with open(self.origin, encoding="utf-8") as f:
            src = f.read()
        n = src.count(self.old)
        if n != 1:
            raise RuntimeError(f"SHARDFUZZ_MUTANT {self.name}: old text occurs {n} times in {self.origin}")
        src = src.replace(self.old, self.new)
        code = compile(src, self.origin, "exec", dont_inherit=True)
        module.__dict__["__shardfuzz_mutant__"] = self.name
        trace = os.environ.get("SHARDFUZZ_MUTANT_TRACE")
        if trace:
            with open(trace, "a") as f:
                f.write(f"{os.getpid()} applied {self.name} to {module.__name__}\n")
        exec(code, module.__dict__)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def mutant(name):
    """(module name, `wrap(spec) -> loader`) of a mutant: the loader the import hook puts in place of the module's."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_shardfuzz_mutant_table", os.path.join(here, "mutant_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    if name not in table.MUTANTS:
        raise KeyError(f"unknown SHARDFUZZ_MUTANT {name!r} (known: {', '.join(table.MUTANTS)})")
    _target, module, old, new, _what = table.MUTANTS[name]
    return module, lambda found: _MutatedLoader(found.loader, found.origin, old, new, name)
