"""The JAX library-op vocabulary: `jax.numpy`, `jax.lax`, `jax.nn` and `jax.ops` functions with small
deterministic sample inputs, the JAX counterpart of PyTorch's OpInfo database (torch_opinfo.py).

Every op has a family (mutations swap ops within one) and a list of sample specs. A spec fixes the shapes,
the dtypes and the static keyword arguments; the values come from `data.seed`, so a case's structure (and
the compiled programs cached for it) depends on the sample index only. `samples(seed)` gives
`[(inputs, kwargs)]`: inputs are float64 arrays, int64 index arrays or bool masks, in argument order (every
input is a tensor argument that gets a placement); kwargs are static (Python values).

Shapes have 0 to 3 dims of sizes 1 to 7, so that uneven (and empty) shards over 2, 3 and 4 devices are
common. Domains are respected where the function has one (log on positive values, arcsin inside (-1, 1),
denominators away from zero), ops that pick or sort elements get distinct values (exactly representable in
bf16: no tie the rounding creates), `.at[].set` gets unique indices (which duplicate wins is unspecified),
and out-of-range indices appear only where JAX defines what they do (take's clip / fill modes, dropped
scatter updates, clamped dynamic_slice starts).

Composite functions with no JAX name of their own (losses, a layer norm) are named `shardfuzz.…`.
The op bodies use jax.numpy only; numpy draws the sample values.
"""

import math
import zlib

import numpy as np

from .jax_common import jax, jnp

lax = jax.lax


# ---------------------------------------------------------------------------------------- value makers
# A maker draws one input from a numpy Generator. The shape is fixed by the spec; the values by the seed.


def _arr(x):
    return np.asarray(x, dtype=np.float64)


def N(*s):
    """Standard normal."""
    return lambda r: _arr(r.standard_normal(s))


def U(lo, hi, *s):
    return lambda r: _arr(r.uniform(lo, hi, s))


def Pos(*s):
    """Positive, away from zero: [0.5, 2)."""
    return U(0.5, 2.0, *s)


def Away(*s):
    """Either sign, away from zero: ±[0.5, 2)."""
    return lambda r: _arr(r.uniform(0.5, 2.0, s) * r.choice([-1.0, 1.0], size=s))


def D(*s):
    """Distinct values k/8 (|k| < 128: exact in bf16, no ties after rounding or perturbation)."""
    n = math.prod(s)
    assert n <= 255, s

    def make(r):
        return _arr((r.permutation(n) - n // 2) * 0.125).reshape(s)

    return make


def Sorted(n, lo=-3.0):
    """Strictly increasing, steps of at least 0.3 (distinct in every dtype)."""
    return lambda r: _arr(lo + np.cumsum(r.uniform(0.3, 1.0, n)))


def I(lo, hi, *s):  # noqa: E743 - integers, as the specs read best
    """Integers in [lo, hi) (int64: x64 is on)."""
    return lambda r: np.asarray(r.integers(lo, hi, size=s), dtype=np.int64)


def Uniq(n, k, negative=False):
    """`k` distinct indices of a size-`n` dim (some written as negative indices when asked)."""

    def make(r):
        idx = r.permutation(n)[:k].astype(np.int64)
        if negative:
            idx = np.where(r.random(k) < 0.5, idx - n, idx)
        return idx

    return make


def Cover(n, k):
    """`n` segment ids in [0, k) (k <= n) that name every segment at least once, shuffled."""

    def make(r):
        ids = np.concatenate([np.arange(k), r.integers(0, k, n - k)])
        return r.permutation(ids).astype(np.int64)

    return make


def B(*s, p=0.5):
    """Bool mask, True with probability p."""
    return lambda r: np.asarray(r.random(s) < p)


def Well(*s):
    """Square matrices (batched: leading dims) that are well conditioned: normal + n·I."""
    n = s[-1]
    return lambda r: _arr(r.standard_normal(s) + n * np.eye(n))


def Spd(*s):
    """Symmetric positive definite: A Aᵀ + n·I."""
    n = s[-1]

    def make(r):
        a = r.standard_normal(s)
        return _arr(a @ np.swapaxes(a, -1, -2) + n * np.eye(n))

    return make


def Tri(*s):
    """Lower-triangular, well conditioned (diagonal ±[1, 2] + n)."""
    n = s[-1]

    def make(r):
        a = np.tril(r.standard_normal(s), -1)
        return _arr(a + np.eye(n) * (n + r.uniform(1.0, 2.0, s[:-1] + (1,))))

    return make


def Prob(*s):
    """Probabilities in (0.05, 0.95)."""
    return U(0.05, 0.95, *s)


class Spec:
    """One sample: makers in argument order and static keyword arguments."""

    __slots__ = ("makers", "kwargs")

    def __init__(self, *makers, **kwargs):
        self.makers, self.kwargs = makers, kwargs


S = Spec


class Op:
    __slots__ = ("name", "family", "fn", "specs", "grad")

    def __init__(self, name, family, fn, specs, grad=True):
        self.name, self.family, self.fn, self.specs, self.grad = name, family, fn, list(specs), grad

    def samples(self, seed):
        """[(inputs, kwargs)]: the specs' values drawn from `seed` (deterministic)."""
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(self.name.encode())])
        return [([m(rng) for m in spec.makers], dict(spec.kwargs)) for spec in self.specs]

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


TABLE = {}
#: Ops of the table that the installed JAX release does not have: name -> why (shown by `targets`; a case
#: naming one is unsupported, not an error).
MISSING = {}


def api(path):
    """The JAX function `path` ("jax.numpy.cumulative_sum") names, or None where this release lacks it."""
    obj = jax
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def op(name, family, fn, specs, grad=True):
    assert name not in TABLE and name not in MISSING, name
    assert specs, name
    if fn is None:
        MISSING[name] = f"{name} is not in jax {jax.__version__}"
        return
    TABLE[name] = Op(name, family, fn, specs, grad)


# ---------------------------------------------------------------------------------------- shapes

SHAPES = [(), (5,), (3, 4), (2, 3, 5), (7,), (1, 6), (4, 1, 3)]


def elementwise(maker):
    return [S(maker(*s)) for s in SHAPES]


#: Broadcasting pairs for binary ops (same shapes, trailing broadcast, both-sided, scalar).
PAIRS = [((5,), (5,)), ((3, 4), (4,)), ((5, 1), (1, 3)), ((), (2, 3)), ((2, 3, 4), (2, 3, 4)), ((6, 2), (6, 2)),
         ((3, 1, 5), (4, 1))]
SAME = [((5,), (5,)), ((3, 4), (3, 4)), ((2, 3, 5), (2, 3, 5)), ((), ()), ((7, 2), (7, 2))]


def binary(ma, mb, pairs=PAIRS):
    return [S(ma(*a), mb(*b)) for a, b in pairs]


# ---------------------------------------------------------------------------------------- unary

for _name, _maker in [
    ("exp", N), ("expm1", N), ("exp2", N), ("log", Pos), ("log1p", Pos), ("log2", Pos), ("log10", Pos),
    ("sqrt", Pos), ("cbrt", Away), ("reciprocal", Away), ("tanh", N), ("sinh", N), ("cosh", N), ("sin", N),
    ("cos", N), ("tan", lambda *s: U(-1.2, 1.2, *s)), ("arcsin", lambda *s: U(-0.9, 0.9, *s)),
    ("arccos", lambda *s: U(-0.9, 0.9, *s)), ("arctan", N), ("arcsinh", N), ("arccosh", lambda *s: U(1.1, 3.0, *s)),
    ("arctanh", lambda *s: U(-0.9, 0.9, *s)), ("abs", Away), ("negative", N), ("square", N), ("sign", Away),
    ("floor", N), ("ceil", N), ("trunc", N), ("sinc", Away), ("deg2rad", N), ("fabs", Away),
]:
    op(f"jax.numpy.{_name}", "unary", api(f"jax.numpy.{_name}"), elementwise(_maker))

op("jax.numpy.round", "unary", api("jax.numpy.round"), [S(N(5)), S(N(3, 4), decimals=1), S(N(2, 3, 2), decimals=2), S(N()),
                                           S(U(-3, 3, 7), decimals=0)])
op("jax.numpy.nan_to_num", "unary", api("jax.numpy.nan_to_num"), elementwise(N))

for _name, _maker, _kw in [
    ("relu", N, {}), ("gelu", N, {}), ("silu", N, {}), ("softplus", N, {}), ("sigmoid", N, {}), ("elu", N, {}),
    ("leaky_relu", N, {"negative_slope": 0.1}), ("log_sigmoid", N, {}), ("selu", N, {}), ("celu", N, {}),
    ("hard_tanh", lambda *s: U(-2, 2, *s), {}), ("mish", N, {}), ("relu6", lambda *s: U(-2, 8, *s), {}),
    ("squareplus", N, {}),
]:
    op(f"jax.nn.{_name}", "unary", api(f"jax.nn.{_name}"), [S(_maker(*s), **_kw) for s in SHAPES])
TABLE["jax.nn.gelu"].specs.append(S(N(3, 5), approximate=False))

for _name, _maker in [
    ("logistic", N), ("erf", N), ("erfc", N), ("erf_inv", lambda *s: U(-0.9, 0.9, *s)), ("lgamma", Pos),
    ("digamma", Pos), ("rsqrt", Pos), ("exp", N), ("tanh", N), ("square", N), ("cbrt", Away),
]:
    op(f"jax.lax.{_name}", "unary", api(f"jax.lax.{_name}"), elementwise(_maker))
op("jax.lax.integer_pow", "unary", api("jax.lax.integer_pow"), [S(Away(5), y=2), S(Away(3, 4), y=3), S(Away(2, 3, 2), y=-2),
                                                     S(Away(), y=5), S(Away(7), y=1)])

# ---------------------------------------------------------------------------------------- binary

for _name, _mb in [("add", N), ("subtract", N), ("multiply", N), ("divide", Away), ("maximum", N), ("minimum", N),
                   ("fmax", N), ("fmin", N), ("hypot", Away), ("copysign", Away), ("logaddexp", N),
                   ("logaddexp2", N), ("floor_divide", Away), ("fmod", Away), ("remainder", Away)]:
    op(f"jax.numpy.{_name}", "binary", api(f"jax.numpy.{_name}"), binary(N, _mb))
op("jax.numpy.power", "binary", api("jax.numpy.power"), binary(Pos, lambda *s: U(-2, 2, *s)))
op("jax.numpy.arctan2", "binary", api("jax.numpy.arctan2"), binary(Away, Away))
op("jax.numpy.ldexp", "binary", api("jax.numpy.ldexp"), binary(N, lambda *s: I(-3, 4, *s)))
for _name in ("greater", "less_equal", "equal"):
    op(f"jax.numpy.{_name}", "binary", api(f"jax.numpy.{_name}"), binary(D, D, [((5,), (5,)), ((3, 4), (4,)), ((2, 2, 3), (2, 2, 3))]))
for _name, _mb in [("add", N), ("sub", N), ("mul", N), ("div", Away), ("max", N), ("min", N), ("atan2", Away),
                   ("rem", Away), ("nextafter", N)]:
    op(f"jax.lax.{_name}", "binary", api(f"jax.lax.{_name}"), binary(Away if _name == "atan2" else N, _mb, SAME),
       grad=_name != "nextafter")
op("jax.lax.pow", "binary", api("jax.lax.pow"), binary(Pos, N, SAME))

# ---------------------------------------------------------------------------------------- select / clip

op("jax.numpy.where", "select", api("jax.numpy.where"), [
    S(B(5), N(5), N(5)), S(B(3, 4), N(3, 4), N(4)), S(B(2, 1, 3), N(2, 4, 3), N()), S(B(6), N(6), N(1)),
    S(B(3, 5), N(1, 5), N(3, 1)),
])
op("jax.lax.select_n", "select", api("jax.lax.select_n"), [
    S(B(5), N(5), N(5)), S(I(0, 3, 3, 4), N(3, 4), N(3, 4), N(3, 4)), S(B(), N(2, 3), N(2, 3)),
    S(I(0, 2, 2, 3, 2), N(2, 3, 2), N(2, 3, 2)),
])
op("jax.numpy.select", "select", lambda c1, c2, x1, x2, default=0.0: jnp.select([c1, c2], [x1, x2], default), [
    S(B(5), B(5), N(5), N(5)), S(B(3, 4), B(3, 4), N(3, 4), N(4), default=-1.0), S(B(2, 3), B(3), N(2, 3), N(), default=0.5),
])
op("jax.numpy.clip", "select", api("jax.numpy.clip"), [
    S(N(5), min=-0.5, max=0.5), S(N(3, 4), min=0.0), S(N(2, 3, 5), max=0.25), S(N(), min=-1.0, max=1.0),
    S(N(4, 6), N(4, 6), N(4, 6)),  # array bounds: min and max as arguments
])
op("jax.lax.clamp", "select", lambda lo, x, hi: lax.clamp(lo, x, hi), [
    # (Scalar bounds around an array: JAX cannot differentiate them, every backward case would be unsupported.)
    S(U(-1, -0.5, 5), N(5), U(0.5, 1.0, 5)), S(U(-1, -0.5, 3, 4), N(3, 4), U(0.5, 1, 3, 4)), S(U(-1, -0.2), N(), U(0.2, 1)),
])

# ---------------------------------------------------------------------------------------- reductions

REDUCE = [
    S(N(5)), S(N(3, 5), axis=0), S(N(3, 5), axis=-1, keepdims=True), S(N(2, 3, 5), axis=(0, 2)),
    S(N(4, 6), axis=None), S(N(2, 5, 3), axis=1, keepdims=True), S(N()), S(N(7, 1), axis=1),
]


def _with(specs, maker):
    """The reduction specs with their input drawn by another maker of the same shape."""
    out = []
    for spec in specs:
        shape = np.shape(spec.makers[0](np.random.default_rng(0)))
        out.append(S(maker(*shape), **spec.kwargs))
    return out


for _name in ("sum", "mean", "nansum"):
    op(f"jax.numpy.{_name}", "reduction", api(f"jax.numpy.{_name}"), REDUCE)
for _name in ("max", "min", "amax", "ptp", "median"):
    op(f"jax.numpy.{_name}", "reduction", api(f"jax.numpy.{_name}"), _with(REDUCE, D))
op("jax.numpy.prod", "reduction", api("jax.numpy.prod"), _with(REDUCE, lambda *s: U(0.6, 1.5, *s)))
op("jax.numpy.var", "reduction", api("jax.numpy.var"), REDUCE[1:6] + [S(N(6), ddof=1), S(N(3, 4), axis=1, ddof=1)])
op("jax.numpy.std", "reduction", api("jax.numpy.std"), REDUCE[1:6] + [S(N(6), ddof=1)])
op("jax.nn.logsumexp", "reduction", api("jax.nn.logsumexp"), REDUCE)
op("jax.numpy.argmax", "reduction", api("jax.numpy.argmax"), [S(D(7)), S(D(3, 5), axis=0), S(D(3, 5), axis=-1, keepdims=True),
                                                 S(D(2, 3, 4), axis=1), S(D(4, 6))])
op("jax.numpy.argmin", "reduction", api("jax.numpy.argmin"), [S(D(7)), S(D(3, 5), axis=1), S(D(2, 3, 4), axis=-1, keepdims=True),
                                                 S(D(5, 2), axis=0)])
_BOOL_REDUCE = [S(B(5, p=0.8)), S(B(3, 5, p=0.7), axis=0), S(B(2, 3, 4, p=0.9), axis=(1, 2)), S(B(4, 6, p=0.3), axis=1, keepdims=True)]
op("jax.numpy.any", "reduction", api("jax.numpy.any"), [S(B(5, p=0.2)), S(B(3, 5, p=0.2), axis=0), S(B(2, 3, 4, p=0.1), axis=(1, 2)),
                                           S(B(4, 6, p=0.3), axis=1, keepdims=True)])
op("jax.numpy.all", "reduction", api("jax.numpy.all"), _BOOL_REDUCE)
op("jax.numpy.count_nonzero", "reduction", api("jax.numpy.count_nonzero"), [S(B(5)), S(B(3, 5), axis=0), S(B(2, 3, 4), axis=(0, 2))])
op("jax.numpy.average", "reduction", lambda a, w, **kw: jnp.average(a, weights=w, **kw), [
    S(N(5), Pos(5)), S(N(3, 4), Pos(4), axis=1), S(N(3, 4), Pos(3, 4), axis=None),
                                                   S(N(2, 3, 5), Pos(3), axis=1)])
op("jax.numpy.quantile", "reduction", api("jax.numpy.quantile"), [S(D(7), q=0.3), S(D(3, 5), q=0.5, axis=1), S(D(4, 6), q=0.75, axis=0, keepdims=True)])
op("jax.numpy.linalg.norm", "reduction", api("jax.numpy.linalg.norm"), [
    S(Away(5)), S(Away(3, 4)), S(Away(3, 4), axis=1), S(Away(6), ord=1), S(Away(7), ord=jnp.inf), S(Away(2, 3, 4), axis=(1, 2)),
    S(Away(3, 5), ord="fro"),
])
op("jax.numpy.trapezoid", "reduction", api("jax.numpy.trapezoid"), [S(N(5)), S(N(3, 6), axis=0), S(N(2, 5), dx=0.5)])
for _name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
    _m = D if _name in ("reduce_max", "reduce_min") else (lambda *s: U(0.6, 1.5, *s)) if _name == "reduce_prod" else N
    op(f"jax.lax.{_name}", "reduction", api(f"jax.lax.{_name}"),
       [S(_m(5), axes=(0,)), S(_m(3, 5), axes=(1,)), S(_m(2, 3, 4), axes=(0, 2)), S(_m(4, 6), axes=(0, 1))])

# ---------------------------------------------------------------------------------------- cumulative

CUM = [S(N(5)), S(N(3, 5), axis=0), S(N(3, 5), axis=-1), S(N(2, 3, 4), axis=1), S(N(4, 3))]
op("jax.numpy.cumsum", "cumulative", api("jax.numpy.cumsum"), CUM)
op("jax.numpy.cumprod", "cumulative", api("jax.numpy.cumprod"), _with(CUM, lambda *s: U(0.6, 1.5, *s)))
op("jax.numpy.cumulative_sum", "cumulative", api("jax.numpy.cumulative_sum"), [
    S(N(5)), S(N(3, 5), axis=0, include_initial=True), S(N(2, 3, 4), axis=-1)])
op("jax.numpy.cumulative_prod", "cumulative", api("jax.numpy.cumulative_prod"), [
    S(U(0.6, 1.5, 5)), S(U(0.6, 1.5, 3, 5), axis=1, include_initial=True), S(U(0.6, 1.5, 4, 3), axis=0)])
LAXCUM = [S(N(5)), S(N(3, 5), axis=1), S(N(3, 5), axis=0, reverse=True), S(N(2, 3, 4), axis=2), S(N(6, 2), reverse=True)]
op("jax.lax.cumsum", "cumulative", api("jax.lax.cumsum"), LAXCUM)
op("jax.lax.cumprod", "cumulative", api("jax.lax.cumprod"), _with(LAXCUM, lambda *s: U(0.6, 1.5, *s)))
op("jax.lax.cummax", "cumulative", api("jax.lax.cummax"), _with(LAXCUM, D))
op("jax.lax.cummin", "cumulative", api("jax.lax.cummin"), _with(LAXCUM, D))
op("jax.lax.cumlogsumexp", "cumulative", api("jax.lax.cumlogsumexp"), LAXCUM)
op("jax.numpy.diff", "cumulative", api("jax.numpy.diff"), [S(N(5)), S(N(3, 5), axis=0), S(N(3, 6), n=2), S(N(2, 4, 3), axis=1)])
op("jax.numpy.ediff1d", "cumulative", api("jax.numpy.ediff1d"), [S(N(5)), S(N(3, 4))])
op("jax.lax.associative_scan", "cumulative", lambda x, axis=0, reverse=False: lax.associative_scan(jnp.add, x, reverse, axis),
   [S(N(7)), S(N(3, 5), axis=1), S(N(4, 3), reverse=True)])

# ---------------------------------------------------------------------------------------- matmul

MM = [((3, 4), (4, 5)), ((5,), (5,)), ((2, 3, 4), (4, 2)), ((2, 3, 4), (2, 4, 5)), ((4,), (4, 3)), ((6, 2), (2,)),
      ((1, 7), (7, 1))]
op("jax.numpy.matmul", "matmul", api("jax.numpy.matmul"), [S(N(*a), N(*b)) for a, b in MM])
op("jax.numpy.dot", "matmul", api("jax.numpy.dot"), [S(N(*a), N(*b)) for a, b in MM[:3] + MM[4:]] + [S(N(), N(3, 2))])
op("jax.numpy.vdot", "matmul", api("jax.numpy.vdot"), [S(N(5), N(5)), S(N(3, 4), N(3, 4))])
op("jax.numpy.inner", "matmul", api("jax.numpy.inner"), [S(N(5), N(5)), S(N(3, 4), N(2, 4)), S(N(2, 3, 4), N(4))])
op("jax.numpy.outer", "matmul", api("jax.numpy.outer"), [S(N(5), N(3)), S(N(4), N(7)), S(N(2, 3), N(2))])
op("jax.numpy.einsum", "matmul", lambda *xs, subscripts: jnp.einsum(subscripts, *xs), [
    S(N(3, 4), N(4, 5), subscripts="ij,jk->ik"), S(N(2, 3, 4), N(2, 4, 5), subscripts="bij,bjk->bik"),
    S(N(5), N(5), subscripts="i,i->"), S(N(2, 3, 4), N(4), subscripts="ijk,k->ij"),
    S(N(3, 4), N(3, 5), subscripts="ij,ik->jk"), S(N(2, 3, 4), N(3, 4, 2), N(2, 5), subscripts="abc,bcd,de->ae"),
    S(N(4, 3), subscripts="ij->ji"), S(N(3, 5), subscripts="ij->i"),
])
op("jax.lax.dot_general", "matmul", api("jax.lax.dot_general"), [
    S(N(3, 4), N(4, 5), dimension_numbers=(((1,), (0,)), ((), ()))),
    S(N(2, 3, 4), N(2, 4, 5), dimension_numbers=(((2,), (1,)), ((0,), (0,)))),
    S(N(3, 4, 2), N(2, 4, 5), dimension_numbers=(((1, 2), (1, 0)), ((), ()))),
    S(N(5, 3), N(5, 2), dimension_numbers=(((0,), (0,)), ((), ()))),
    S(N(2, 3, 4), N(2, 3, 5), dimension_numbers=(((), ()), ((0, 1), (0, 1)))),
])
op("jax.numpy.tensordot", "matmul", api("jax.numpy.tensordot"), [
    S(N(3, 4), N(4, 5), axes=1), S(N(2, 3, 4), N(3, 4, 5), axes=2), S(N(3, 4, 2), N(2, 4, 3), axes=((1, 2), (1, 0))),
    S(N(3), N(4), axes=0),
])
op("jax.lax.dot", "matmul", api("jax.lax.dot"), [S(N(3, 4), N(4, 5)), S(N(5), N(5)), S(N(4, 6), N(6))])
op("jax.lax.batch_matmul", "matmul", api("jax.lax.batch_matmul"), [S(N(2, 3, 4), N(2, 4, 5)), S(N(3, 1, 5), N(3, 5, 2))])
op("jax.numpy.linalg.multi_dot", "matmul", lambda a, b, c: jnp.linalg.multi_dot([a, b, c]),
   [S(N(3, 4), N(4, 5), N(5, 2)), S(N(4), N(4, 3), N(3))])
op("jax.numpy.vecdot", "matmul", api("jax.numpy.vecdot"), [S(N(5), N(5)), S(N(3, 4), N(3, 4)), S(N(2, 3, 4), N(4)), S(N(4, 3), N(4, 3), axis=0)])
op("jax.numpy.matvec", "matmul", api("jax.numpy.matvec"), [S(N(3, 4), N(4)), S(N(2, 3, 5), N(2, 5))])
op("jax.numpy.vecmat", "matmul", api("jax.numpy.vecmat"), [S(N(3), N(3, 4)), S(N(2, 5), N(2, 5, 3))])
op("jax.numpy.kron", "matmul", api("jax.numpy.kron"), [S(N(2, 3), N(3, 2)), S(N(3), N(4)), S(N(2, 2), N(1, 3))])
op("jax.numpy.cross", "matmul", api("jax.numpy.cross"), [S(N(3), N(3)), S(N(4, 3), N(4, 3)), S(N(2, 3), N(3)), S(N(3, 5), N(3, 5), axis=0)])

# ---------------------------------------------------------------------------------------- conv (and pooling)

_C1 = ("NCH", "OIH", "NCH")
_C2 = ("NCHW", "OIHW", "NCHW")
op("jax.lax.conv_general_dilated", "conv", api("jax.lax.conv_general_dilated"), [
    S(N(2, 3, 7), N(4, 3, 3), window_strides=(1,), padding="VALID", dimension_numbers=_C1),
    S(N(1, 2, 6), N(3, 2, 2), window_strides=(2,), padding="SAME", dimension_numbers=_C1),
    S(N(2, 2, 5, 6), N(3, 2, 3, 2), window_strides=(1, 1), padding=((1, 1), (0, 1)), dimension_numbers=_C2),
    S(N(1, 4, 5, 5), N(4, 2, 2, 2), window_strides=(1, 2), padding="VALID", dimension_numbers=_C2, feature_group_count=2),
    S(N(2, 3, 7), N(2, 3, 2), window_strides=(1,), padding=((2, 0),), rhs_dilation=(2,), dimension_numbers=_C1),
    S(N(1, 5, 6, 2), N(3, 3, 2, 4), window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
    S(N(1, 2, 5), N(3, 2, 2), window_strides=(1,), padding=((1, 1),), lhs_dilation=(2,), dimension_numbers=_C1),
])
op("jax.lax.conv", "conv", api("jax.lax.conv"), [
    S(N(2, 3, 6, 5), N(4, 3, 3, 2), window_strides=(1, 1), padding="VALID"),
    S(N(1, 2, 7, 7), N(2, 2, 3, 3), window_strides=(2, 2), padding="SAME"),
])
op("jax.lax.conv_with_general_padding", "conv", api("jax.lax.conv_with_general_padding"), [
    S(N(1, 2, 5, 6), N(3, 2, 2, 3), window_strides=(1, 1), padding=((1, 0), (2, 1)), lhs_dilation=(1, 1), rhs_dilation=(1, 2)),
])
op("jax.lax.conv_transpose", "conv", api("jax.lax.conv_transpose"), [
    S(N(1, 4, 4, 3), N(3, 3, 3, 2), strides=(2, 2), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
    S(N(2, 5, 3), N(2, 3, 4), strides=(1,), padding="VALID", dimension_numbers=("NHC", "HIO", "NHC")),
])
op("jax.numpy.convolve", "conv", api("jax.numpy.convolve"), [S(N(7), N(3)), S(N(5), N(4), mode="same"), S(N(6), N(2), mode="valid")])
op("jax.numpy.correlate", "conv", api("jax.numpy.correlate"), [S(N(7), N(3)), S(N(5), N(4), mode="same"), S(N(6), N(3), mode="full")])


def _reduce_window(x, how, window, strides, padding):
    # A Python scalar init: JAX recognises the monoid (max / add / min) and can differentiate it; an init
    # array made inside the trace is a tracer, which makes it the generic, non-differentiable reduce_window.
    init, fn = {"max": (-jnp.inf, lax.max), "sum": (0.0, lax.add), "min": (jnp.inf, lax.min)}[how]
    return lax.reduce_window(x, init, fn, window, strides, padding)


op("jax.lax.reduce_window", "conv", _reduce_window, [
    S(D(2, 3, 6), how="max", window=(1, 1, 2), strides=(1, 1, 2), padding="VALID"),
    S(N(1, 5, 7), how="sum", window=(1, 3, 3), strides=(1, 1, 2), padding="SAME"),
    S(D(4, 6), how="max", window=(2, 2), strides=(1, 1), padding=((0, 1), (1, 0))),
    S(D(7), how="min", window=(3,), strides=(2,), padding="VALID"),
])

# ---------------------------------------------------------------------------------------- indexing

op("jax.numpy.take", "indexing", api("jax.numpy.take"), [
    S(N(5, 3), I(-2, 7, 4), axis=0, mode="clip"), S(N(3, 6), I(-8, 9, 2, 3), axis=1, mode="fill", fill_value=0.0),
    S(N(7), I(0, 7, 5), mode="clip"), S(N(2, 3, 4), I(-3, 3, 6), axis=-1, mode="fill", fill_value=-1.0),
    S(N(4, 3), I(-20, 20, 3, 2), mode="clip"), S(N(6, 2), I(0, 6), axis=0, mode="clip"),
])
op("jax.numpy.take_along_axis", "indexing", api("jax.numpy.take_along_axis"), [
    S(N(3, 5), I(0, 5, 3, 2), axis=1), S(N(4, 3), I(-4, 4, 6, 3), axis=0), S(N(2, 3, 4), I(0, 4, 2, 3, 4), axis=-1),
    S(N(6), I(0, 6, 6), axis=0),
])


def _dynamic_slice(x, *starts, sizes):
    return lax.dynamic_slice(x, starts, sizes)


op("jax.lax.dynamic_slice", "indexing", _dynamic_slice, [
    S(N(5, 6), I(0, 5), I(0, 6), sizes=(2, 3)), S(N(7), I(-3, 9), sizes=(4,)),  # starts out of range: clamped
    S(N(3, 4, 5), I(0, 3), I(-2, 6), I(0, 5), sizes=(2, 2, 5)), S(N(6, 3), I(4, 9), I(0, 1), sizes=(3, 3)),
])


def _dynamic_update_slice(x, u, *starts):
    return lax.dynamic_update_slice(x, u, starts)


op("jax.lax.dynamic_update_slice", "indexing", _dynamic_update_slice, [
    S(N(5, 6), N(2, 3), I(0, 5), I(0, 6)), S(N(7), N(3), I(-2, 10)), S(N(3, 4, 5), N(1, 4, 2), I(0, 3), I(0, 1), I(-1, 6)),
    S(N(6, 2), N(6, 2), I(0, 3), I(0, 2)),
])
op("jax.lax.dynamic_slice_in_dim", "indexing", api("jax.lax.dynamic_slice_in_dim"), [
    S(N(6, 3), I(0, 6), slice_size=2, axis=0), S(N(3, 7), I(-2, 9), slice_size=4, axis=1), S(N(5), I(0, 5), slice_size=5)])
op("jax.lax.dynamic_update_slice_in_dim", "indexing", api("jax.lax.dynamic_update_slice_in_dim"), [
    S(N(6, 3), N(2, 3), I(0, 6), axis=0), S(N(3, 7), N(3, 4), I(-2, 9), axis=1)])
op("jax.lax.dynamic_index_in_dim", "indexing", api("jax.lax.dynamic_index_in_dim"), [
    S(N(6, 3), I(0, 6), axis=0), S(N(3, 7), I(0, 7), axis=1, keepdims=False)])
op("jax.lax.slice", "indexing", api("jax.lax.slice"), [
    S(N(5, 6), start_indices=(1, 2), limit_indices=(4, 6)), S(N(7), start_indices=(0,), limit_indices=(7,), strides=(2,)),
    S(N(3, 4, 5), start_indices=(0, 1, 1), limit_indices=(3, 4, 5), strides=(2, 1, 3)),
    S(N(6, 3), start_indices=(5, 0), limit_indices=(6, 3)),
])
op("jax.lax.slice_in_dim", "indexing", api("jax.lax.slice_in_dim"), [
    S(N(6, 3), start_index=1, limit_index=5, axis=0), S(N(3, 7), start_index=-4, limit_index=None, stride=2, axis=1)])
op("jax.lax.index_in_dim", "indexing", api("jax.lax.index_in_dim"), [S(N(6, 3), index=2, axis=0), S(N(3, 7), index=-1, axis=1, keepdims=False)])


def _getitem(x, *idx, pattern):
    if pattern == "rows":
        return x[idx[0]]
    if pattern == "cols":
        return x[:, idx[0]]
    if pattern == "both":
        return x[idx[0], idx[1]]
    if pattern == "strided":
        return x[1::2, idx[0]]
    if pattern == "last":
        return x[..., idx[0]]
    raise ValueError(pattern)


op("jax.numpy.ndarray.__getitem__", "indexing", _getitem, [
    S(N(5, 3), I(-5, 5, 4), pattern="rows"), S(N(3, 6), I(0, 6, 2, 2), pattern="cols"),
    S(N(4, 5), I(-4, 4, 3), I(0, 5, 3), pattern="both"), S(N(6, 4), I(-4, 4, 5), pattern="strided"),
    S(N(2, 3, 5), I(-5, 5, 4), pattern="last"), S(N(7), I(0, 7, 7), pattern="rows"),
])
op("jax.numpy.choose", "indexing", lambda i, a, b, c, mode="clip": jnp.choose(i, [a, b, c], mode=mode), [
    S(I(-1, 4, 5), N(5), N(5), N(5)), S(I(0, 3, 3, 4), N(3, 4), N(4), N(3, 4), mode="wrap")])

# ---------------------------------------------------------------------------------------- gather / scatter


def _at(how):
    def fn(x, idx, v, **kw):
        return getattr(x.at[idx], how)(v, **kw)

    return fn


op("jax.numpy.ndarray.at.set", "gather_scatter", _at("set"), [
    S(N(6, 3), Uniq(6, 4, negative=True), N(4, 3)), S(N(7), Uniq(7, 3), N(3)), S(N(5, 2), Uniq(5, 2), N(2)),
    S(N(4, 3, 2), Uniq(4, 2, negative=True), N(2, 3, 2)), S(N(5), Uniq(5, 5), N()),
])
op("jax.numpy.ndarray.at.add", "gather_scatter", _at("add"), [
    S(N(6, 3), I(0, 6, 5), N(5, 3)), S(N(7), I(-7, 7, 9), N(9)), S(N(5, 2), I(-5, 9, 4), N(4, 2)),  # out of range: dropped
    S(N(4, 3, 2), I(0, 4, 3), N(3, 3, 2)), S(N(5), I(0, 5, 6), N()),
])
# (Unique indices: JAX differentiates a scatter-multiply only when no index repeats.)
op("jax.numpy.ndarray.at.multiply", "gather_scatter", _at("multiply"), [
    S(N(6, 3), Uniq(6, 4), U(0.6, 1.5, 4, 3), unique_indices=True),
    S(N(7), Uniq(7, 4, negative=True), U(0.6, 1.5, 4), unique_indices=True),
])
op("jax.numpy.ndarray.at.max", "gather_scatter", _at("max"), [S(D(6, 3), I(0, 6, 5), D(5, 3)), S(D(7), I(-7, 7, 4), D(4))])
op("jax.numpy.ndarray.at.min", "gather_scatter", _at("min"), [S(D(6, 3), I(0, 6, 5), D(5, 3)), S(D(7), I(-7, 7, 4), D(4))])
op("jax.numpy.ndarray.at.get", "gather_scatter", lambda x, idx, **kw: x.at[idx].get(**kw), [
    S(N(6, 3), I(-8, 8, 4), mode="fill", fill_value=0.0), S(N(7), I(-9, 9, 5), mode="clip"), S(N(5, 2), I(0, 5, 2, 3), mode="clip"),
])
op("jax.ops.segment_sum", "gather_scatter", api("jax.ops.segment_sum"), [
    S(N(7), I(0, 3, 7), num_segments=3), S(N(6, 3), I(0, 4, 6), num_segments=4),
    S(N(5, 2), I(-1, 6, 5), num_segments=5),  # ids out of range: dropped (an empty segment sums to 0)
])
# Every segment non-empty (an empty one is ±inf for max / min); JAX differentiates a segment product only
# with unique ids, which segments rarely have: forward only.
for _name, _mk, _grad in [("segment_max", D, True), ("segment_min", D, True), ("segment_prod", lambda *s: U(0.6, 1.5, *s), False)]:
    op(f"jax.ops.{_name}", "gather_scatter", api(f"jax.ops.{_name}"), [
        S(_mk(7), Cover(7, 3), num_segments=3), S(_mk(6, 3), Cover(6, 4), num_segments=4),
        S(_mk(5, 2), Cover(5, 5), num_segments=5, indices_are_sorted=False),
    ], grad=_grad)
op("jax.numpy.bincount", "gather_scatter", lambda x, w, length: jnp.bincount(x, w, length=length), [
    S(I(0, 5, 7), N(7), length=5), S(I(0, 8, 6), N(6), length=4)])
op("jax.lax.gather", "gather_scatter", lambda x, idx, **kw: lax.gather(x, idx, **kw), [
    S(N(5, 4), I(0, 4, 3, 1),
      dimension_numbers=lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,)),
      slice_sizes=(1, 4), mode="clip"),
    S(N(6, 5), I(-2, 7, 4, 2),
      dimension_numbers=lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1)),
      slice_sizes=(2, 3), mode="clip"),
])
op("jax.lax.scatter_add", "gather_scatter", lambda x, idx, u, **kw: lax.scatter_add(x, idx, u, **kw), [
    S(N(5, 4), I(0, 5, 3, 1), N(3, 4),
      dimension_numbers=lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                                    scatter_dims_to_operand_dims=(0,)),
      mode="clip"),
])

# ---------------------------------------------------------------------------------------- shape

op("jax.numpy.reshape", "shape", api("jax.numpy.reshape"), [
    S(N(3, 4), shape=(4, 3)), S(N(2, 3, 5), shape=(6, -1)), S(N(6), shape=(2, 1, 3)), S(N(4, 6), shape=(-1,)),
    S(N(), shape=(1, 1)), S(N(5, 2), shape=(2, 5), order="F"),
])
op("jax.numpy.transpose", "shape", api("jax.numpy.transpose"), [S(N(3, 4)), S(N(2, 3, 5), axes=(1, 0, 2)), S(N(2, 3, 4), axes=(2, 0, 1)), S(N(5))])
op("jax.numpy.moveaxis", "shape", api("jax.numpy.moveaxis"), [S(N(2, 3, 4), source=0, destination=-1), S(N(3, 5), source=1, destination=0),
                                                 S(N(2, 3, 4), source=(0, 1), destination=(2, 0))])
op("jax.numpy.swapaxes", "shape", api("jax.numpy.swapaxes"), [S(N(2, 3, 4), axis1=0, axis2=2), S(N(5, 3), axis1=-1, axis2=0)])
op("jax.numpy.squeeze", "shape", api("jax.numpy.squeeze"), [S(N(1, 5)), S(N(4, 1, 3), axis=1), S(N(1, 3, 1), axis=(0, 2)), S(N(1))])
op("jax.numpy.expand_dims", "shape", api("jax.numpy.expand_dims"), [S(N(5), axis=0), S(N(3, 4), axis=-1), S(N(2, 3), axis=(0, 2)), S(N(), axis=0)])
op("jax.numpy.broadcast_to", "shape", api("jax.numpy.broadcast_to"), [S(N(5), shape=(3, 5)), S(N(3, 1), shape=(2, 3, 4)), S(N(), shape=(2, 3)),
                                                         S(N(1, 7), shape=(5, 7)), S(N(4, 1), shape=(4, 3))])
op("jax.numpy.flip", "shape", api("jax.numpy.flip"), [S(N(5)), S(N(3, 4), axis=0), S(N(2, 3, 4), axis=(0, 2)), S(N(6, 2), axis=-1)])
op("jax.numpy.fliplr", "shape", api("jax.numpy.fliplr"), [S(N(3, 5)), S(N(2, 3, 4))])
op("jax.numpy.flipud", "shape", api("jax.numpy.flipud"), [S(N(5)), S(N(3, 4))])
op("jax.numpy.ravel", "shape", api("jax.numpy.ravel"), [S(N(3, 4)), S(N(2, 3, 2)), S(N(4, 3), order="F")])
op("jax.numpy.tile", "shape", api("jax.numpy.tile"), [S(N(3), reps=2), S(N(2, 3), reps=(2, 1)), S(N(3, 2), reps=(1, 2, 2)), S(N(), reps=3)])
op("jax.numpy.repeat", "shape", api("jax.numpy.repeat"), [
    S(N(3), repeats=2), S(N(2, 3), repeats=3, axis=1), S(N(3, 2), repeats=3, axis=0, total_repeat_length=9),
    S(N(2, 2), repeats=2),
])
op("jax.numpy.atleast_3d", "shape", api("jax.numpy.atleast_3d"), [S(N()), S(N(5)), S(N(3, 4))])
op("jax.numpy.diagonal", "shape", api("jax.numpy.diagonal"), [S(N(4, 4)), S(N(3, 5), offset=1), S(N(2, 3, 4), axis1=1, axis2=2), S(N(5, 3), offset=-2)])
op("jax.numpy.permute_dims", "shape", api("jax.numpy.permute_dims"), [S(N(2, 3, 4), axes=(2, 1, 0)), S(N(3, 5), axes=(1, 0))])
op("jax.numpy.matrix_transpose", "shape", api("jax.numpy.matrix_transpose"), [S(N(3, 5)), S(N(2, 3, 4))])
op("jax.numpy.unstack", "shape", api("jax.numpy.unstack"), [S(N(3, 4)), S(N(2, 3, 2), axis=1), S(N(4, 2), axis=-1)])
op("jax.lax.rev", "shape", api("jax.lax.rev"), [S(N(5), dimensions=(0,)), S(N(3, 4), dimensions=(1,)), S(N(2, 3, 4), dimensions=(0, 2))])
op("jax.lax.broadcast_in_dim", "shape", api("jax.lax.broadcast_in_dim"), [
    S(N(3), shape=(2, 3), broadcast_dimensions=(1,)), S(N(3, 1), shape=(3, 4, 2), broadcast_dimensions=(0, 2)),
    S(N(), shape=(4,), broadcast_dimensions=()), S(N(4), shape=(4, 3), broadcast_dimensions=(0,))])
op("jax.lax.reshape", "shape", api("jax.lax.reshape"), [S(N(3, 4), new_sizes=(2, 6)), S(N(2, 3, 4), new_sizes=(4, 6), dimensions=(2, 0, 1))])
op("jax.lax.transpose", "shape", api("jax.lax.transpose"), [S(N(3, 4), permutation=(1, 0)), S(N(2, 3, 4), permutation=(1, 2, 0))])
op("jax.lax.squeeze", "shape", api("jax.lax.squeeze"), [S(N(1, 5), dimensions=(0,)), S(N(3, 1, 1), dimensions=(1, 2)), S(N(4, 1), dimensions=(1,))])
op("jax.lax.expand_dims", "shape", api("jax.lax.expand_dims"), [S(N(5), dimensions=(1,)), S(N(3, 4), dimensions=(0, 3))])
op("jax.lax.collapse", "shape", api("jax.lax.collapse"), [S(N(2, 3, 4), start_dimension=0, stop_dimension=2), S(N(3, 4, 2), start_dimension=1)])

# ---------------------------------------------------------------------------------------- pad / concat / split

op("jax.numpy.concatenate", "pad_concat", lambda *xs, axis=0: jnp.concatenate(xs, axis=axis), [
    S(N(3), N(4)), S(N(2, 3), N(5, 3)), S(N(3, 2), N(3, 4), N(3, 1), axis=1), S(N(2, 3, 2), N(2, 1, 2), axis=-2),
    S(N(2, 2), N(2, 2), axis=None),
])
op("jax.lax.concatenate", "pad_concat", lambda *xs, dimension: lax.concatenate(xs, dimension), [
    S(N(3), N(4), dimension=0), S(N(3, 2), N(3, 5), dimension=1)])
op("jax.numpy.stack", "pad_concat", lambda *xs, axis=0: jnp.stack(xs, axis=axis), [
    S(N(3), N(3)), S(N(2, 3), N(2, 3), N(2, 3), axis=1), S(N(4, 2), N(4, 2), axis=-1), S(N(), N())])
for _name in ("hstack", "vstack", "dstack", "column_stack"):
    _fn = api(f"jax.numpy.{_name}")
    op(f"jax.numpy.{_name}", "pad_concat", _fn and (lambda f: lambda *xs: f(xs))(_fn), [
        S(N(3), N(3)), S(N(2, 3), N(2, 3)), S(N(3, 2), N(3, 2), N(3, 2))])
op("jax.numpy.append", "pad_concat", api("jax.numpy.append"), [S(N(3), N(2)), S(N(2, 3), N(2, 2), axis=1), S(N(2, 3), N(4, 3), axis=0)])
op("jax.numpy.split", "pad_concat", api("jax.numpy.split"), [
    S(N(6), indices_or_sections=3), S(N(4, 6), indices_or_sections=2, axis=1), S(N(7, 2), indices_or_sections=(2, 5)),
    S(N(2, 5, 3), indices_or_sections=(1, 3), axis=1),
])
op("jax.numpy.array_split", "pad_concat", api("jax.numpy.array_split"), [S(N(7), indices_or_sections=3), S(N(3, 5), indices_or_sections=2, axis=1),
                                                               S(N(6, 5), indices_or_sections=4, axis=1)])
op("jax.lax.split", "pad_concat", api("jax.lax.split"), [S(N(7), sizes=(2, 5)), S(N(3, 6), sizes=(1, 2, 3), axis=1)])
op("jax.numpy.pad", "pad_concat", api("jax.numpy.pad"), [
    S(N(5), pad_width=2), S(N(3, 4), pad_width=((1, 0), (2, 1)), mode="constant", constant_values=0.5),
    S(N(3, 4), pad_width=((1, 2), (0, 1)), mode="edge"), S(N(4, 5), pad_width=((2, 1), (3, 2)), mode="reflect"),
    S(N(2, 3, 4), pad_width=((0, 0), (1, 1), (2, 0)), mode="symmetric"), S(N(5), pad_width=(3, 4), mode="wrap"),
    S(N(3, 3), pad_width=1, mode="linear_ramp"), S(N(4, 3), pad_width=((1, 1), (0, 2)), mode="mean"),
])
op("jax.lax.pad", "pad_concat", lambda x, v, padding_config: lax.pad(x, v, padding_config), [
    S(N(5), N(), padding_config=((1, 2, 0),)), S(N(3, 4), N(), padding_config=((0, 1, 1), (2, -1, 0))),
    S(N(4, 3), N(), padding_config=((-1, -1, 0), (1, 1, 2))), S(N(2, 3, 2), N(), padding_config=((0, 0, 0), (1, 0, 1), (-1, 2, 0))),
])

# ---------------------------------------------------------------------------------------- sort / search

op("jax.numpy.sort", "sort", api("jax.numpy.sort"), [S(D(7)), S(D(3, 5), axis=0), S(D(2, 3, 4), axis=-1), S(D(4, 3), axis=None),
                                        S(D(5, 2), descending=True, axis=0)])
op("jax.numpy.argsort", "sort", api("jax.numpy.argsort"), [S(D(7)), S(D(3, 5), axis=0), S(D(2, 3, 4), axis=-1), S(D(6), descending=True)])
op("jax.lax.top_k", "sort", api("jax.lax.top_k"), [S(D(7), k=3), S(D(3, 5), k=2), S(D(2, 3, 4), k=4), S(D(6), k=1)])
op("jax.lax.sort", "sort", lambda *xs, **kw: lax.sort(xs, **kw), [
    S(D(7), N(7), dimension=0, num_keys=1), S(D(3, 5), dimension=1), S(D(4, 3), N(4, 3), N(4, 3), dimension=0, num_keys=1)])
op("jax.lax.sort_key_val", "sort", api("jax.lax.sort_key_val"), [S(D(7), N(7)), S(D(3, 5), N(3, 5), dimension=0), S(D(4, 3), N(4, 3), dimension=1)])
op("jax.numpy.lexsort", "sort", lambda *keys, axis=-1: jnp.lexsort(keys, axis=axis), [S(I(0, 3, 7), D(7)), S(D(3, 4), I(0, 2, 3, 4), axis=0)])
op("jax.numpy.searchsorted", "search", api("jax.numpy.searchsorted"), [
    S(Sorted(7), N(5)), S(Sorted(5), N(3, 4), side="right"), S(Sorted(4), N(6)), S(Sorted(6), N())])
op("jax.numpy.digitize", "search", lambda x, bins, right=False: jnp.digitize(x, bins, right), [
    S(N(5), Sorted(6)), S(N(3, 4), Sorted(4), right=True)])
op("jax.numpy.interp", "search", api("jax.numpy.interp"), [S(U(-4, 4, 6), Sorted(5), N(5)), S(U(-2, 3, 3, 4), Sorted(7), N(7))])

# ---------------------------------------------------------------------------------------- softmax / losses

op("jax.nn.softmax", "softmax_loss", api("jax.nn.softmax"), [S(N(5)), S(N(3, 5), axis=0), S(N(2, 3, 4), axis=-1), S(N(4, 6), axis=(0, 1)),
                                                     S(N(7, 1))])
op("jax.nn.log_softmax", "softmax_loss", api("jax.nn.log_softmax"), [S(N(5)), S(N(3, 5), axis=0), S(N(2, 3, 4), axis=1), S(N(6, 2))])
op("jax.nn.standardize", "softmax_loss", api("jax.nn.standardize"), [S(N(5)), S(N(3, 5), axis=0), S(N(2, 3, 4), axis=-1)])
op("jax.nn.glu", "softmax_loss", api("jax.nn.glu"), [S(N(6)), S(N(3, 4)), S(N(4, 3), axis=0)])
op("jax.nn.one_hot", "softmax_loss", api("jax.nn.one_hot"), [S(I(0, 5, 4), num_classes=5), S(I(-1, 6, 3, 2), num_classes=4)])


def _xent(logits, labels):
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - picked)


op("shardfuzz.loss.mse", "softmax_loss", lambda a, b: jnp.mean(jnp.square(a - b)), [S(N(5), N(5)), S(N(3, 4), N(3, 4)), S(N(2, 3, 2), N(3, 2))])
op("shardfuzz.loss.cross_entropy", "softmax_loss", _xent, [S(N(4, 5), I(0, 5, 4)), S(N(3, 7), I(0, 7, 3)), S(N(2, 3, 6), I(0, 6, 2, 3))])
op("shardfuzz.loss.nll_per_example", "softmax_loss", lambda lg, y: -jnp.take_along_axis(jax.nn.log_softmax(lg), y[:, None], axis=1)[:, 0],
   [S(N(5, 4), I(0, 4, 5)), S(N(3, 6), I(0, 6, 3))])
op("shardfuzz.loss.bce_with_logits", "softmax_loss",
   lambda x, t: jnp.mean(jnp.maximum(x, 0) - x * t + jnp.log1p(jnp.exp(-jnp.abs(x)))), [S(N(5), Prob(5)), S(N(3, 4), Prob(3, 4))])
op("shardfuzz.loss.huber", "softmax_loss",
   lambda a, b, delta=1.0: jnp.mean(jnp.where(jnp.abs(a - b) < delta, 0.5 * (a - b) ** 2, delta * (jnp.abs(a - b) - 0.5 * delta))),
   [S(N(6), N(6)), S(N(3, 4), N(3, 4), delta=0.5)])
op("shardfuzz.loss.kl_div", "softmax_loss",
   lambda lp, lq: jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1), [S(N(4, 5), N(4, 5)), S(N(6), N(6))])


def _layer_norm(x, w, b, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * w + b


op("shardfuzz.layer_norm", "softmax_loss", _layer_norm, [S(N(4, 6), N(6), N(6)), S(N(2, 3, 5), N(5), N()), S(N(3, 7), N(7), N(7))])

# ---------------------------------------------------------------------------------------- shift / rotate

op("jax.numpy.roll", "shift_rotate", api("jax.numpy.roll"), [
    S(N(7), shift=2), S(N(3, 5), shift=-1, axis=1), S(N(4, 3), shift=(1, 2), axis=(0, 1)), S(N(2, 3, 4), shift=9, axis=2),
    S(N(3, 4), shift=5), S(N(6, 2), shift=-7, axis=0),
])
op("jax.numpy.rot90", "shift_rotate", api("jax.numpy.rot90"), [S(N(3, 5)), S(N(4, 3), k=2), S(N(2, 3, 4), k=-1, axes=(1, 2)), S(N(3, 2), k=3)])
op("jax.numpy.left_shift", "shift_rotate", api("jax.numpy.left_shift"), [S(I(0, 100, 5), I(0, 4, 5)), S(I(-50, 50, 3, 4), I(0, 3, 4))])
op("jax.numpy.right_shift", "shift_rotate", api("jax.numpy.right_shift"), [S(I(0, 100, 5), I(0, 4, 5)), S(I(-50, 50, 3, 4), I(0, 3, 4))])

# ---------------------------------------------------------------------------------------- linear algebra

op("jax.numpy.triu", "linalg", api("jax.numpy.triu"), [S(N(4, 4)), S(N(3, 5), k=1), S(N(5, 3), k=-1), S(N(2, 3, 3))])
op("jax.numpy.tril", "linalg", api("jax.numpy.tril"), [S(N(4, 4)), S(N(3, 5), k=-1), S(N(5, 3), k=2), S(N(2, 3, 3))])
op("jax.numpy.diag", "linalg", api("jax.numpy.diag"), [S(N(4)), S(N(3), k=1), S(N(4, 4)), S(N(3, 5), k=-1)])
op("jax.numpy.diagflat", "linalg", api("jax.numpy.diagflat"), [S(N(3)), S(N(2, 2), k=-1)])
op("jax.numpy.trace", "linalg", api("jax.numpy.trace"), [S(N(4, 4)), S(N(3, 5), offset=1), S(N(2, 3, 3), axis1=1, axis2=2), S(N(3, 4, 2))])
op("jax.numpy.vander", "linalg", api("jax.numpy.vander"), [S(N(4)), S(N(5), N=3, increasing=True)])
op("jax.numpy.polyval", "linalg", api("jax.numpy.polyval"), [S(N(4), N(5)), S(N(3), N(3, 4))])
op("jax.numpy.linalg.det", "linalg", api("jax.numpy.linalg.det"), [S(Well(3, 3)), S(Well(2, 4, 4)), S(Well(1, 1))])
op("jax.numpy.linalg.slogdet", "linalg", api("jax.numpy.linalg.slogdet"), [S(Well(3, 3)), S(Well(2, 2, 2))])
op("jax.numpy.linalg.inv", "linalg", api("jax.numpy.linalg.inv"), [S(Well(3, 3)), S(Well(2, 4, 4))])
op("jax.numpy.linalg.solve", "linalg", api("jax.numpy.linalg.solve"), [S(Well(3, 3), N(3)), S(Well(4, 4), N(4, 2)), S(Well(2, 3, 3), N(2, 3, 1))])
op("jax.numpy.linalg.cholesky", "linalg", api("jax.numpy.linalg.cholesky"), [S(Spd(3, 3)), S(Spd(2, 4, 4))])
op("jax.numpy.linalg.matrix_power", "linalg", api("jax.numpy.linalg.matrix_power"), [S(N(3, 3), n=2), S(N(2, 4, 4), n=3), S(Well(3, 3), n=-1)])
op("jax.lax.linalg.triangular_solve", "linalg", api("jax.lax.linalg.triangular_solve"), [
    S(Tri(3, 3), N(2, 3), left_side=False, lower=True), S(Tri(4, 4), N(4, 2), left_side=True, lower=True),
    S(Tri(2, 3, 3), N(2, 3, 3), left_side=True, lower=True, transpose_a=True)])


class NotInRelease(KeyError):
    """The op is in the table but not in the installed JAX release."""


def vocabulary():
    return [{"name": o.name, "variant": "", "family": o.family} for o in sorted(TABLE.values(), key=lambda o: o.name)]


def find(name, variant=""):
    if name in MISSING and not variant:
        raise NotInRelease(MISSING[name])
    o = TABLE.get(name)
    if o is None or variant:
        raise KeyError(f"{name!r} (variant {variant!r}) is not in the JAX library-op vocabulary")
    return o
