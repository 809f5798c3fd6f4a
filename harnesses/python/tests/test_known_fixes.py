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


if __name__ == "__main__":
    unittest.main()
