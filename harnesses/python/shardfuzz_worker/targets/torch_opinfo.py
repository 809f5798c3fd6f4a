"""PyTorch's OpInfo database as a vocabulary: which ops exist, their sample inputs, and the single-device
computations the oracle compares a sharded run with (the float64 reference, the case dtype baseline, and
the noise members).

The sample inputs are the ones PyTorch's own op tests use (`op.sample_inputs`), drawn in float64 under
`torch.manual_seed(data.seed)` and then rounded to the case dtype, so the reference and every run see the
same values. Ops whose result is random or uninitialised memory are left out of the vocabulary.
"""

import collections
import functools

import numpy as np

#: Name fragments of ops whose result is random or uninitialised: nothing to compare.
NONDETERMINISTIC = ("rand", "dropout", "normal", "bernoulli", "multinomial", "uniform", "exponential",
                    "geometric", "cauchy", "log_normal", "empty", "randperm", "fractional_max_pool")

#: How many ops' sample lists stay cached (sample generation is most of a cheap op's cost).
SAMPLE_CACHE = 256


@functools.lru_cache(maxsize=1)
def op_table():
    """{(name, variant): OpInfo} for every op with a float64 CPU kernel and a deterministic result."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    untracked_samples()
    table = {}
    for op in op_db:
        if any(f in op.name for f in NONDETERMINISTIC):
            continue
        if torch.float64 not in op.supported_dtypes("cpu"):
            continue
        table[(op.name, op.variant_test_name)] = op
    return table


def untracked_samples():
    """OpInfo's sample iterators look for the running unittest.TestCase by walking the whole stack with
    `inspect.stack()` (twice per `sample_inputs` call: 24 ms each, measured in a torch-dtensor campaign, most
    of drawing a sample list). The worker never runs inside a TestCase, where that walk always ends in None,
    so it is answered None at once (releases without the hook are left as they are)."""
    import importlib

    for module in ("torch.testing._internal.common_utils", "torch.testing._internal.opinfo.core"):
        mod = importlib.import_module(module)
        if hasattr(mod, "extract_test_fn"):
            mod.extract_test_fn = lambda: None


def vocabulary():
    """[{name, variant, family}] in a stable order; family is the OpInfo class (UnaryUfuncInfo …)."""
    return [{"name": n, "variant": v, "family": type(op).__name__} for (n, v), op in sorted(op_table().items())]


def find(lib):
    op = op_table().get((lib["name"], lib.get("variant", "")))
    if op is None:
        raise KeyError(f"{lib['name']!r} (variant {lib.get('variant', '')!r}) is not in this torch's OpInfo vocabulary")
    return op


_samples = collections.OrderedDict()
#: Per op: how many samples it generates (the same under every seed: the generators draw values, not
#: structure), learnt the first time, so that later cases draw only up to the one they use.
_counts = {}


def sample(op, seed, grad, index):
    """(the sample `index` modulo their count, its index): the op's float64 sample inputs are drawn under
    `seed`, only as far as the one asked for once their count is known (drawing is most of a cheap op's cost)."""
    key = (op.name, op.variant_test_name, grad)
    count = _counts.get(key)
    got = _samples.get((key, seed), [])
    if count is None:
        got = draw(op, seed, grad)
        _counts[key] = count = len(got)
    want = index % count if count else 0
    if len(got) <= want:
        got = draw(op, seed, grad, want + 1)
        if len(got) <= want:
            # This seed draws fewer samples than the first one did: take them all.
            got = draw(op, seed, grad)
            want = index % len(got) if got else 0
    _samples[(key, seed)] = got
    _samples.move_to_end((key, seed))
    while len(_samples) > SAMPLE_CACHE:
        _samples.popitem(last=False)
    return (got[want], want) if got else (None, 0)


def draw(op, seed, grad, limit=None):
    """The first `limit` (all) sample inputs in float64 under `seed`."""
    import itertools

    import torch

    torch.manual_seed(seed % (2**63))
    return list(itertools.islice(op.sample_inputs("cpu", torch.float64, requires_grad=grad), limit))


def flatten(sample):
    """(leaves, spec, tensor positions) of the call `op(input, *args, **kwargs)`."""
    import torch
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten(((sample.input,) + tuple(sample.args), dict(sample.kwargs)))
    return leaves, spec, [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]


def call(op, leaves, spec):
    import torch.utils._pytree as pytree

    args, kwargs = pytree.tree_unflatten(leaves, spec)
    return op(*args, **kwargs)


def output_leaves(out):
    import torch
    import torch.utils._pytree as pytree

    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


def unit_roundoff(dtype_name):
    return {"f64": 2.0**-53, "f32": 2.0**-24, "bf16": 2.0**-8, "f16": 2.0**-11}[dtype_name]


class UnsupportedSample(Exception):
    """A sample shardfuzz cannot shard (sparse or nested tensors, no tensor output)."""


class Prepared:
    """One library-op case made concrete: the sample's tensors rounded to the case dtype (float64 values),
    which of them get gradients, and the upstream gradient of every float output."""

    def __init__(self, op, lib, seed, dtype_name):
        import torch

        self.op, self.dtype_name = op, dtype_name
        grad = bool(lib.get("backward", True)) and op.supports_autograd
        chosen, self.index = sample(op, seed, grad, int(lib.get("sample", 0)))
        if chosen is None:
            raise UnsupportedSample(f"OpInfo {op.name} generates no sample inputs on CPU in float64")
        chosen, edits, list_notes = emptied(chosen, lib.get("edits"))
        leaves, self.spec, self.positions = flatten(chosen)
        leaves, self.edit_notes = edited(leaves, edits)
        self.edit_notes = list_notes + self.edit_notes
        self.edits_key = repr(lib.get("edits") or [])
        self.views = list(lib.get("views") or [])
        odd = [str(leaves[i].layout) for i in self.positions if leaves[i].layout != torch.strided or leaves[i].is_nested]
        if odd:
            raise UnsupportedSample(f"sample {self.index} has {odd[0]} tensors: DTensor shards strided dense tensors")
        self.leaves = list(leaves)
        dt = torch_dtype(dtype_name)
        for i in self.positions:
            t = leaves[i].detach()
            if t.is_floating_point():
                t = t.to(dt).to(torch.float64)
            self.leaves[i] = t
        self.grad_args = [i for i in self.positions if grad and leaves[i].requires_grad and self.leaves[i].is_floating_point()]
        self.seed = seed

    def run(self, dtype, perturb=None, rng_seed=0):
        """The op single-device in `dtype` on the rounded inputs (times (1 + perturb·r), r = ±1, when
        given): `{name: float64 array}` with outputs `out/i` and gradients `grad/j` (j: tensor argument).
        torch's generator is seeded with `rng_seed` first (another seed tells a random op)."""
        import torch

        torch.manual_seed(rng_seed)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 7])
        leaves = list(self.leaves)
        for i in self.positions:
            t = leaves[i]
            if t.is_floating_point():
                if perturb:
                    t = t * torch.from_numpy(np.asarray(1 + perturb * rng.choice([-1.0, 1.0], size=tuple(t.shape))))
                t = t.to(dtype).detach().requires_grad_(i in self.grad_args)
            leaves[i] = t
        outs = [viewed(o, self.views) for o in output_leaves(call(self.op, leaves, self.spec))]
        self.integer_outputs = {f"out/{k}" for k, o in enumerate(outs) if not (o.is_floating_point() or o.is_complex())}
        result = {f"out/{k}": to_array(o) for k, o in enumerate(outs)}
        self.backward(outs, [leaves[i] for i in self.grad_args], result, perturb)
        return result

    def grad_outputs(self, outs):
        """The upstream gradient of each differentiable output (seeded, rounded to the case dtype)."""
        import torch

        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 11])
        dt = torch_dtype(self.dtype_name)
        return [torch.from_numpy(rng.standard_normal(tuple(o.shape))).to(dt) if o.requires_grad else None for o in outs]

    def backward(self, outs, inputs, result, perturb=None):
        """The gradients of `inputs` with the seeded upstream gradients, times (1 + perturb·r), r = ±1, when
        given: they are the backward's inputs (a gradient that sums them, broadcast_to's, moves with nothing
        else, while a sharded run rounds each rank's partial sum)."""
        import torch

        self.last_grad_outputs = self.grad_outputs(outs)
        used = self.last_grad_outputs
        if perturb:
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 13])
            used = [None if g is None else g.to(torch.float64) * torch.from_numpy(np.asarray(1 + perturb * rng.choice([-1.0, 1.0], size=tuple(g.shape))))
                    for g in used]
        pairs = [(o, g) for o, g in zip(outs, used) if g is not None]
        if not pairs or not inputs:
            return
        grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g.to(o.dtype) for o, g in pairs], allow_unused=True)
        for i, g in zip(self.grad_args, grads):
            if g is not None:
                result[f"grad/{self.positions.index(i)}"] = to_array(g)


def viewed(t, views):
    """An output (a tensor or a DTensor) through the case's views (`library_op.views`), each left out where it
    does not apply: transpose (dims 0 and n−1, n ≥ 2), permute (all dims reversed, n ≥ 3), flatten (n ≥ 2),
    unsqueeze (a leading dim), narrow (the first row of dim 0 dropped, size ≥ 2)."""
    for how in views:
        n = t.dim()
        if how == "transpose" and n >= 2:
            t = t.transpose(0, n - 1)
        elif how == "permute" and n >= 3:
            t = t.permute(*reversed(range(n)))
        elif how == "flatten" and n >= 2:
            t = t.reshape(-1)
        elif how == "unsqueeze":
            t = t.unsqueeze(0)
        elif how == "narrow" and n >= 1 and t.shape[0] >= 2:
            t = t.narrow(0, 1, t.shape[0] - 1)
    return t


def is_index_tensor(x):
    import torch

    return isinstance(x, torch.Tensor) and not (x.is_floating_point() or x.is_complex()) and x.dtype != torch.bool


def emptied(chosen, edits):
    """The sample with the case's list-emptying edits applied (sample_edits.empty_lists), the other edits,
    and a note per applied one."""
    if not any(e.get("edit") == "empty" for e in edits or []):
        return chosen, edits, []
    from ..sample_edits import empty_lists

    (args, kwargs), rest, notes = empty_lists(((chosen.input,) + tuple(chosen.args), dict(chosen.kwargs)), edits,
                                              is_index_tensor)
    return SampleCall(args[0], tuple(args[1:]), kwargs), rest, notes


class SampleCall:
    """An OpInfo sample's call after its argument lists were edited: what flatten() reads."""

    def __init__(self, input, args, kwargs):
        self.input, self.args, self.kwargs = input, args, kwargs


def edited(leaves, edits):
    """The call's leaves with the case's sample edits applied (sample_edits.py), and a note per edit."""
    if not edits:
        return leaves, []
    import torch

    from ..sample_edits import apply

    ndim = next((x.dim() for x in leaves if isinstance(x, torch.Tensor)), 0)
    return apply(leaves, edits, is_index_tensor, ndim, lambda t: t.detach().numpy(),
                 lambda a, like: torch.from_numpy(a).to(like.dtype))


def to_array(t):
    """A tensor as a float64 array (complex as a trailing [real, imaginary] dimension)."""
    import torch

    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return t.to(torch.float64).numpy()


def torch_dtype(name):
    import torch

    return {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]


def dtype_supported(op, dtype_name, backward):
    import torch

    dt = torch_dtype(dtype_name)
    if dt not in op.supported_dtypes("cpu"):
        return False
    return not backward or dt in op.supported_backward_dtypes("cpu")
