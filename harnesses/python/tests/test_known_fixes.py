"""Known fixes (the test suite's baseline of known findings) are applied in their table's order whatever the
order of the request, since two of them may wrap the same framework function; an unknown name is our error."""

import os
import unittest
from unittest import mock

from shardfuzz_worker import known_fixes


class KnownFixesTest(unittest.TestCase):
    def test_fixes_apply_in_the_tables_order_and_only_to_their_targets(self):
        calls = []
        table = {"first": (("t",), lambda: calls.append("first")), "second": (("t",), lambda: calls.append("second")),
                 "elsewhere": (("u",), lambda: calls.append("elsewhere"))}
        with mock.patch.dict(known_fixes.FIXES, table, clear=True), \
                mock.patch.dict(os.environ, {known_fixes.ENV: "elsewhere,second,first"}):
            known_fixes.apply("t")
        self.assertEqual(calls, ["first", "second"])

    def test_an_unknown_fix_is_raised(self):
        with mock.patch.dict(os.environ, {known_fixes.ENV: "no-such-fix"}):
            with self.assertRaisesRegex(KeyError, "no-such-fix"):
                known_fixes.apply("colossalai-hybrid")


class Released:
    def epilogue(self, i):
        self.seen[i] = True
        if i not in self.done:
            return "fresh"
        return "again"

    @staticmethod
    def twice(x):
        return x + x


class ReplaceInMethodTest(unittest.TestCase):
    """known_fixes._replace_in_method: the upstream fix of a released method, refused where the release differs."""

    def setUp(self):
        self.originals = dict(vars(Released))
        self.addCleanup(lambda: [setattr(Released, k, self.originals[k]) for k in ("epilogue", "twice")])

    def test_one_passage_is_replaced_and_a_static_method_stays_one(self):
        known_fixes._replace_in_method(Released, "epilogue", 'return "fresh"', 'return "fixed"', "f")
        known_fixes._replace_in_method(Released, "twice", "x + x", "2 * x", "g")
        r = Released()
        r.seen, r.done = {}, {}
        self.assertEqual(r.epilogue(0), "fixed")
        self.assertIsInstance(vars(Released)["twice"], staticmethod)
        self.assertEqual(Released.twice(3), 6)

    def test_two_fixes_of_one_method_both_apply(self):
        known_fixes._replace_in_method(Released, "epilogue", 'return "fresh"', 'return "fixed"', "f")
        known_fixes._replace_in_method(Released, "epilogue", 'return "again"', 'return "fixed again"', "g")
        known_fixes._replace_in_method(Released, "twice", "x + x", "2 * x", "h")
        known_fixes._replace_in_method(Released, "twice", "2 * x", "x * 2", "i")
        r = Released()
        r.seen, r.done = {}, {1: True}
        self.assertEqual((r.epilogue(0), r.epilogue(1)), ("fixed", "fixed again"))
        self.assertIsInstance(vars(Released)["twice"], staticmethod)
        self.assertEqual(Released.twice(3), 6)

    def test_a_release_without_the_passage_or_what_the_fix_requires_is_refused(self):
        with self.assertRaisesRegex(RuntimeError, "known fix f: the released code it patches has changed"):
            known_fixes._replace_in_method(Released, "epilogue", "no such line", "x", "f")
        with self.assertRaisesRegex(RuntimeError, "known fix f: the released code it patches has changed"):
            known_fixes._replace_in_method(Released, "epilogue", 'return "fresh"', 'return "fixed"', "f",
                                           requires=("self.accumulated[i] = ",))
        self.assertIs(vars(Released)["epilogue"], self.originals["epilogue"])


    def test_a_module_function_is_replaced_in_its_module(self):
        import types

        module = types.ModuleType("released_module")
        exec("def mask(x):\n    return x * 2\n\n\ndef caller(x):\n    return mask(x) + 1\n", module.__dict__)
        module.__file__ = __file__
        source = "def mask(x):\n    return x * 2\n"
        with mock.patch("inspect.getsource", lambda f: source), \
                mock.patch.dict("sys.modules", {"released_module": module}):
            known_fixes._replace_in_method(module, "mask", "x * 2", "x * 3", "f")
        self.assertEqual((module.mask(1), module.caller(1)), (3, 4))

if __name__ == "__main__":
    unittest.main()
