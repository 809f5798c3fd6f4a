"""A library-op case's edits of its sample (`library_op.edits`): the fuzzer's handle on the dims, keepdim
flags, scalars and indices that OpInfo and the JAX table fix per sample.

An edit `{"arg": n, "edit": how}` changes the n-th *editable* argument of the call, in call order and n
taken modulo their count: a Python number (int, float or bool; not a tensor) or an integer index tensor.
Every edit is defined for every kind:

| edit      | int                   | float      | bool  | index tensor                         |
|-----------|-----------------------|------------|-------|--------------------------------------|
| increment | x + 1                 | x + 1      | not x | every index + 1                      |
| decrement | x − 1                 | x − 1      | not x | every index − 1                      |
| negate    | −x                    | −x         | not x | i → −i − 1 (the element from the end)|
| zero      | 0                     | 0          | False | sorted (the same set)                |
| flip      | x xor 1 (dim 0 ↔ 1)   | 1 / x      | not x | reversed (the same set)              |
| wrap      | d ↔ d − ndim          | x · 1e4    | not x | i → i − (max + 1)                    |
| beyond    | x + 32                | x + 32     | not x | the first index + 32                 |
| empty     | its list emptied (*)  | 0          | False | none of them (size 0 along dim 0)    |

(*) `empty` on an int inside a list or tuple of ints (a dim list, a shape, a padding) empties that list:
`dim=[0, 1]` becomes `dim=[]`, which ATen reads as every dim and numpy as none; a lone int becomes 0. These
list edits are applied first (`empty_lists`), the others then count the editable arguments of the call as
the emptied lists left it. A 0-d index tensor stays as it is.

`ndim` is the first tensor argument's. No edit makes two distinct indices name one element (every map on
an index tensor is injective and keeps negative and positive indexing apart), so ops that write at the
indices (scatter, index_copy, index_put) stay defined wherever they were. `beyond` (+32) is past every
dimension of a sample (OpInfo's largest common size is 20; the JAX table's 7) without growing a size
argument into an allocation this machine cannot hold.
"""

import numpy as np

EDITS = ("increment", "decrement", "negate", "zero", "flip", "wrap", "beyond", "empty")
BEYOND = 32


def edit_number(x, how, ndim):
    if isinstance(x, bool):
        return False if how in ("zero", "empty") else not x
    if isinstance(x, int):
        return {"increment": x + 1, "decrement": x - 1, "negate": -x, "zero": 0, "flip": x ^ 1,
                "wrap": x - max(ndim, 1) if x >= 0 else x + max(ndim, 1), "beyond": x + BEYOND, "empty": 0}[how]
    return {"increment": x + 1.0, "decrement": x - 1.0, "negate": -x, "zero": 0.0,
            "flip": 1.0 / x if x else x, "wrap": x * 1e4, "beyond": x + BEYOND, "empty": 0.0}[how]


def edit_indices(a, how):
    """An integer numpy array edited (0-d included: still an array)."""
    return np.asarray(_edit_indices(np.array(a, copy=True), how))


def _edit_indices(a, how):
    flat = a.reshape(-1)
    if flat.size == 0:
        return a
    if how == "increment":
        return a + 1
    if how == "decrement":
        return a - 1
    if how == "negate":
        return -a - 1
    if how == "zero":
        return np.sort(flat).reshape(a.shape)
    if how == "flip":
        return flat[::-1].copy().reshape(a.shape)
    if how == "wrap":
        return a - (flat.max() + 1)
    if how == "empty":
        return a[:0] if a.ndim else a
    flat[0] += BEYOND
    return a


def is_number(x):
    return type(x) in (bool, int, float)


def apply(leaves, edits, is_index, ndim, to_numpy, from_numpy):
    """`leaves` (a new list) with `edits` applied, and a note per edit. `is_index(leaf)` tells an integer
    index tensor; `to_numpy` / `from_numpy(array, like)` convert one."""
    leaves = list(leaves)
    editable = [i for i, x in enumerate(leaves) if is_number(x) or is_index(x)]
    notes = []
    for e in edits or []:
        how = e["edit"]
        if how not in EDITS:
            raise ValueError(f"library_op.edits: unknown edit {how!r} (one of {', '.join(EDITS)})")
        if not editable:
            notes.append(f"edit {how}: the sample has no editable argument (number or index tensor); run unchanged")
            continue
        i = editable[int(e["arg"]) % len(editable)]
        before = leaves[i]
        if is_number(before):
            leaves[i] = edit_number(before, how, ndim)
            notes.append(f"edit {how}: argument {i} {before!r} → {leaves[i]!r}")
        else:
            leaves[i] = from_numpy(edit_indices(to_numpy(before), how), before)
            notes.append(f"edit {how}: index tensor argument {i} {list(np.shape(to_numpy(before)))}")
    return leaves, notes


def warm_up(edits, run):
    """The case's warm-up call (`library_op.warmup`, these `edits`): `run()` makes and runs it (its results
    discarded) and returns its edit notes. Its failure is not the case's: the case's call runs next either way.
    Returns a note (none without a warm-up)."""
    if not edits:
        return []
    try:
        edit_notes = run()
    except Exception as e:  # noqa: BLE001 - the warm-up's own outcome is not the case's
        return [f"warm-up call (edits {edits}) raised {type(e).__name__}: {str(e)[:200]}; the case's call ran after it"]
    return [f"warm-up call (edits {edits}) ran before the case's call" + "".join(f"; {n}" for n in edit_notes)]


def _walk(tree, path, sort_dicts):
    """(path, leaf) of every leaf of nested tuples, lists and dicts, in the order the framework's pytree
    flattens them (dict keys in insertion order for torch, sorted for JAX)."""
    if isinstance(tree, (tuple, list)):
        for i, v in enumerate(tree):
            yield from _walk(v, path + (i,), sort_dicts)
    elif isinstance(tree, dict):
        for k in (sorted(tree) if sort_dicts else tree):
            yield from _walk(tree[k], path + (k,), sort_dicts)
    else:
        yield path, tree


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _replaced(tree, path, value):
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, k: _replaced(tree[k], rest, value)}
    items = list(tree)
    items[k] = _replaced(items[k], rest, value)
    return type(tree)(items) if type(tree) in (tuple, list) else tuple(items)


def is_int_list(x):
    return isinstance(x, (tuple, list)) and len(x) > 0 and all(type(v) is int for v in x)


def empty_lists(tree, edits, is_index, sort_dicts=False):
    """`tree` (the call's nested arguments) with every `empty` edit on an int inside a list or tuple of ints
    applied: that list emptied (same type). Returns (tree, the other edits, a note per applied edit); the other
    edits go on to apply() on the new tree's leaves."""
    rest, notes = [], []
    for e in edits or []:
        editable = [(p, x) for p, x in _walk(tree, (), sort_dicts) if is_number(x) or is_index(x)]
        if e.get("edit") == "empty" and editable:
            path, x = editable[int(e["arg"]) % len(editable)]
            container = _get(tree, path[:-1]) if path else None
            # torch's tree is ((positional arguments), {keywords}): the positional tuple is the call
            # itself, not a list argument (signal.windows.blackman(M) emptied to no argument at all).
            call_itself = isinstance(tree, tuple) and path[:-1] == (0,)
            if type(x) is int and is_int_list(container) and not call_itself:
                tree = _replaced(tree, path[:-1], type(container)())
                notes.append(f"edit empty: list argument {list(container)} → []")
                continue
        rest.append(e)
    return tree, rest, notes
