"""Source-text framework mutants for `scripts/bench/mutants.py` (the import-hook mechanism of
harnesses/python/tests/faults/sitecustomize.py, applied to a module's source instead of its objects).

Put this folder on PYTHONPATH and set SHARDFUZZ_MUTANT=<name> (a key of mutant_table.MUTANTS); every Python
process started with that environment (the worker, its rank processes, a forkserver) loads the named framework
module from its source with one exact text replaced (the old text must occur exactly once), compiled under the
original filename. Without SHARDFUZZ_MUTANT this does nothing but run the sitecustomize it shadows, if any.
SHARDFUZZ_MUTANT_TRACE=<file> appends "<pid> applied <name> to <module>" to that file at each application.
"""

import importlib.abc
import importlib.util
import os
import sys


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


class _MutateOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, modname, old, new, name):
        self.modname, self.old, self.new, self.name = modname, old, new, name

    def find_spec(self, name, path, target=None):
        if name != self.modname:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _MutatedLoader(spec.loader, spec.origin, self.old, self.new, self.name)
                sys.meta_path.remove(self)
                return spec
        return None


def _install(name):
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_shardfuzz_mutant_table", os.path.join(here, "mutant_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    if name not in table.MUTANTS:
        print(f"sitecustomize: unknown SHARDFUZZ_MUTANT {name!r} (known: {', '.join(table.MUTANTS)})", file=sys.stderr)
        return
    _target, modname, old, new, _what = table.MUTANTS[name]
    if modname in sys.modules:
        raise RuntimeError(f"SHARDFUZZ_MUTANT {name}: {modname} was imported before sitecustomize")
    sys.meta_path.insert(0, _MutateOnImport(modname, old, new, name))


def _run_shadowed():
    """The next sitecustomize on sys.path (this file shadows it)."""
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    for entry in sys.path:
        path = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.realpath(os.path.dirname(path)) != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_run_shadowed()
if os.environ.get("SHARDFUZZ_MUTANT"):
    _install(os.environ["SHARDFUZZ_MUTANT"])
