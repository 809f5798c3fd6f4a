"""Line and branch coverage of the framework's own package, with sys.monitoring (PEP 669).

A PY_START callback enables LINE and BRANCH events only on code objects whose file lies under one of
the prefixes; every location reports once and is disabled, and `take()` re-arms everything for the
next case. The result is a set of 32-bit hashes the fuzzer folds into its coverage map.

Before Python 3.12 (the colossalai environment runs 3.10) there is no sys.monitoring: line coverage then
comes from sys.settrace, whose call hook traces only frames of code under the prefixes (no branch
events; every line event costs a callback, so it is slower).
"""

import sys
import zlib

_TOOL = 4  # sys.monitoring.OPTIMIZER_ID is 5; 4 is free for tools


class Coverage:
    def __init__(self, prefixes):
        self.prefixes = tuple(p for p in prefixes if p)
        self.hits = set()
        self.enabled = False
        self.mon = self.lines = None
        mon = getattr(sys, "monitoring", None)
        if not self.prefixes:
            return
        if mon is None:
            self._trace()
            return
        self.mon = mon
        ev = mon.events
        try:
            mon.use_tool_id(_TOOL, "shardfuzz")
        except ValueError:
            return
        mon.register_callback(_TOOL, ev.PY_START, self._start)
        mon.register_callback(_TOOL, ev.LINE, self._line)
        branch = getattr(ev, "BRANCH", None)
        if branch is not None:
            mon.register_callback(_TOOL, branch, self._branch)
        self.local = ev.LINE | (branch or 0)
        mon.set_events(_TOOL, ev.PY_START)
        self.enabled = True

    def _start(self, code, offset):
        if code.co_filename.startswith(self.prefixes):
            self.mon.set_local_events(_TOOL, code, self.local)
        return self.mon.DISABLE

    def _line(self, code, line):
        self.hits.add(zlib.crc32(f"{code.co_filename}:{code.co_firstlineno}:{line}".encode()))
        return self.mon.DISABLE

    def _branch(self, code, src, dst):
        self.hits.add(zlib.crc32(f"{code.co_filename}:{code.co_firstlineno}:{src}>{dst}".encode()))
        return self.mon.DISABLE

    def _trace(self):
        prefixes, lines = self.prefixes, set()
        self.lines = lines

        def local(frame, event, _arg):
            if event == "line":
                lines.add((frame.f_code, frame.f_lineno))
            return local

        def call(frame, _event, _arg):
            return local if frame.f_code.co_filename.startswith(prefixes) else None

        sys.settrace(call)
        self.enabled = True

    def take(self):
        hits = self.hits
        self.hits = set()
        if self.lines is not None:
            hits |= {zlib.crc32(f"{c.co_filename}:{c.co_firstlineno}:{n}".encode()) for c, n in self.lines}
            self.lines.clear()
        elif self.enabled:
            self.mon.restart_events()
        return hits
