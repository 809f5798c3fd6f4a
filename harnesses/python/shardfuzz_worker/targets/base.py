"""What every target shares: case helpers, shard ranges, assembling full tensors from rank pieces."""

import numpy as np


class Target:
    name = ""
    coverage_prefixes = ()
    #: Exception type names that mean "the framework refused this configuration".
    rejection_types = ()
    #: Message fragments that mark an exception of another type as a refusal.
    rejection_messages = ()

    def versions(self):
        return {}

    def unsupported(self, case):
        return None

    def world(self, case):
        p = case["parallel"]
        return p.get("dp", 1) * p.get("tp", 1) * p.get("pp", 1) * p.get("cp", 1)

    def init_rank(self, rank, world, timeout_s):
        pass

    def run_rank(self, rank, world, case, inputs):
        raise NotImplementedError

    def combine(self, case, outs):
        return outs[0]

    def run_local(self, case, inputs):
        raise NotImplementedError

    def is_rejection(self, type_name, module, message, tb):
        if type_name in self.rejection_types:
            return True
        return any(m in message for m in self.rejection_messages)


def chunk_range(n, parts, index):
    """The slice `index` of `parts` holds under torch.chunk splitting (last pieces smaller or empty)."""
    c = -(-n // parts) if parts else n
    start = min(index * c, n)
    return start, min(start + c, n)


def parallel(case):
    p = case["parallel"]
    return {k: p.get(k, d) for k, d in (("dp", 1), ("tp", 1), ("pp", 1), ("cp", 1), ("ep", 1))} | {
        "sequence_parallel": p.get("sequence_parallel", False),
        "zero_stage": p.get("zero_stage", 0),
        "microbatches": p.get("microbatches", 1),
    }


def dtype_name(case):
    return case["train"]["dtype"]


def reduce_dtype_name(case):
    return case["train"].get("reduce_dtype") or case["train"]["dtype"]


def assemble(shape, pieces):
    """Full tensor from `(ranges, local)` pieces, `ranges` one (start, stop) per dimension."""
    full = np.zeros(shape, dtype=np.float64)
    for ranges, local in pieces:
        idx = tuple(slice(a, b) for a, b in ranges)
        full[idx] = local
    return full
