#!/usr/bin/env python3
"""Differential test cases for ferroflow-numpy, computed by real NumPy.

Usage: numpy_cases.py OUT_DIR

Writes OUT_DIR/cases.json and the .npy files it names. Each case is one call of a NumPy
function with random inputs (random shapes, broadcasting, dtypes, strided views, values)
and NumPy's outputs, or the exception NumPy raised. The Rust test
(tests/numpy_differential.rs) makes the same call through ferroflow-numpy and compares.

Arguments are listed in the order of the Rust function's parameters. Encodings:
  {"a": file}            an array (".npy"); with "view": "T" the file holds the transpose
                         and the Rust side transposes it back (a strided, non-dense view)
  {"f": x} {"i": n} {"b": v} {"s": text} {"none": true}
  {"ints": [...]}        shapes, axes, reps, ...
  {"floats": [...]}      quantile lists, ...
  {"arrays": [...]}      lists of arrays
  {"pairs": [[b, a]..]}  pad widths
  {"index": [...]}       an index expression: {"int": i}, {"slice": [start, stop, step]},
                         {"ellipsis": true}, {"newaxis": true}, {"a": file}
"""

import json
import math
import os
import sys

import warnings

import numpy as np

warnings.filterwarnings("ignore")

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(20241130)
cases = []
counter = [0]


def fname():
    counter[0] += 1
    return "v%05d.npy" % counter[0]


class View:
    """An argument the Rust side receives as a transposed (non-dense) view."""

    def __init__(self, x):
        self.x = x


class Index:
    def __init__(self, *items):
        self.items = items


class Ints:
    def __init__(self, *v):
        self.v = list(v)


class Floats:
    def __init__(self, *v):
        self.v = list(v)


class Shapes:
    def __init__(self, *v):
        self.v = [list(x) for x in v]


class Pairs:
    def __init__(self, v):
        self.v = [list(p) for p in v]


def enc(x):
    if isinstance(x, View):
        f = fname()
        np.save(os.path.join(OUT, f), np.ascontiguousarray(x.x.T))
        return {"a": f, "view": "T"}
    if isinstance(x, np.ndarray):
        f = fname()
        np.save(os.path.join(OUT, f), x)
        return {"a": f}
    if isinstance(x, (bool, np.bool_)):
        return {"b": bool(x)}
    if isinstance(x, int):
        return {"i": x}
    if isinstance(x, float):
        return {"f": x} if math.isfinite(x) else {"f": str(x)}  # "inf", "-inf", "nan"
    if isinstance(x, str):
        return {"s": x}
    if x is None:
        return {"none": True}
    if isinstance(x, Ints):
        return {"ints": x.v}
    if isinstance(x, Floats):
        return {"floats": x.v}
    if isinstance(x, Pairs):
        return {"pairs": x.v}
    if isinstance(x, Shapes):
        return {"shapes": x.v}
    if isinstance(x, list):
        return {"arrays": [enc(a)["a"] for a in x]}
    if isinstance(x, Index):
        items = []
        for it in x.items:
            if it is Ellipsis:
                items.append({"ellipsis": True})
            elif it is None:
                items.append({"newaxis": True})
            elif isinstance(it, slice):
                items.append({"slice": [it.start, it.stop, it.step]})
            elif isinstance(it, int):
                items.append({"int": it})
            else:
                items.append(enc(np.asarray(it)))
        return {"index": items}
    raise TypeError(type(x))


def unwrap(x):
    if isinstance(x, View):
        return x.x
    if isinstance(x, (Ints, Floats)):
        return tuple(x.v)
    if isinstance(x, (Pairs, Shapes)):
        return [tuple(v) for v in x.v] if isinstance(x, Shapes) else x.v
    return x


def case(fn, args, compute, cmp="close", tol=None):
    """Records `fn(*args)` with NumPy's result of `compute(*unwrapped args)`."""
    entry = {"fn": fn, "args": [enc(a) for a in args], "cmp": cmp}
    if tol is not None:
        entry["tol"] = tol
    try:
        with np.errstate(all="ignore"):
            out = compute(*[unwrap(a) for a in args])
    except Exception as e:  # NumPy's error: Rust must return an Err too
        entry["error"] = type(e).__name__
        cases.append(entry)
        return
    if isinstance(out, (tuple, list)):
        outs = list(out)
    else:
        outs = [out]
    enc_outs = []
    for o in outs:
        if isinstance(o, bool):
            enc_outs.append({"bool": bool(o)})
        elif isinstance(o, int) and not isinstance(o, np.integer):
            enc_outs.append({"int": o})
        else:
            o = np.asarray(o)
            f = fname()
            np.save(os.path.join(OUT, f), o)
            enc_outs.append({"a": f})
    entry["out"] = enc_outs
    cases.append(entry)


def shape(lo=1, hi=4, rank=None):
    r = int(rng.integers(1, 4)) if rank is None else rank
    return tuple(int(d) for d in rng.integers(lo, hi + 1, size=r))


def rnd(shp, dtype=np.float64, lo=-3.0, hi=3.0):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(lo), int(hi) + 1, size=shp).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shp) < 0.5
    return rng.uniform(lo, hi, size=shp).astype(dtype)


# ---------------------------------------------------------------- unary ufuncs
DOMAIN = {
    "log": (0.1, 5), "log2": (0.1, 5), "log10": (0.1, 5), "log1p": (-0.5, 5), "sqrt": (0, 5),
    "arcsin": (-0.95, 0.95), "arccos": (-0.95, 0.95), "arctanh": (-0.9, 0.9),
    "arccosh": (1.1, 5), "reciprocal": (0.5, 3),
}
UNARY = ["exp", "expm1", "log", "log1p", "sqrt", "sin", "cos", "tan", "arcsin", "arccos",
         "arctan", "sinh", "cosh", "tanh", "floor", "ceil", "rint", "exp2", "log2", "log10",
         "cbrt", "arcsinh", "arccosh", "arctanh", "deg2rad", "radians", "rad2deg", "degrees",
         "sinc", "trunc", "fix", "fabs", "square", "reciprocal", "absolute", "abs", "sign",
         "negative", "positive", "signbit"]
for name in UNARY:
    lo, hi = DOMAIN.get(name, (-3, 3))
    f = getattr(np, name)
    case(name, [rnd(shape(), np.float64, lo, hi)], f)
    case(name, [rnd(shape(), np.float32, lo, hi)], f)
    case(name, [View(rnd(shape(2, 4, 2), np.float64, lo, hi))], f)
    if name not in ("reciprocal", "fix", "trunc", "floor", "ceil", "rint"):
        # integers: float ufuncs compute in float64 (int32) or float16 (int8)
        case(name, [rnd(shape(), np.int32, max(lo, 1) if lo > 0 else -3, 3 if hi > 1 else 0)], f)
case("exp", [rnd((5,), np.int8, -3, 3)], np.exp, tol=[1e-3, 1e-3])
case("sqrt", [rnd((5,), np.uint8, 0, 9)], np.sqrt, tol=[1e-3, 1e-3])
case("around", [rnd(shape(), np.float64) * 100, 2], lambda x, d: np.around(x, d))
case("around", [rnd(shape(), np.float64), 0], lambda x, d: np.around(x, d))
case("round_", [rnd(shape(), np.float64) * 10, -1], lambda x, d: np.round(x, d))
case("around", [rnd((4,), np.int64, -500, 500), 1], lambda x, d: np.around(x, d))
case("log", [np.array([-1.0, 0.0, np.inf, np.nan])], np.log)
case("sign", [np.array([-2.0, -0.0, 0.0, 3.0, np.nan])], np.sign)
case("sign", [rnd((6,), np.int64, -3, 3)], np.sign)
case("absolute", [rnd((6,), np.int32, -5, 5)], np.absolute)
case("negative", [rnd((6,), np.bool_)], np.negative)
case("square", [rnd((6,), np.int64, -5, 5)], np.square)

# ---------------------------------------------------------------- binary ufuncs
PAIRS = [((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((5,), (5,)), ((1,), (2, 3)), ((2, 3), ())]
BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "true_divide": np.true_divide, "divide": np.divide, "floor_divide": np.floor_divide,
    "remainder": np.remainder, "mod": np.mod, "fmod": np.fmod, "power": np.power,
    "float_power": np.float_power, "maximum": np.maximum, "minimum": np.minimum,
    "fmax": np.fmax, "fmin": np.fmin, "arctan2": np.arctan2, "hypot": np.hypot,
    "logaddexp": np.logaddexp, "logaddexp2": np.logaddexp2, "heaviside": np.heaviside,
    "copysign": np.copysign, "divmod": np.divmod,
}
POSITIVE_B = {"true_divide", "divide", "floor_divide", "remainder", "mod", "fmod", "divmod"}
for name, f in BINARY.items():
    for sa, sb in PAIRS:
        a = rnd(sa, np.float64)
        b = rnd(sb, np.float64, 0.5, 3) if name in POSITIVE_B else rnd(sb, np.float64)
        if name in ("power", "float_power"):
            a = np.abs(a) + 0.1
        case(name, [a, b], f)
    # mixed dtypes: promotion as NumPy does it
    a = rnd((3, 4), np.float32)
    b = rnd((4,), np.float64, 0.5, 3)
    if name in ("power", "float_power"):
        a = np.abs(a) + 0.1
    case(name, [a, b], f)
    ai = rnd((3, 4), np.int32, 1, 9)
    bi = rnd((4,), np.int32, 1, 4)
    if name not in ("heaviside", "copysign"):
        case(name, [ai, bi], f)
        case(name, [ai, rnd((4,), np.float32, 0.5, 3)], f)
        case(name, [View(rnd((4, 3), np.int64, 1, 9)), 3], f)
    case(name, [rnd((2, 3), np.float32, 0.5, 3), 2.0], f)
case("add", [rnd((3,), np.int8), rnd((3,), np.uint8, 0, 9)], np.add)
case("add", [rnd((3,), np.int8), 3], np.add)
case("add", [rnd((3,), np.int32), 1.5], np.add)
case("add", [rnd((3,), np.bool_), rnd((3,), np.bool_)], np.add)
case("multiply", [rnd((3,), np.bool_), rnd((3,), np.bool_)], np.multiply)
case("subtract", [rnd((3,), np.bool_), rnd((3,), np.bool_)], np.subtract)
case("add", [rnd((3, 4)), rnd((3,))], np.add)
case("add", [rnd((2, 3), np.float16), rnd((3,), np.float16)], np.add, tol=[1e-3, 1e-3])
case("maximum", [np.array([1.0, np.nan, 3.0]), np.array([np.nan, 2.0, 1.0])], np.maximum)
case("fmax", [np.array([1.0, np.nan, np.nan]), np.array([np.nan, 2.0, np.nan])], np.fmax)
case("fmin", [np.array([1.0, np.nan, np.nan]), np.array([np.nan, 2.0, np.nan])], np.fmin)
case("power", [rnd((4,), np.int64, 1, 5), rnd((4,), np.int64, 0, 3)], np.power)
case("heaviside", [np.array([-1.0, 0.0, 2.0]), 0.5], np.heaviside)
case("copysign", [np.array([1.0, 2.0, 3.0]), np.array([-0.0, 0.0, -1.0])], np.copysign)
for sa, sb, sc in [((3, 4), (4,), ()), ((5,), (), (5,))]:
    case("clip", [rnd(sa), rnd(sb, lo=-3, hi=-1), rnd(sc, lo=1, hi=3)], np.clip)
case("clip", [rnd((2, 5), np.int32, -9, 9), -2, 4], np.clip)
case("clip", [rnd((2, 5), np.float32), -0.5, 0.5], np.clip)

# ---------------------------------------------------------------- comparisons and logic
for name in ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]:
    f = getattr(np, name)
    a = np.round(rnd((3, 4)))
    case(name, [a, np.round(rnd((4,)))], f)
    case(name, [rnd((3,), np.int32), 1], f)
    case(name, [np.array([1.0, np.nan]), np.array([1.0, np.nan])], f)
    case(name, [rnd((2, 3)), rnd((4,))], f)  # cannot broadcast
for name in ["logical_and", "logical_or", "logical_xor"]:
    f = getattr(np, name)
    case(name, [rnd((3, 4), np.bool_), rnd((4,), np.bool_)], f)
    case(name, [rnd((3,), np.int32, -1, 1), rnd((3,), np.float64)], f)
case("logical_not", [rnd((3, 4), np.bool_)], np.logical_not)
case("logical_not", [rnd((5,), np.int32, -1, 1)], np.logical_not)
special = np.array([1.0, -np.inf, np.inf, np.nan, 0.0, -2.5])
for name in ["isfinite", "isinf", "isnan", "isposinf", "isneginf"]:
    case(name, [special], getattr(np, name))
    case(name, [rnd((3,), np.int32)], getattr(np, name))
x = rnd((3, 4))
y = x + rng.normal(0, 1e-6, size=x.shape)
y[0, 0] = x[0, 0] + 1.0
case("isclose_with", [x, y, 1e-5, 1e-8, False], np.isclose)
case("isclose_with", [special, special, 1e-5, 1e-8, True], np.isclose)
case("isclose_with", [special, special, 1e-5, 1e-8, False], np.isclose)
case("allclose_with", [x, y, 1e-5, 1e-8, False], np.allclose)
case("allclose_with", [x, x + 1e-9, 1e-5, 1e-8, False], np.allclose)
case("array_equal", [x, x.copy()], np.array_equal)
case("array_equal", [x, y], np.array_equal)
case("array_equal", [x, x[:2]], np.array_equal)

# ---------------------------------------------------------------- reductions
for name in ["sum", "prod", "mean", "amax", "amin", "max", "min", "ptp", "any", "all",
             "count_nonzero", "nansum", "nanprod", "nanmean", "nanmax", "nanmin"]:
    f = getattr(np, name)
    kw = (lambda a, ax, k: f(a, axis=ax, keepdims=k))
    if name == "count_nonzero":
        kw = (lambda a, ax, k: np.count_nonzero(a, axis=ax, keepdims=k))
    a = rnd((3, 4, 2), lo=-2, hi=2)
    if name in ("any", "all", "count_nonzero"):
        a = np.round(a / 2)
    if name.startswith("nan"):
        a = a.copy()
        a[0, 1, 0] = np.nan
        a[2, :, 1] = np.nan
    case(name, [a, None, False], kw)
    case(name, [a, 1, False], kw)
    case(name, [a, -1, True], kw)
    case(name, [a, Ints(0, 2), False], kw)
    case(name, [View(rnd((4, 3), lo=-2, hi=2)), 0, False], kw)
    case(name, [rnd((3, 4), np.int32, -3, 3), 0, False], kw)
    case(name, [a, 3, False], kw)  # axis out of range
case("sum", [rnd((5,), np.bool_), None, False], lambda a, ax, k: np.sum(a, axis=ax, keepdims=k))
case("sum", [rnd((5,), np.uint8, 0, 200), None, False], lambda a, ax, k: np.sum(a, axis=ax, keepdims=k))
case("amax", [np.zeros((0,)), None, False], lambda a, ax, k: np.amax(a, axis=ax, keepdims=k))
case("amax", [np.array([1.0, np.nan, 3.0]), None, False], lambda a, ax, k: np.amax(a, axis=ax, keepdims=k))
for name in ["std", "var", "nanstd", "nanvar"]:
    f = getattr(np, name)
    a = rnd((4, 5))
    if name.startswith("nan"):
        a[1, 2] = np.nan
    for ax, ddof, k in [(None, 0, False), (0, 1, False), (Ints(0, 1), 0, True), (-1, 0, False)]:
        case(name, [a, ax, ddof, k], lambda a, ax, d, k, f=f: f(a, axis=ax, ddof=d, keepdims=k))
    case(name, [rnd((4,), np.int32), None, 0, False], lambda a, ax, d, k, f=f: f(a, axis=ax, ddof=d, keepdims=k))
for name in ["argmax", "argmin", "nanargmax", "nanargmin"]:
    f = getattr(np, name)
    a = rnd((3, 5))
    if name.startswith("nan"):
        a[0, 2] = np.nan
    case(name, [a, None], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [a, 0], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [a, -1], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [View(rnd((5, 3))), 1], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [rnd((4, 3), np.int32, -9, 9), 1], lambda a, ax, f=f: f(a, axis=ax))
case("argmax", [np.array([1.0, np.nan, 3.0, np.nan]), None], lambda a, ax: np.argmax(a, axis=ax))
case("nanargmax", [np.array([np.nan, np.nan]), None], lambda a, ax: np.nanargmax(a, axis=ax))
for name in ["median", "nanmedian"]:
    f = getattr(np, name)
    a = rnd((4, 5))
    if name == "nanmedian":
        a[0, 1] = np.nan
        a[2, :] = np.nan
    case(name, [a, None, False], lambda a, ax, k, f=f: f(a, axis=ax, keepdims=k))
    case(name, [a, 0, False], lambda a, ax, k, f=f: f(a, axis=ax, keepdims=k))
    case(name, [a, 1, True], lambda a, ax, k, f=f: f(a, axis=ax, keepdims=k))
    case(name, [rnd((6,), np.int32), None, False], lambda a, ax, k, f=f: f(a, axis=ax, keepdims=k))
case("median", [np.array([1.0, np.nan, 2.0]), None, False], lambda a, ax, k: np.median(a, axis=ax, keepdims=k))
for name, qs in [("quantile", [0.0, 0.3, 1.0]), ("percentile", [10.0, 50.0, 95.0]),
                 ("nanquantile", [0.25, 0.75]), ("nanpercentile", [5.0, 60.0])]:
    f = getattr(np, name)
    a = rnd((5, 6))
    if name.startswith("nan"):
        a[1, 3] = np.nan
    case(name, [a, Floats(*qs), None, False], lambda a, q, ax, k, f=f: f(a, np.array(q), axis=ax, keepdims=k))
    case(name, [a, qs[1], 1, False], lambda a, q, ax, k, f=f: f(a, q, axis=ax, keepdims=k))
    case(name, [a, Floats(*qs), 0, True], lambda a, q, ax, k, f=f: f(a, np.array(q), axis=ax, keepdims=k))
case("quantile", [rnd((5,)), 1.5, None, False], lambda a, q, ax, k: np.quantile(a, q, axis=ax, keepdims=k))
a = rnd((3, 4))
w = rng.uniform(0.1, 2, size=(4,))
case("average", [a, None, None], lambda a, ax, w: np.average(a, axis=ax, weights=w))
case("average", [a, 1, w], lambda a, ax, w: np.average(a, axis=ax, weights=w))
case("average", [a, None, rng.uniform(0.1, 2, size=(3, 4))], lambda a, ax, w: np.average(a, axis=ax, weights=w))
for name in ["cumsum", "cumprod", "nancumsum", "nancumprod"]:
    f = getattr(np, name)
    a = rnd((3, 4), lo=-1.5, hi=1.5)
    if name.startswith("nan"):
        a[1, 1] = np.nan
    case(name, [a, None], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [a, 1], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [View(rnd((4, 3), lo=-1.5, hi=1.5)), 0], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [rnd((5,), np.int32, -3, 3), 0], lambda a, ax, f=f: f(a, axis=ax))
    case(name, [rnd((5,), np.bool_), 0], lambda a, ax, f=f: f(a, axis=ax))
for n, ax in [(1, -1), (2, 0), (1, 1)]:
    case("diff", [rnd((4, 5)), n, ax], lambda a, n, ax: np.diff(a, n=n, axis=ax))
case("diff", [rnd((6,), np.bool_), 1, -1], lambda a, n, ax: np.diff(a, n=n, axis=ax))
case("diff", [rnd((6,), np.int32), 3, 0], lambda a, n, ax: np.diff(a, n=n, axis=ax))

# ---------------------------------------------------------------- creation
case("zeros", [Ints(2, 3), None], lambda s, d: np.zeros(s))
case("ones", [Ints(4,), "float32"], lambda s, d: np.ones(s, dtype=d))
case("empty", [Ints(2, 2), "int32"], lambda s, d: np.zeros(s, dtype=d))
case("full", [Ints(2, 3), 1.5, None], lambda s, v, d: np.full(s, v))
case("full", [Ints(2, 3), 7, None], lambda s, v, d: np.full(s, v))
case("full", [Ints(2, 3), rnd((3,)), None], lambda s, v, d: np.full(s, v))
case("full", [Ints(2, 3), 2.7, "int32"], lambda s, v, d: np.full(s, v, dtype=d))
for name in ["zeros_like", "ones_like", "empty_like"]:
    f = {"empty_like": np.zeros_like}.get(name, getattr(np, name))
    case(name, [rnd((2, 3), np.int32), None], lambda a, d, f=f: f(a))
    case(name, [rnd((2, 3)), "float32"], lambda a, d, f=f: f(a, dtype=d))
case("full_like", [rnd((2, 3), np.int32), 2.7, None], lambda a, v, d: np.full_like(a, v))
case("full_like", [rnd((2, 3)), 5, "float32"], lambda a, v, d: np.full_like(a, v, dtype=d))
for n, m, k in [(3, None, 0), (3, 5, 1), (4, 2, -1)]:
    case("eye_with", [n, m, k, None], lambda n, m, k, d: np.eye(n, m, k))
case("identity", [4, "int32"], lambda n, d: np.identity(n, dtype=d))
for args in [(0, 10, 3), (2, -5, -2), (0.5, 3.0, 0.25), (0, 1, 0.1)]:
    case("arange", list(args) + [None], lambda a, b, c, d: np.arange(a, b, c))
case("arange", [0, 5, 0, None], lambda a, b, c, d: np.arange(a, b, c))
for s, e, n, ep in [(0.0, 1.0, 5, True), (-2.0, 3.0, 7, False), (1.0, 1.0, 3, True), (0.0, 10.0, 1, True)]:
    case("linspace_with", [s, e, n, ep, None], lambda s, e, n, ep, d: np.linspace(s, e, n, endpoint=ep))
case("logspace_with", [0.0, 3.0, 4, True, 10.0, None], lambda s, e, n, ep, b, d: np.logspace(s, e, n, endpoint=ep, base=b))
case("logspace_with", [1.0, 2.0, 5, False, 2.0, None], lambda s, e, n, ep, b, d: np.logspace(s, e, n, endpoint=ep, base=b))
case("geomspace_with", [1.0, 1000.0, 4, True, None], lambda s, e, n, ep, d: np.geomspace(s, e, n, endpoint=ep))
case("geomspace_with", [-1.0, -16.0, 5, False, None], lambda s, e, n, ep, d: np.geomspace(s, e, n, endpoint=ep))
case("geomspace_with", [0.0, 16.0, 5, True, None], lambda s, e, n, ep, d: np.geomspace(s, e, n, endpoint=ep))
for k in [0, 1, -2]:
    case("diag", [rnd((4,)), k], np.diag)
    case("diag", [rnd((3, 5)), k], np.diag)
case("diag", [rnd((2, 2, 2)), 0], np.diag)
case("diagflat", [rnd((2, 2)), 1], np.diagflat)
case("tri", [3, 4, 0, None], lambda n, m, k, d: np.tri(n, m, k))
case("tri", [4, None, -1, "int32"], lambda n, m, k, d: np.tri(n, m, k, dtype=d))
for k in [0, 1, -1]:
    case("tril", [rnd((3, 4)), k], np.tril)
    case("triu", [rnd((2, 3, 4)), k], np.triu)
case("meshgrid", [[rnd((3,)), rnd((2,))], "xy"], lambda xs, ix: np.meshgrid(*xs, indexing=ix))
case("meshgrid", [[rnd((3,)), rnd((2,)), rnd((4,))], "ij"], lambda xs, ix: np.meshgrid(*xs, indexing=ix))
case("meshgrid", [[rnd((3,)), rnd((2,)), rnd((4,))], "xy"], lambda xs, ix: np.meshgrid(*xs, indexing=ix))
case("indices", [Ints(2, 3), None], lambda d, t: np.indices(d))
case("array", [rnd((2, 3))], np.array)
case("asarray", [View(rnd((2, 3)))], np.asarray)

# ---------------------------------------------------------------- shape manipulation
a = rnd((2, 3, 4))
case("reshape", [a, Ints(4, -1)], np.reshape)
case("reshape", [View(rnd((3, 4))), Ints(2, 6)], np.reshape)
case("reshape", [a, Ints(5, -1)], np.reshape)
case("ravel", [View(rnd((3, 4)))], np.ravel)
case("transpose", [a, None], np.transpose)
case("transpose", [a, Ints(1, 0, 2)], np.transpose)
case("transpose", [a, Ints(1, 0)], np.transpose)
case("swapaxes", [a, 0, -1], np.swapaxes)
case("moveaxis", [a, Ints(0), Ints(-1)], np.moveaxis)
case("moveaxis", [a, Ints(0, 1), Ints(-1, 0)], np.moveaxis)
case("expand_dims", [a, 1], np.expand_dims)
case("expand_dims", [a, -1], np.expand_dims)
case("expand_dims", [a, 5], np.expand_dims)
case("squeeze", [rnd((1, 3, 1)), None], np.squeeze)
case("squeeze", [rnd((1, 3, 1)), 2], np.squeeze)
case("squeeze", [rnd((1, 3, 1)), 1], np.squeeze)
b = rnd((2, 5, 4), np.float32)
case("concatenate", [[a, b], 1], lambda xs, ax: np.concatenate(xs, axis=ax))
case("concatenate", [[a, b], None], lambda xs, ax: np.concatenate(xs, axis=ax))
case("concatenate", [[a, b], 0], lambda xs, ax: np.concatenate(xs, axis=ax))
case("stack", [[rnd((3, 2)), rnd((3, 2), np.int32)], 1], lambda xs, ax: np.stack(xs, axis=ax))
case("stack", [[rnd((3, 2)), rnd((3, 2))], -1], lambda xs, ax: np.stack(xs, axis=ax))
case("stack", [[rnd((3, 2)), rnd((2, 2))], 0], lambda xs, ax: np.stack(xs, axis=ax))
for name in ["hstack", "vstack", "dstack"]:
    f = getattr(np, name)
    case(name, [[rnd((3,)), rnd((3,))]], lambda xs, f=f: f(xs))
    case(name, [[rnd((2, 3)), rnd((2, 3))]], lambda xs, f=f: f(xs))
case("split", [rnd((6, 4)), 3, 0], lambda a, s, ax: np.split(a, s, axis=ax))
case("split", [rnd((6, 4)), Ints(1, 3), 1], lambda a, s, ax: np.split(a, list(s), axis=ax))
case("split", [rnd((5, 4)), 2, 0], lambda a, s, ax: np.split(a, s, axis=ax))
case("array_split", [rnd((7, 2)), 3, 0], lambda a, s, ax: np.array_split(a, s, axis=ax))
case("array_split", [rnd((3, 7)), Ints(2, 5), 1], lambda a, s, ax: np.array_split(a, list(s), axis=ax))
case("tile", [rnd((2, 3)), Ints(2, 2)], np.tile)
case("tile", [rnd((3,)), Ints(2, 1, 2)], np.tile)
case("tile", [rnd((2, 3, 2)), Ints(2,)], np.tile)
case("repeat", [rnd((2, 3)), 2, None], lambda a, r, ax: np.repeat(a, r, axis=ax))
case("repeat", [rnd((2, 3)), np.array([1, 0, 2]), 1], lambda a, r, ax: np.repeat(a, r, axis=ax))
case("repeat", [rnd((2, 3)), np.array([1, 2]), 1], lambda a, r, ax: np.repeat(a, r, axis=ax))
case("broadcast_to", [rnd((3, 1)), Ints(2, 3, 4)], np.broadcast_to)
case("broadcast_to", [rnd((3, 2)), Ints(3, 3)], np.broadcast_to)
case("broadcast_arrays", [[rnd((3, 1)), rnd((4,)), rnd((2, 1, 1))]], lambda xs: np.broadcast_arrays(*xs))
case("flip", [a, None], np.flip)
case("flip", [a, 1], np.flip)
case("flip", [a, Ints(0, 2)], np.flip)
case("fliplr", [rnd((3, 4))], np.fliplr)
case("flipud", [View(rnd((3, 4)))], np.flipud)
case("roll", [rnd((3, 4)), 2, None], np.roll)
case("roll", [rnd((3, 4)), -1, 1], np.roll)
case("roll", [rnd((3, 4)), 7, 0], np.roll)
for k in [1, 2, 3, -1]:
    case("rot90", [rnd((2, 3, 4)), k, Ints(0, 1)], lambda m, k, ax: np.rot90(m, k, axes=ax))
case("rot90", [rnd((2, 3, 4)), 1, Ints(2, 0)], lambda m, k, ax: np.rot90(m, k, axes=ax))
for mode in ["constant", "edge", "reflect", "symmetric", "wrap"]:
    case("pad", [rnd((3, 4)), Pairs([(1, 2), (2, 1)]), mode],
         lambda a, w, m: np.pad(a, w, mode=m) if m != "constant" else np.pad(a, w, constant_values=1.5))
    case("pad", [rnd((3,)), Pairs([(4, 5)]), mode],
         lambda a, w, m: np.pad(a, w, mode=m) if m != "constant" else np.pad(a, w, constant_values=1.5))
case("take", [rnd((3, 4)), np.array([[0, 2], [-1, 1]]), 1], lambda a, i, ax: np.take(a, i, axis=ax))
case("take", [rnd((3, 4)), np.array([5, 0, -12]), None], lambda a, i, ax: np.take(a, i, axis=ax))
case("take", [rnd((3, 4)), np.array([3]), 0], lambda a, i, ax: np.take(a, i, axis=ax))
m = rnd((3, 5))
case("take_along_axis", [m, np.argsort(m, axis=1), 1], np.take_along_axis)
case("take_along_axis", [m, np.argsort(m, axis=0)[:2], 0], np.take_along_axis)
case("take_along_axis", [m, np.array([[0], [4], [-1]]), 1], np.take_along_axis)
case("where", [rnd((3, 4), np.bool_), rnd((3, 4)), rnd((4,), np.float32)], np.where)
case("where", [rnd((3, 1), np.int32, -1, 1), 1, rnd((4,), np.int32)], np.where)
case("select", [[rnd((4,)) > 0, rnd((4,)) > 1], [rnd((4,)), rnd((4,))], 0.5], np.select)
case("compress", [np.array([True, False, True]), rnd((3, 2)), 0], lambda c, a, ax: np.compress(c, a, axis=ax))
case("compress", [np.array([False, True]), rnd((3, 2)), 1], lambda c, a, ax: np.compress(c, a, axis=ax))
case("compress", [np.array([1, 0, 1, 1]), rnd((2, 2)), None], lambda c, a, ax: np.compress(c, a, axis=ax))
for name in ["atleast_1d", "atleast_2d", "atleast_3d"]:
    f = getattr(np, name)
    for x in [np.array(2.0), rnd((3,)), rnd((2, 3)), rnd((2, 3, 4))]:
        case(name, [x], f)

# ---------------------------------------------------------------- products
for sa, sb in [((3, 4), (4, 5)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
               ((2, 3, 4), (4, 2)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (3, 4))]:
    case("matmul", [rnd(sa), rnd(sb)], np.matmul)
    case("dot", [rnd(sa), rnd(sb)], np.dot)
case("matmul", [rnd((3, 4), np.int32), rnd((4, 2), np.int32)], np.matmul)
case("matmul", [View(rnd((4, 3), np.float32)), rnd((4, 2), np.float32)], np.matmul)
case("dot", [rnd((2, 3, 4)), rnd((5, 4, 2))], np.dot)
case("dot", [rnd((2, 3)), 2.0], np.dot)
for sa, sb in [((3, 4), (5, 4)), ((4,), (4,)), ((2, 3, 4), (4,)), ((3,), (4,))]:
    case("inner", [rnd(sa), rnd(sb)], np.inner)
case("outer", [rnd((3,)), rnd((2, 2))], np.outer)
case("vdot", [rnd((2, 3)), rnd((3, 2))], np.vdot)
case("kron", [rnd((2, 3)), rnd((3, 2))], np.kron)
case("kron", [rnd((2,)), rnd((2, 3))], np.kron)
case("tensordot", [rnd((3, 4, 5)), rnd((4, 5, 2)), 2], lambda a, b, n: np.tensordot(a, b, n))
case("tensordot", [rnd((3, 4, 5)), rnd((5, 3)), Pairs([(0, 2), (1, 0)])], lambda a, b, p: np.tensordot(a, b, axes=p))
case("tensordot", [rnd((3, 4)), rnd((3, 4)), 0], lambda a, b, n: np.tensordot(a, b, n))
for spec, shapes in [("ij,jk->ik", [(3, 4), (4, 2)]), ("ij,jk", [(3, 4), (4, 2)]),
                     ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("ij->ji", [(2, 3)]),
                     ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("i,i->", [(5,), (5,)]),
                     ("i,j->ij", [(3,), (2,)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
                     ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]), ("ijk->k", [(2, 3, 4)]),
                     ("abc,cd,b->ad", [(2, 3, 4), (4, 5), (3,)]), ("ij,kj->ik", [(2, 3), (4, 3)]),
                     ("i...->...", [(3, 2, 2)])]:
    ops = [rnd(s) for s in shapes]
    case("einsum", [spec, ops], lambda s, ops: np.einsum(s, *ops))
case("einsum", ["ij,jk->iz", [rnd((2, 2)), rnd((2, 2))]], lambda s, ops: np.einsum(s, *ops))
for sa, sb in [((3,), (3,)), ((4, 3), (3,)), ((2,), (2,)), ((5, 2), (5, 3)), ((3,), (4,))]:
    case("cross", [rnd(sa), rnd(sb), -1], lambda a, b, ax: np.cross(a, b, axis=ax))
case("cross", [rnd((3, 4)), rnd((3, 4)), 0], lambda a, b, ax: np.cross(a, b, axis=ax))
for off, a1, a2 in [(0, 0, 1), (1, 0, 1), (-1, 1, 2), (0, 2, 0)]:
    case("trace_with", [rnd((3, 4, 5)), off, a1, a2], np.trace)
    case("diagonal_with", [rnd((3, 4, 5)), off, a1, a2], np.diagonal)

# ---------------------------------------------------------------- sorting and searching
for x in [rnd((3, 5)), np.array([3.0, np.nan, 1.0, 2.0, np.nan, -1.0]), rnd((6,), np.int32, -3, 3)]:
    case("sort", [x, -1], lambda a, ax: np.sort(a, axis=ax, kind="stable"))
    case("argsort", [x, -1], lambda a, ax: np.argsort(a, axis=ax, kind="stable"))
    case("sort", [x, None], lambda a, ax: np.sort(a, axis=ax, kind="stable"))
case("sort", [rnd((4, 3)), 0], lambda a, ax: np.sort(a, axis=ax, kind="stable"))
case("argsort", [View(rnd((4, 3))), 0], lambda a, ax: np.argsort(a, axis=ax, kind="stable"))
s = np.sort(rnd((8,)))
s[3] = s[4]
for side in ["left", "right"]:
    case("searchsorted", [s, np.concatenate([s[:3], rnd((5,))]), side], lambda a, v, sd: np.searchsorted(a, v, side=sd))
case("searchsorted", [np.array([1, 2, 2, 5]), np.array([[2, 6], [0, 1]]), "left"], lambda a, v, sd: np.searchsorted(a, v, side=sd))
u = rnd((4, 5), np.int32, -3, 3)
case("unique", [u], np.unique)
case("unique", [np.array([2.0, np.nan, 1.0, 2.0])], np.unique)
big = np.array([2**60 + 1, 2**60, 2**60 + 1, -(2**62), 2**60], dtype=np.int64)  # beyond f64's integers
case("unique", [big], np.unique)
case("searchsorted", [np.sort(big), np.array([2**60 + 1, 2**60 - 1], dtype=np.int64), "left"], lambda a, v, sd: np.searchsorted(a, v, side=sd))
case("unique_all", [u], lambda a: np.unique(a, return_index=True, return_inverse=True, return_counts=True))
for x in [rnd((3, 4), np.int32, -1, 1), rnd((5,), np.bool_), np.round(rnd((2, 2, 3)))]:
    case("nonzero", [x], np.nonzero)
    case("argwhere", [x], np.argwhere)
    case("flatnonzero", [x], np.flatnonzero)
case("nonzero", [np.array(1.0)], np.nonzero)

# ---------------------------------------------------------------- indexing
a = rnd((4, 5, 6))
IDX = [
    Index(1), Index(-1, 2), Index(slice(1, 3)), Index(slice(None, None, -1)),
    Index(slice(None), slice(4, 0, -2)), Index(Ellipsis, 2), Index(None, 1),
    Index(1, None, slice(None), None), Index(Ellipsis, None), Index(slice(-2, None), Ellipsis, slice(None, 3)),
    Index(np.array([0, 2, -1])), Index(slice(None), np.array([[1, 0], [4, 4]])),
    Index(np.array([0, 1]), np.array([2, 3])), Index(np.array([0, 1]), slice(None), np.array([2, 3])),
    Index(slice(None), np.array([0, 1]), np.array([[2], [3]])), Index(1, np.array([0, 3])),
    Index(np.array([1, 3]), 2), Index(np.array([1, 3]), slice(1, 4), 2),
    Index(a > 0.5), Index(a[:, :, 0] > 0), Index(slice(None), a[0, :, 0] > 0, slice(None, 2)),
    Index(Ellipsis, np.array([5, 0])), Index(5), Index(np.array([4])), Index(1, 2, 3, 4),
    Index(slice(None, None, 2), slice(None, None, 3), slice(1, None, 2)),
]
for ix in IDX:
    case("getitem", [a, ix], lambda a, ix: a[tuple(it for it in ix.items)])
case("getitem", [View(rnd((5, 4))), Index(slice(1, None), np.array([0, 0, 3]))], lambda a, ix: a[tuple(ix.items)])

# ---------------------------------------------------------------- linalg
def spd(n):
    m = rnd((n, n))
    return m @ m.T + n * np.eye(n)


sq = rnd((4, 4)) + 4 * np.eye(4)
stack = rnd((2, 3, 3)) + 3 * np.eye(3)
case("linalg.inv", [sq], np.linalg.inv)
case("linalg.inv", [stack], np.linalg.inv)
case("linalg.inv", [np.ones((3, 3))], np.linalg.inv)
case("linalg.inv", [rnd((2, 3))], np.linalg.inv)
case("linalg.inv", [rnd((3, 3), np.float32) + 3 * np.eye(3, dtype=np.float32)], np.linalg.inv, tol=[1e-4, 1e-5])
case("linalg.det", [sq], np.linalg.det)
case("linalg.det", [stack], np.linalg.det)
case("linalg.det", [rnd((3, 3), np.int32)], np.linalg.det)
case("linalg.solve", [sq, rnd((4,))], np.linalg.solve)
case("linalg.solve", [sq, rnd((4, 2))], np.linalg.solve)
case("linalg.solve", [stack, rnd((2, 3, 1))], np.linalg.solve)
case("linalg.solve", [sq, rnd((3,))], np.linalg.solve)
for shp, full in [((4, 3), False), ((3, 5), False), ((4, 3), True), ((2, 3, 3), False)]:
    case("linalg.svd", [rnd(shp), full], lambda a, f: np.linalg.svd(a, full_matrices=f), cmp="abs")
case("linalg.qr", [rnd((5, 3))], np.linalg.qr, cmp="abs")
case("linalg.qr", [rnd((3, 4))], np.linalg.qr, cmp="abs")
case("linalg.cholesky", [spd(4)], np.linalg.cholesky)
case("linalg.cholesky", [np.stack([spd(3), spd(3)])], np.linalg.cholesky)
case("linalg.cholesky", [-np.eye(3)], np.linalg.cholesky)
case("linalg.eigh", [spd(4)], np.linalg.eigh, cmp="abs")
case("linalg.eigh", [np.tril(rnd((3, 3)))], np.linalg.eigh, cmp="abs")
case("linalg.eigvalsh", [spd(5)], np.linalg.eigvalsh)
v = rnd((3, 4))
for ordv, ax in [(None, None), (None, Ints(1)), (1.0, Ints(0)), (math.inf, Ints(1)), (-math.inf, Ints(1)),
                 (0.0, Ints(1)), (3.0, Ints(0)), ("fro", None), ("nuc", None), (1.0, None), (-1.0, None),
                 (math.inf, None), (-math.inf, None), (2.0, None), (-2.0, None), (2.0, Ints(1, 0))]:
    case("linalg.norm_with", [v, ordv, ax, False], lambda x, o, ax, k: np.linalg.norm(x, ord=o, axis=ax, keepdims=k))
case("linalg.norm_with", [rnd((5,)), None, None, True], lambda x, o, ax, k: np.linalg.norm(x, ord=o, axis=ax, keepdims=k))
case("linalg.norm_with", [rnd((2, 3, 4)), "fro", Ints(2, 0), True], lambda x, o, ax, k: np.linalg.norm(x, ord=o, axis=ax, keepdims=k))
for n in [0, 1, 3, 6, -2]:
    case("linalg.matrix_power", [rnd((3, 3)) + 2 * np.eye(3), n], np.linalg.matrix_power)
case("linalg.matrix_power", [rnd((2, 3, 3)), 2], np.linalg.matrix_power)
case("linalg.matrix_power", [rnd((2, 3)), 2], np.linalg.matrix_power)
case("linalg.pinv", [rnd((5, 3)), 1e-15], lambda a, r: np.linalg.pinv(a, rcond=r))
case("linalg.pinv", [np.outer(rnd((4,)), rnd((3,))), 1e-10], lambda a, r: np.linalg.pinv(a, rcond=r))
case("linalg.lstsq", [rnd((6, 3)), rnd((6,)), None], lambda a, b, r: np.linalg.lstsq(a, b, rcond=r))
case("linalg.lstsq", [rnd((6, 3)), rnd((6, 2)), None], lambda a, b, r: np.linalg.lstsq(a, b, rcond=r))
case("linalg.lstsq", [np.outer(rnd((5,)), rnd((3,))), rnd((5,)), None], lambda a, b, r: np.linalg.lstsq(a, b, rcond=r))
case("linalg.lstsq", [rnd((3, 5)), rnd((3,)), None], lambda a, b, r: np.linalg.lstsq(a, b, rcond=r))


# ---------------------------------------------------------------- more of NumPy
case("hsplit", [rnd((3, 6)), 3], np.hsplit)
case("hsplit", [rnd((6,)), Ints(2, 5)], lambda a, s: np.hsplit(a, list(s)))
case("vsplit", [rnd((4, 3)), 2], np.vsplit)
case("vsplit", [rnd((4,)), 2], np.vsplit)
case("dsplit", [rnd((2, 2, 4)), 2], np.dsplit)
case("column_stack", [[rnd((3,)), rnd((3, 2))]], lambda xs: np.column_stack(xs))
case("append", [rnd((2, 3)), rnd((1, 3)), 0], lambda a, v, ax: np.append(a, v, axis=ax))
case("append", [rnd((2, 3)), rnd((4,), np.int32), None], lambda a, v, ax: np.append(a, v, axis=ax))
case("delete", [rnd((4, 3)), np.array([0, -1]), 0], lambda a, i, ax: np.delete(a, i, axis=ax))
case("delete", [rnd((4, 3)), np.array([1, 5]), None], lambda a, i, ax: np.delete(a, i, axis=ax))
case("delete", [rnd((4, 3)), np.array([3]), 1], lambda a, i, ax: np.delete(a, i, axis=ax))
for ax, st in [(2, 0), (0, 3), (1, -1), (0, 5)]:
    case("rollaxis", [rnd((2, 3, 4)), ax, st], np.rollaxis)
case("extract", [rnd((3, 4)) > 0, rnd((3, 4))], np.extract)
case("ascontiguousarray", [View(rnd((3, 4)))], np.ascontiguousarray)
case("copy", [View(rnd((3, 2)))], np.copy)
case("broadcast_shapes", [Shapes((3, 1), (4,), (2, 1, 1))], lambda s: np.broadcast_shapes(*s))
case("broadcast_shapes", [Shapes((3, 2), (4,))], lambda s: np.broadcast_shapes(*s))
case("array_equiv", [np.array([1.0, 2.0]), np.array([[1.0, 2.0], [1.0, 2.0]])], np.array_equiv)
case("array_equiv", [np.array([1.0, 2.0]), np.array([[1.0, 2.0], [1.0, 3.0]])], np.array_equiv)
case("array_equiv", [np.array([1.0, 2.0]), np.array([1.0, 2.0, 3.0])], np.array_equiv)
for n, k, m in [(4, 0, None), (3, 1, 5), (4, -1, 2)]:
    case("tril_indices", [n, k, m], np.tril_indices)
    case("triu_indices", [n, k, m], np.triu_indices)
case("tril_indices_from", [rnd((3, 4)), 1], lambda a, k: np.tril_indices_from(a, k))
case("triu_indices_from", [rnd((4, 2)), -1], lambda a, k: np.triu_indices_from(a, k))
case("diag_indices", [4, 3], np.diag_indices)
case("diag_indices_from", [rnd((3, 3))], np.diag_indices_from)
case("diag_indices_from", [rnd((3, 4))], np.diag_indices_from)
case("vander", [rnd((4,)), None, False], lambda x, n, inc: np.vander(x, n, inc))
case("vander", [rnd((3,), np.int64, -3, 3), 5, True], lambda x, n, inc: np.vander(x, n, inc))
case("nan_to_num", [special, 0.0, None, None], lambda x, n, p, q: np.nan_to_num(x, nan=n, posinf=p, neginf=q))
case("nan_to_num", [special.astype(np.float32), -1.0, 9.0, -9.0], lambda x, n, p, q: np.nan_to_num(x, nan=n, posinf=p, neginf=q))
case("ediff1d", [rnd((3, 4))], np.ediff1d)
case("trapezoid", [rnd((3, 5)), None, 0.5, -1], lambda y, x, dx, ax: np.trapezoid(y, x, dx=dx, axis=ax))
case("trapezoid", [rnd((5, 3)), np.sort(rnd((5,))), 1.0, 0], lambda y, x, dx, ax: np.trapezoid(y, x, dx=dx, axis=ax))
case("modf", [rnd((2, 3)) * 3], np.modf)
case("ldexp", [rnd((2, 3)), rnd((3,), np.int32, -3, 3)], np.ldexp)
case("ldexp", [rnd((2, 3)), rnd((3,))], np.ldexp)
u2 = rnd((3, 4), np.int64, -2, 2)
# NumPy >= 2.3 may return unique_values unsorted (hash based); ours are sorted
case("unique_values", [u2], lambda a: np.sort(np.unique_values(a)))
case("unique_counts", [u2], lambda a: tuple(np.unique_counts(a)))
case("unique_inverse", [u2], lambda a: tuple(np.unique_inverse(a)))
bins = np.array([-1.0, 0.0, 0.5, 2.0])
for right in [False, True]:
    case("digitize", [np.array([-2.0, -1.0, 0.2, 0.5, 3.0, 2.0]), bins, right], lambda x, b, r: np.digitize(x, b, right=r))
    case("digitize", [np.array([-2.0, -1.0, 0.2, 0.5, 3.0, 2.0]), bins[::-1].copy(), right], lambda x, b, r: np.digitize(x, b, right=r))
case("digitize", [np.array([1.0]), np.array([1.0, 0.0, 2.0]), False], lambda x, b, r: np.digitize(x, b, right=r))
case("bincount", [rnd((20,), np.int64, 0, 6), None, 0], lambda x, w, m: np.bincount(x, w, m))
case("bincount", [rnd((8,), np.int64, 0, 3), rnd((8,)), 6], lambda x, w, m: np.bincount(x, w, m))
case("bincount", [np.array([1, -1]), None, 0], lambda x, w, m: np.bincount(x, w, m))
case("histogram", [rnd((50,)), 7, None], lambda a, b, r: np.histogram(a, b, r))
case("histogram", [rnd((50,)), 4, Floats(-1.0, 1.0)], lambda a, b, r: np.histogram(a, b, r))
case("histogram", [np.linspace(0.0, 1.0, 11), 5, None], lambda a, b, r: np.histogram(a, b, r))
xp = np.sort(rnd((6,)))
case("interp", [rnd((3, 4), lo=-4, hi=4), xp, rnd((6,)), None, None], lambda x, xp, fp, l, r: np.interp(x, xp, fp, l, r))
case("interp", [rnd((5,), lo=-4, hi=4), xp, rnd((6,)), -9.0, 9.0], lambda x, xp, fp, l, r: np.interp(x, xp, fp, l, r))
case("cov", [rnd((3, 6)), True, None], lambda m, rv, d: np.cov(m, rowvar=rv, ddof=d))
case("cov", [rnd((6, 2)), False, 0], lambda m, rv, d: np.cov(m, rowvar=rv, ddof=d))
case("cov", [rnd((5,)), True, None], lambda m, rv, d: np.cov(m, rowvar=rv, ddof=d))
case("corrcoef", [rnd((3, 6)), True], lambda m, rv: np.corrcoef(m, rowvar=rv))
case("corrcoef", [rnd((6, 2)), False], lambda m, rv: np.corrcoef(m, rowvar=rv))

# ---------------------------------------------------------------- files NumPy wrote
arrs = {"x": rnd((3, 4)), "n": rnd((5,), np.int64, -9, 9), "m": rnd((2, 2), np.bool_),
        "h": rnd((3,), np.float16), "f": np.asfortranarray(rnd((3, 2), np.float32))}
np.savez(os.path.join(OUT, "numpy_stored.npz"), **arrs)
np.savez_compressed(os.path.join(OUT, "numpy_deflated.npz"), **arrs)
for name in ["numpy_stored.npz", "numpy_deflated.npz"]:
    cases.append({"fn": "load_npz", "args": [{"s": name}], "cmp": "close",
                  "out": [enc(arrs[k]) for k in arrs], "names": list(arrs)})
with open(os.path.join(OUT, "corrupt.npz"), "wb") as fh:
    fh.write(b"PK\x03\x04 this is not a zip archive")
cases.append({"fn": "load_npz", "args": [{"s": "corrupt.npz"}], "cmp": "close", "error": "BadZipFile"})

# ---------------------------------------------------------------- reductions' keywords
# (last, so the cases above keep drawing the same random values)
# initial= and where= (the Rust `_with` forms): [a, axis, keepdims, initial, where]
def with_kw(f):
    def call(a, ax, k, init, wh):
        kw = {}
        if init is not None:
            kw["initial"] = init
        if wh is not None:
            kw["where"] = wh
        return f(a, axis=ax, keepdims=k, **kw)
    return call
for name in ["sum", "prod", "amax", "amin", "max", "min", "mean", "any", "all"]:
    f = with_kw(getattr(np, name))
    a = rnd((3, 4), lo=-2, hi=2)
    mask = rnd((3, 4), np.bool_)
    row_mask = rnd((4,), np.bool_)
    case(name + "_with", [a, None, False, 1.5, None], f)
    case(name + "_with", [a, 1, False, -0.5, mask], f)
    case(name + "_with", [a, 0, True, 3.0, row_mask], f)
    case(name + "_with", [a, Ints(0, 1), False, None, mask], f)
    case(name + "_with", [View(rnd((4, 3), lo=-2, hi=2)), -1, False, 0.25, None], f)
    case(name + "_with", [rnd((3, 4), np.int32, -5, 5), 1, False, 2.0, mask], f)
    case(name + "_with", [np.zeros((0, 3)), 0, False, 2.0, None], f)  # empty: initial or error
    case(name + "_with", [np.zeros((0, 3)), 1, False, None, None], f)
    case(name + "_with", [np.array([1.0, np.nan, 3.0]), None, False, 5.0, np.array([True, True, False])], f)
    case(name + "_with", [a, None, False, None, np.ones((2, 3, 4), bool)], f)  # mask too large
    case(name + "_with", [a, None, False, None, rnd((3, 4), np.int64, 0, 1)], f)  # int mask
case("amax_with", [rnd((4,), np.uint8, 0, 9), None, False, -1.0, None], with_kw(np.amax))
case("sum_with", [rnd((4,), np.int8, -5, 5), None, False, 2.75, None], with_kw(np.sum))
case("amin_with", [rnd((5,), np.bool_), None, False, 1.0, rnd((5,), np.bool_)], with_kw(np.amin))

# ---------------------------------------------------------------- 16-bit and unsigned integers
# (NumPy's own promotion lands on int16, uint16, uint32, uint64: no widening)
NEW_INTS = [np.int16, np.uint16, np.uint32, np.uint64]
ALL_INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
for dt in NEW_INTS:
    lo = -20 if np.issubdtype(dt, np.signedinteger) else 0
    x, y = rnd((3, 4), dt, lo, 40), rnd((4,), dt, 1, 9)
    for name in ["add", "subtract", "multiply", "floor_divide", "remainder", "maximum", "minimum",
                 "power", "equal", "less", "true_divide"]:
        case(name, [x, y], getattr(np, name))
    for name in ["negative", "absolute", "sign", "square", "sqrt", "exp", "positive"]:
        case(name, [x], getattr(np, name), tol=[1e-3, 1e-3])
    for name in ["sum", "prod", "amax", "amin", "mean", "cumsum"]:
        if name == "cumsum":
            case(name, [x, 1], lambda a, ax: np.cumsum(a, axis=ax))
        else:
            case(name, [x, 0, False], lambda a, ax, k, f=getattr(np, name): f(a, axis=ax, keepdims=k))
    case("sort", [x, -1], lambda a, ax: np.sort(a, axis=ax))
    case("argmax", [x, 1], lambda a, ax: np.argmax(a, axis=ax))
    case("matmul", [rnd((2, 3), dt, 0, 9), rnd((3, 2), dt, 0, 9)], np.matmul)
    case("clip", [x, 2, 30], np.clip)
    case("where", [x > 10, x, y], np.where)
for a_dt in ALL_INTS:
    for b_dt in ALL_INTS:
        case("add", [rnd((3,), a_dt, 0, 50), rnd((3,), b_dt, 0, 50)], np.add)
case("subtract", [np.array([0, 1], np.uint16), np.array([1, 1], np.uint16)], np.subtract)  # wraps
case("add", [np.array([2**64 - 1, 5], np.uint64), np.array([1, 2**63], np.uint64)], np.add)
case("floor_divide", [np.array([2**64 - 1, 2**63 + 5], np.uint64), np.array([3, 2**62], np.uint64)], np.floor_divide)
case("remainder", [np.array([2**64 - 1, 2**63 + 5], np.uint64), np.array([10, 7], np.uint64)], np.remainder)
case("multiply", [np.array([60000], np.uint16), np.array([3], np.uint16)], np.multiply)
# Python ints within the array's range (NumPy 2 refuses others, NumPy 1.16 promoted them
# by value as ferroflow does: see the promotion unit tests)
case("add", [np.array([1, 2], np.uint16), 60000], np.add)
case("add", [np.array([1, 2], np.int16), -30000], np.add)
case("true_divide", [rnd((3,), np.int8, 1, 9), rnd((3,), np.uint8, 1, 9)], np.true_divide)

# ---------------------------------------------------------------- NumPy's defaults, no keywords
xs, ys = rnd((3, 4)), rnd((3, 4))
case("isclose", [xs, xs + 1e-9], np.isclose)
case("isclose", [xs, ys], np.isclose)
case("allclose", [xs, xs * (1 + 1e-7)], np.allclose)
case("allclose", [xs, ys], np.allclose)
case("trace", [rnd((4, 4))], np.trace)
case("trace", [rnd((3, 4, 2))], np.trace)
case("diagonal", [rnd((3, 5))], np.diagonal)
case("linalg.norm", [rnd((3, 4))], np.linalg.norm)
case("linalg.norm", [rnd((2, 3, 2))], np.linalg.norm)

# ---------------------------------------------------------------- creation from array-likes
case("linspace", [0.0, 1.0, 7], np.linspace)
case("linspace", [np.array(2.0), np.array([0.0, 10.0, -4.0]), 5], np.linspace)
case("linspace", [rnd((2, 1)), rnd((3,)), 4], np.linspace)
case("logspace", [0.0, np.array([1.0, 2.0]), 4], np.logspace)
case("geomspace", [np.array([1.0, -2.0]), np.array([1000.0, -64.0]), 4], np.geomspace)
case("geomspace", [np.array([-1.0, -2.0]), -8.0, 3], np.geomspace)

case("eye", [4], np.eye)



# ---------------------------------------------------------------- complex numbers and np.fft
def crnd(shp, dtype=np.complex128, lo=-2.0, hi=2.0):
    return (rng.uniform(lo, hi, size=shp) + 1j * rng.uniform(lo, hi, size=shp)).astype(dtype)


for dt in (np.complex64, np.complex128):
    z, w = crnd((2, 3), dt), crnd((3,), dt)
    for name in ("add", "subtract", "multiply", "divide", "true_divide", "equal", "not_equal"):
        case(name, [z, w], getattr(np, name))
    case("power", [crnd((4,), dt, 0.5, 1.5), crnd((4,), dt, -1, 1)], np.power)
    for name in ("exp", "expm1", "log", "log1p", "sqrt", "sin", "cos", "tan", "sinh", "cosh",
                 "tanh", "arcsin", "arccos", "arctan", "square", "negative", "reciprocal", "sign"):
        lo, hi = (0.1, 0.8) if name.startswith("arc") else (-1.5, 1.5)
        case(name, [crnd((5,), dt, lo, hi)], getattr(np, name))
    case("absolute", [z], np.absolute)
    case("abs", [View(crnd((2, 3), dt))], np.abs)
    case("real", [z], np.real)
    case("imag", [View(crnd((3, 2), dt))], np.imag)
    case("conj", [z], np.conj)
    case("conjugate", [View(crnd((2, 3), dt))], np.conjugate)
    case("angle", [z], np.angle)
    case("angle_with", [z, True], lambda a, d: np.angle(a, deg=d))
    case("sum", [z, 1, False], lambda a, ax, k: np.sum(a, axis=ax, keepdims=k))
    case("prod", [z, None, False], lambda a, ax, k: np.prod(a, axis=ax, keepdims=k))
    case("mean", [z, 0, True], lambda a, ax, k: np.mean(a, axis=ax, keepdims=k))
    case("cumsum", [z, 1], lambda a, ax: np.cumsum(a, axis=ax))
    case("matmul", [crnd((2, 3), dt), crnd((3, 4), dt)], np.matmul)
    case("dot", [crnd((4,), dt), crnd((4,), dt)], np.dot)
    case("vdot", [z, crnd((2, 3), dt)], np.vdot)
    case("iscomplex", [np.array([1 + 0j, 2 + 1j, -0j], dt)], np.iscomplex)
    case("isreal", [np.array([1 + 0j, 2 + 1j], dt)], np.isreal)
    case("iscomplexobj", [z], np.iscomplexobj)
    case("isrealobj", [z], np.isrealobj)
    case("var", [z, 1, 0, False], lambda a, ax, dd, k: np.var(a, axis=ax, ddof=dd, keepdims=k))
case("angle", [np.array([-1.0, -0.0, 0.0, 2.0])], np.angle)
case("angle", [np.array([-3, 4], np.int32)], np.angle)
case("real", [rnd((3,))], np.real)
case("imag", [rnd((3,), np.int32)], np.imag)
case("conj", [rnd((3,), np.int32)], np.conj)
case("iscomplex", [rnd((3,))], np.iscomplex)
case("isrealobj", [rnd((3,))], np.isrealobj)
case("add", [crnd((3,), np.complex64), rnd((3,), np.float64)], np.add)
case("add", [crnd((3,), np.complex64), rnd((3,), np.int16, -5, 5)], np.add)
case("multiply", [crnd((3,), np.complex64), rnd((3,), np.int32, -5, 5)], np.multiply)
case("add", [crnd((3,), np.complex64), 1.5], np.add)

for dt in (np.complex64, np.complex128, np.float32, np.float64, np.int32):
    x = crnd((3, 8), dt) if np.issubdtype(dt, np.complexfloating) else rnd((3, 8), dt, -3, 3)
    case("fft.fft", [x], np.fft.fft)
    case("fft.ifft", [x], np.fft.ifft)
for shp in [(2, 97), (1000,), (1024,), (3, 1), (12,)]:
    case("fft.fft", [crnd(shp)], np.fft.fft, tol=[1e-9, 1e-9])
for n, axis, norm in [(None, -1, "backward"), (5, 0, "ortho"), (12, 1, "forward"), (7, -2, "backward"),
                      (1, 1, "ortho"), (0, -1, "backward"), (None, 2, "backward"), (4, -1, "unitary")]:
    args = (n, axis, norm)
    case("fft.fft_with", [View(crnd((6, 7))), *args], lambda a, n, ax, nm: np.fft.fft(a, n, ax, nm))
    case("fft.ifft_with", [crnd((6, 7)), *args], lambda a, n, ax, nm: np.fft.ifft(a, n, ax, nm))
    case("fft.rfft_with", [rnd((6, 7)), *args], lambda a, n, ax, nm: np.fft.rfft(a, n, ax, nm))
    case("fft.irfft_with", [crnd((6, 7)), *args], lambda a, n, ax, nm: np.fft.irfft(a, n, ax, nm))
case("fft.rfft", [rnd((4, 9))], np.fft.rfft)
case("fft.rfft", [rnd((10,), np.float32)], np.fft.rfft)
case("fft.rfft", [rnd((5,), np.int32, -3, 3)], np.fft.rfft)
case("fft.rfft", [crnd((3,))], np.fft.rfft)  # complex input: NumPy 2's TypeError
case("fft.irfft", [crnd((4, 5))], np.fft.irfft)
case("fft.irfft", [crnd((6,), np.complex64)], np.fft.irfft)
case("fft.irfft", [rnd((5,))], np.fft.irfft)
case("fft.fft2", [crnd((3, 4, 5))], np.fft.fft2)
case("fft.fft2", [rnd((4, 6))], np.fft.fft2)
case("fft.ifft2", [crnd((2, 5, 3))], np.fft.ifft2)
case("fft.fftfreq", [8, 0.1], np.fft.fftfreq)
case("fft.fftfreq", [7, 1.0], np.fft.fftfreq)
case("fft.rfftfreq", [8, 0.5], np.fft.rfftfreq)
case("fft.rfftfreq", [7, 2.0], np.fft.rfftfreq)
case("fft.fftshift", [rnd((4, 5))], np.fft.fftshift)
case("fft.ifftshift", [rnd((4, 5))], np.fft.ifftshift)
case("fft.fftshift_with", [rnd((4, 5)), 1], lambda a, ax: np.fft.fftshift(a, axes=ax))
case("fft.ifftshift_with", [rnd((3, 5)), Ints(0, 1)], lambda a, ax: np.fft.ifftshift(a, axes=ax))

# ---------------------------------------------------------------- keyword forms
xs = rnd((3, 4))
case("average_with", [xs, 1, rnd((4,), np.float64, 0.1, 2)], lambda a, ax, w: np.average(a, axis=ax, weights=w))
case("average_with", [xs, None, None], lambda a, ax, w: np.average(a, axis=ax, weights=w))
case("cov_with", [xs, False, 0], lambda m, r, d: np.cov(m, rowvar=r, ddof=d))
case("cov_with", [xs, True, None], lambda m, r, d: np.cov(m, rowvar=r, ddof=d))

with open(os.path.join(OUT, "cases.json"), "w") as fh:
    json.dump({"numpy": np.__version__, "cases": cases}, fh, allow_nan=False)
print("%d cases for numpy %s" % (len(cases), np.__version__))
