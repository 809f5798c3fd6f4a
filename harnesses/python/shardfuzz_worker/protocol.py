"""JSON lines on the real stdout; `print` inside frameworks is redirected to stderr."""

import json
import os
import sys

_OUT = None


def claim_stdout():
    """Keeps the real stdout for the protocol and points fd 1 (and sys.stdout) at stderr."""
    global _OUT
    fd = os.dup(1)
    os.dup2(2, 1)
    _OUT = os.fdopen(fd, "w", buffering=1)
    sys.stdout = sys.stderr


def send(obj):
    _OUT.write(json.dumps(obj, separators=(",", ":")) + "\n")
    _OUT.flush()


def receive():
    """The next command, or None at end of input."""
    line = sys.stdin.readline()
    if not line:
        return None
    return json.loads(line)
