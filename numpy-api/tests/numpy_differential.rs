//! Differential tests against real NumPy: `numpy_cases.py` draws random cases with NumPy
//! (inputs and NumPy's outputs or exceptions, as .npy files); each case is replayed here
//! through ferroflow-numpy and compared: dtype (NumPy's, widened where ferroflow lacks the
//! type), shape and values (NaN equal to NaN; tolerances by dtype). Without python3 and
//! NumPy the test skips with a message, unless `FERROFLOW_REQUIRE_NUMPY=1` (CI) makes that
//! a failure.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use ferroflow_numpy::linalg::{self, NormOrd};
use ferroflow_numpy::{self as np, Axes, DType, Index, Result, Tensor, Value};
use serde_json::Value as Json;

/// Whether python3 can import NumPy; without it the NumPy checks skip loudly (or fail when
/// `FERROFLOW_REQUIRE_NUMPY=1`).
fn have_numpy() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_NUMPY",
            "python3 with NumPy is not available (pip install numpy); the NumPy checks did not run",
        );
    }
    ok
}

fn numpy_dir(tag: &str) -> Option<PathBuf> {
    if !have_numpy() {
        return None;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(tag);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/numpy_cases.py");
    let status = Command::new("python3")
        .arg(&script)
        .arg(&dir)
        .status()
        .expect("python3");
    assert!(status.success(), "numpy_cases.py failed");
    Some(dir)
}

#[derive(Debug, Clone)]
enum Arg {
    A(Tensor),
    F(f64),
    I(i64),
    B(bool),
    S(String),
    None,
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Arrays(Vec<Tensor>),
    Pairs(Vec<(i64, i64)>),
    Shapes(Vec<Vec<usize>>),
    Index(Vec<Index>),
}

enum Out {
    T(Tensor),
    Bool(bool),
    Int(i64),
}

fn t(v: Tensor) -> Vec<Out> {
    vec![Out::T(v)]
}
fn ts(v: Vec<Tensor>) -> Vec<Out> {
    v.into_iter().map(Out::T).collect()
}

struct Args<'a>(&'a [Arg]);

impl Args<'_> {
    fn a(&self, i: usize) -> Tensor {
        match &self.0[i] {
            Arg::A(t) => t.clone(),
            other => panic!("arg {i}: expected an array, got {other:?}"),
        }
    }
    fn v(&self, i: usize) -> Value {
        match &self.0[i] {
            Arg::A(t) => Value::Array(t.clone()),
            Arg::F(f) => (*f).into(),
            Arg::I(n) => (*n).into(),
            Arg::B(b) => (*b).into(),
            other => panic!("arg {i}: expected an array or scalar, got {other:?}"),
        }
    }
    fn f(&self, i: usize) -> f64 {
        match &self.0[i] {
            Arg::F(f) => *f,
            Arg::I(n) => *n as f64,
            other => panic!("arg {i}: expected a number, got {other:?}"),
        }
    }
    fn i(&self, i: usize) -> i64 {
        match &self.0[i] {
            Arg::I(n) => *n,
            other => panic!("arg {i}: expected an int, got {other:?}"),
        }
    }
    fn b(&self, i: usize) -> bool {
        match &self.0[i] {
            Arg::B(b) => *b,
            other => panic!("arg {i}: expected a bool, got {other:?}"),
        }
    }
    fn s(&self, i: usize) -> String {
        match &self.0[i] {
            Arg::S(s) => s.clone(),
            other => panic!("arg {i}: expected a string, got {other:?}"),
        }
    }
    fn opt_usize(&self, i: usize) -> Option<usize> {
        match &self.0[i] {
            Arg::None => None,
            _ => Some(self.i(i) as usize),
        }
    }
    fn axis(&self, i: usize) -> Option<isize> {
        match &self.0[i] {
            Arg::None => None,
            Arg::I(n) => Some(*n as isize),
            Arg::Ints(v) if v.len() == 1 => Some(v[0] as isize),
            other => panic!("arg {i}: expected an axis, got {other:?}"),
        }
    }
    fn axes(&self, i: usize) -> Axes {
        match &self.0[i] {
            Arg::None => Axes::All,
            Arg::I(n) => Axes::List(vec![*n as isize]),
            Arg::Ints(v) => Axes::List(v.iter().map(|x| *x as isize).collect()),
            other => panic!("arg {i}: expected axes, got {other:?}"),
        }
    }
    fn ints(&self, i: usize) -> Vec<isize> {
        match &self.0[i] {
            Arg::Ints(v) => v.iter().map(|x| *x as isize).collect(),
            other => panic!("arg {i}: expected ints, got {other:?}"),
        }
    }
    fn shape(&self, i: usize) -> Vec<usize> {
        self.ints(i).into_iter().map(|x| x as usize).collect()
    }
    fn dtype(&self, i: usize) -> Option<DType> {
        match &self.0[i] {
            Arg::None => None,
            Arg::S(s) => Some(DType::parse(s).expect("dtype")),
            other => panic!("arg {i}: expected a dtype, got {other:?}"),
        }
    }
    fn arrays(&self, i: usize) -> Vec<Tensor> {
        match &self.0[i] {
            Arg::Arrays(v) => v.clone(),
            other => panic!("arg {i}: expected arrays, got {other:?}"),
        }
    }
    fn q(&self, i: usize) -> Value {
        match &self.0[i] {
            Arg::Floats(v) => Value::Array(np::asarray(v.clone()).expect("q")),
            _ => self.v(i),
        }
    }
    fn norm_ord(&self, i: usize) -> NormOrd {
        match &self.0[i] {
            Arg::None => NormOrd::Default,
            Arg::S(s) if s == "fro" => NormOrd::Fro,
            Arg::S(s) if s == "nuc" => NormOrd::Nuc,
            _ => NormOrd::P(self.f(i)),
        }
    }
}

fn pad_mode(s: &str) -> np::PadMode {
    match s {
        "constant" => np::PadMode::Constant(1.5),
        "edge" => np::PadMode::Edge,
        "reflect" => np::PadMode::Reflect,
        "symmetric" => np::PadMode::Symmetric,
        "wrap" => np::PadMode::Wrap,
        other => panic!("pad mode {other}"),
    }
}

macro_rules! unary {
    ($name:expr, $a:expr; $($n:ident),*) => {
        match $name {
            $(stringify!($n) => return Ok(Some(t(np::$n(&$a.a(0))?))),)*
            _ => {}
        }
    };
}
macro_rules! binary {
    ($name:expr, $a:expr; $($n:ident),*) => {
        match $name {
            $(stringify!($n) => return Ok(Some(t(np::$n($a.v(0), $a.v(1))?))),)*
            _ => {}
        }
    };
}
/// A case's `axis`, `keepdims` (and `ddof`) as [`np::ReduceArgs`], and whether they are
/// NumPy's defaults (then the short form runs, else the `_with` form).
fn reduce_args(axis: Axes, keepdims: bool, ddof: usize) -> (np::ReduceArgs, bool) {
    let default = matches!(axis, Axes::All) && !keepdims && ddof == 0;
    (
        np::ReduceArgs::new()
            .axis(axis)
            .keepdims(keepdims)
            .ddof(ddof),
        default,
    )
}

macro_rules! reduce_axes {
    ($name:expr, $a:expr; $($n:ident / $w:ident),*) => {
        match $name {
            $(stringify!($n) => {
                let (args, default) = reduce_args($a.axes(1), $a.b(2), 0);
                return Ok(Some(t(if default { np::$n(&$a.a(0))? } else { np::$w(&$a.a(0), args)? })));
            })*
            _ => {}
        }
    };
}

/// Runs one case; `Ok(None)` for a function this table does not know.
fn call(name: &str, a: &Args, dir: &Path) -> Result<Option<Vec<Out>>> {
    unary!(name, a; exp, expm1, log, log1p, sqrt, sin, cos, tan, arcsin, arccos, arctan, sinh,
        cosh, tanh, floor, ceil, rint, exp2, log2, log10, cbrt, arcsinh, arccosh, arctanh, deg2rad,
        radians, rad2deg, degrees, sinc, trunc, fix, fabs, square, reciprocal, absolute, abs, sign,
        negative, positive, signbit, logical_not, isfinite, isinf, isnan, isposinf, isneginf,
        ravel, fliplr, flipud, atleast_1d, atleast_2d, atleast_3d, array, asarray, unique,
        argwhere, flatnonzero);
    binary!(name, a; add, subtract, multiply, true_divide, divide, floor_divide, remainder, fmod,
        power, float_power, maximum, minimum, fmax, fmin, arctan2, hypot, logaddexp, logaddexp2,
        heaviside, copysign, equal, not_equal, less, less_equal, greater, greater_equal,
        logical_and, logical_or, logical_xor, matmul, dot, inner, outer, vdot, kron);
    reduce_axes!(name, a; sum / sum_with, prod / prod_with, mean / mean_with, amax / amax_with, amin / amin_with, max / max_with, min / min_with, ptp / ptp_with, any / any_with, all / all_with, count_nonzero / count_nonzero_with, nansum / nansum_with, nanprod / nanprod_with, nanmean / nanmean_with, nanmax / nanmax_with, nanmin / nanmin_with);
    const REDUCE_WITH: [&str; 9] = [
        "sum", "prod", "amax", "amin", "max", "min", "mean", "any", "all",
    ];
    if let Some(base) = name
        .strip_suffix("_with")
        .filter(|b| REDUCE_WITH.contains(b))
    {
        let mut args = np::ReduceArgs::new().axis(a.axes(1)).keepdims(a.b(2));
        if !matches!(a.0[3], Arg::None) {
            args = args.initial(a.f(3));
        }
        if let Arg::A(mask) = &a.0[4] {
            args = args.where_(mask);
        }
        let x = a.a(0);
        return Ok(Some(t(match base {
            "sum" => np::sum_with(x, args)?,
            "prod" => np::prod_with(x, args)?,
            "amax" => np::amax_with(x, args)?,
            "amin" => np::amin_with(x, args)?,
            "max" => np::max_with(x, args)?,
            "min" => np::min_with(x, args)?,
            "mean" => np::mean_with(x, args)?,
            "any" => np::any_with(x, args)?,
            "all" => np::all_with(x, args)?,
            _ => return Ok(None),
        })));
    }
    Ok(Some(match name {
        "mod" => t(np::mod_(a.v(0), a.v(1))?),
        "divmod" => {
            let (q, r) = np::divmod(a.v(0), a.v(1))?;
            vec![Out::T(q), Out::T(r)]
        }
        "clip" => t(np::clip(a.v(0), a.v(1), a.v(2))?),
        "around" => t(np::around(a.a(0), a.i(1) as i32)?),
        "round_" => t(np::round_(a.a(0), a.i(1) as i32)?),
        "isclose" => t(np::isclose(a.v(0), a.v(1))?),
        "allclose" => vec![Out::Bool(np::allclose(a.v(0), a.v(1))?)],
        "trace" => t(np::trace(a.a(0))?),
        "diagonal" => t(np::diagonal(a.a(0))?),
        "linalg.norm" => t(linalg::norm(a.a(0))?),
        "isclose_with" => t(np::isclose_with(a.v(0), a.v(1), a.f(2), a.f(3), a.b(4))?),
        "allclose_with" => vec![Out::Bool(np::allclose_with(
            a.v(0),
            a.v(1),
            a.f(2),
            a.f(3),
            a.b(4),
        )?)],
        "array_equal" => vec![Out::Bool(np::array_equal(a.v(0), a.v(1))?)],
        "std" | "var" | "nanstd" | "nanvar" => {
            let (args, default) = reduce_args(a.axes(1), a.b(3), a.i(2) as usize);
            let x = a.a(0);
            t(match (name, default) {
                ("std", true) => np::std(x)?,
                ("std", false) => np::std_with(x, args)?,
                ("var", true) => np::var(x)?,
                ("var", false) => np::var_with(x, args)?,
                ("nanstd", true) => np::nanstd(x)?,
                ("nanstd", false) => np::nanstd_with(x, args)?,
                (_, true) => np::nanvar(x)?,
                (_, false) => np::nanvar_with(x, args)?,
            })
        }
        "argmax" => t(np::argmax(a.a(0), a.axis(1))?),
        "argmin" => t(np::argmin(a.a(0), a.axis(1))?),
        "nanargmax" => t(np::nanargmax(a.a(0), a.axis(1))?),
        "nanargmin" => t(np::nanargmin(a.a(0), a.axis(1))?),
        "median" | "nanmedian" => {
            let (args, default) = reduce_args(a.axes(1), a.b(2), 0);
            let x = a.a(0);
            t(match (name, default) {
                ("median", true) => np::median(x)?,
                ("median", false) => np::median_with(x, args)?,
                (_, true) => np::nanmedian(x)?,
                (_, false) => np::nanmedian_with(x, args)?,
            })
        }
        "quantile" | "percentile" | "nanquantile" | "nanpercentile" => {
            let (args, default) = reduce_args(a.axes(2), a.b(3), 0);
            let (x, q) = (a.a(0), a.q(1));
            t(match (name, default) {
                ("quantile", true) => np::quantile(x, q)?,
                ("quantile", false) => np::quantile_with(x, q, args)?,
                ("percentile", true) => np::percentile(x, q)?,
                ("percentile", false) => np::percentile_with(x, q, args)?,
                ("nanquantile", true) => np::nanquantile(x, q)?,
                ("nanquantile", false) => np::nanquantile_with(x, q, args)?,
                (_, true) => np::nanpercentile(x, q)?,
                (_, false) => np::nanpercentile_with(x, q, args)?,
            })
        }
        "average" => {
            let w = match &a.0[2] {
                Arg::A(w) => Some(w.clone()),
                _ => None,
            };
            let axis = a.axes(1);
            t(if matches!(axis, Axes::All) && w.is_none() {
                np::average(a.a(0))?
            } else {
                np::average_with(a.a(0), axis, w.as_ref())?
            })
        }
        "cumsum" => t(np::cumsum(a.a(0), a.axis(1))?),
        "cumprod" => t(np::cumprod(a.a(0), a.axis(1))?),
        "nancumsum" => t(np::nancumsum(a.a(0), a.axis(1))?),
        "nancumprod" => t(np::nancumprod(a.a(0), a.axis(1))?),
        "diff" => t(np::diff(a.a(0), a.i(1) as usize, a.i(2) as isize)?),
        "zeros" => t(np::zeros(&a.shape(0), a.dtype(1))?),
        "ones" => t(np::ones(&a.shape(0), a.dtype(1))?),
        "empty" => t(np::empty(&a.shape(0), a.dtype(1))?),
        "full" => t(np::full(&a.shape(0), a.v(1), a.dtype(2))?),
        "zeros_like" => t(np::zeros_like(a.a(0), a.dtype(1))?),
        "ones_like" => t(np::ones_like(a.a(0), a.dtype(1))?),
        "empty_like" => t(np::empty_like(a.a(0), a.dtype(1))?),
        "full_like" => t(np::full_like(a.a(0), a.v(1), a.dtype(2))?),
        "eye" => t(np::eye(a.i(0) as usize)?),
        "real" => t(np::real(a.a(0))?),
        "imag" => t(np::imag(a.a(0))?),
        "conj" => t(np::conj(a.a(0))?),
        "conjugate" => t(np::conjugate(a.a(0))?),
        "angle" => t(np::angle(a.a(0))?),
        "angle_with" => t(np::angle_with(a.a(0), a.b(1))?),
        "iscomplex" => t(np::iscomplex(a.a(0))?),
        "isreal" => t(np::isreal(a.a(0))?),
        "iscomplexobj" => vec![Out::Bool(np::iscomplexobj(a.a(0))?)],
        "isrealobj" => vec![Out::Bool(np::isrealobj(a.a(0))?)],
        "fft.fft" => t(np::fft::fft(a.a(0))?),
        "fft.ifft" => t(np::fft::ifft(a.a(0))?),
        "fft.rfft" => t(np::fft::rfft(a.a(0))?),
        "fft.irfft" => t(np::fft::irfft(a.a(0))?),
        "fft.fft_with" | "fft.ifft_with" | "fft.rfft_with" | "fft.irfft_with" => {
            let norm = np::fft::Norm::parse(&a.s(3))?;
            let (x, n, axis) = (a.a(0), a.opt_usize(1), a.i(2) as isize);
            t(match name {
                "fft.fft_with" => np::fft::fft_with(x, n, axis, norm)?,
                "fft.ifft_with" => np::fft::ifft_with(x, n, axis, norm)?,
                "fft.rfft_with" => np::fft::rfft_with(x, n, axis, norm)?,
                _ => np::fft::irfft_with(x, n, axis, norm)?,
            })
        }
        "fft.fft2" => t(np::fft::fft2(a.a(0))?),
        "fft.ifft2" => t(np::fft::ifft2(a.a(0))?),
        "fft.fftfreq" => t(np::fft::fftfreq(a.i(0) as usize, a.f(1))?),
        "fft.rfftfreq" => t(np::fft::rfftfreq(a.i(0) as usize, a.f(1))?),
        "fft.fftshift" => t(np::fft::fftshift(a.a(0))?),
        "fft.ifftshift" => t(np::fft::ifftshift(a.a(0))?),
        "fft.fftshift_with" => t(np::fft::fftshift_with(a.a(0), a.axes(1))?),
        "fft.ifftshift_with" => t(np::fft::ifftshift_with(a.a(0), a.axes(1))?),
        "eye_with" => t(np::eye_with(
            a.i(0) as usize,
            a.opt_usize(1),
            a.i(2) as isize,
            a.dtype(3),
        )?),
        "identity" => t(np::identity(a.i(0) as usize, a.dtype(1))?),
        "arange" => t(np::arange(a.v(0), a.v(1), a.v(2), a.dtype(3))?),
        "linspace" => t(np::linspace(a.v(0), a.v(1), a.i(2) as usize)?),
        "logspace" => t(np::logspace(a.v(0), a.v(1), a.i(2) as usize)?),
        "geomspace" => t(np::geomspace(a.v(0), a.v(1), a.i(2) as usize)?),
        "linspace_with" => t(np::linspace_with(
            a.f(0),
            a.f(1),
            a.i(2) as usize,
            a.b(3),
            a.dtype(4),
        )?),
        "logspace_with" => t(np::logspace_with(
            a.f(0),
            a.f(1),
            a.i(2) as usize,
            a.b(3),
            a.f(4),
            a.dtype(5),
        )?),
        "geomspace_with" => t(np::geomspace_with(
            a.f(0),
            a.f(1),
            a.i(2) as usize,
            a.b(3),
            a.dtype(4),
        )?),
        "diag" => t(np::diag(a.a(0), a.i(1) as isize)?),
        "diagflat" => t(np::diagflat(a.a(0), a.i(1) as isize)?),
        "tri" => t(np::tri(
            a.i(0) as usize,
            a.opt_usize(1),
            a.i(2) as isize,
            a.dtype(3),
        )?),
        "tril" => t(np::tril(a.a(0), a.i(1) as isize)?),
        "triu" => t(np::triu(a.a(0), a.i(1) as isize)?),
        "meshgrid" => ts(np::meshgrid(&a.arrays(0), &a.s(1))?),
        "indices" => t(np::indices(&a.shape(0), a.dtype(1))?),
        "reshape" => t(np::reshape(a.a(0), &a.ints(1))?),
        "transpose" => t(np::transpose(a.a(0), a.axes(1))?),
        "swapaxes" => t(np::swapaxes(a.a(0), a.i(1) as isize, a.i(2) as isize)?),
        "moveaxis" => t(np::moveaxis(a.a(0), a.ints(1), a.ints(2))?),
        "expand_dims" => t(np::expand_dims(a.a(0), a.i(1) as isize)?),
        "squeeze" => t(np::squeeze(a.a(0), a.axis(1))?),
        "concatenate" => t(np::concatenate(&a.arrays(0), a.axis(1))?),
        "stack" => t(np::stack(&a.arrays(0), a.i(1) as isize)?),
        "hstack" => t(np::hstack(&a.arrays(0))?),
        "vstack" => t(np::vstack(&a.arrays(0))?),
        "dstack" => t(np::dstack(&a.arrays(0))?),
        "split" | "array_split" => {
            let sections: np::Sections = match &a.0[1] {
                Arg::I(n) => np::Sections::Count(*n as usize),
                _ => np::Sections::At(a.shape(1)),
            };
            if name == "split" {
                ts(np::split(a.a(0), sections, a.i(2) as isize)?)
            } else {
                ts(np::array_split(a.a(0), sections, a.i(2) as isize)?)
            }
        }
        "tile" => t(np::tile(a.a(0), &a.shape(1))?),
        "repeat" => t(np::repeat(a.a(0), a.v(1), a.axis(2))?),
        "broadcast_to" => t(np::broadcast_to(a.a(0), &a.shape(1))?),
        "broadcast_arrays" => ts(np::broadcast_arrays(&a.arrays(0))?),
        "flip" => t(np::flip(a.a(0), a.axes(1))?),
        "roll" => t(np::roll(a.a(0), a.i(1) as isize, a.axis(2))?),
        "rot90" => {
            let ax = a.ints(2);
            t(np::rot90(a.a(0), a.i(1) as isize, (ax[0], ax[1]))?)
        }
        "pad" => {
            let widths: Vec<(usize, usize)> = match &a.0[1] {
                Arg::Pairs(p) => p.iter().map(|(x, y)| (*x as usize, *y as usize)).collect(),
                other => panic!("pad widths {other:?}"),
            };
            t(np::pad(a.a(0), &widths, pad_mode(&a.s(2)))?)
        }
        "take" => t(np::take(a.a(0), a.a(1), a.axis(2))?),
        "take_along_axis" => t(np::take_along_axis(a.a(0), a.a(1), a.i(2) as isize)?),
        "where" => t(np::where_(a.v(0), a.v(1), a.v(2))?),
        "select" => t(np::select(&a.arrays(0), &a.arrays(1), a.v(2))?),
        "compress" => t(np::compress(a.a(0), a.a(1), a.axis(2))?),
        "tensordot" => {
            let axes: np::TensordotAxes = match &a.0[2] {
                Arg::I(n) => np::TensordotAxes::N(*n as usize),
                Arg::Pairs(p) => np::TensordotAxes::Pairs(
                    vec![p[0].0 as isize, p[0].1 as isize],
                    vec![p[1].0 as isize, p[1].1 as isize],
                ),
                other => panic!("tensordot axes {other:?}"),
            };
            t(np::tensordot(a.a(0), a.a(1), axes)?)
        }
        "einsum" => t(np::einsum(&a.s(0), &a.arrays(1))?),
        "cross" => t(np::cross(a.a(0), a.a(1), a.i(2) as isize)?),
        "trace_with" => t(np::trace_with(
            a.a(0),
            a.i(1) as isize,
            a.i(2) as isize,
            a.i(3) as isize,
        )?),
        "diagonal_with" => t(np::diagonal_with(
            a.a(0),
            a.i(1) as isize,
            a.i(2) as isize,
            a.i(3) as isize,
        )?),
        "sort" => t(np::sort(a.a(0), a.axis(1))?),
        "argsort" => t(np::argsort(a.a(0), a.axis(1))?),
        "searchsorted" => {
            let side = if a.s(2) == "left" {
                np::Side::Left
            } else {
                np::Side::Right
            };
            t(np::searchsorted(a.a(0), a.a(1), side)?)
        }
        "unique_all" => {
            let u = np::unique_all(a.a(0))?;
            // NumPy 2 returns the inverse in the input's shape, NumPy 1.x flattened
            let inverse = u.inverse.reshape_to(a.a(0).shape())?;
            ts(vec![u.values, u.indices, inverse, u.counts])
        }
        "nonzero" => ts(np::nonzero(a.a(0))?),
        "getitem" => {
            let ix = match &a.0[1] {
                Arg::Index(ix) => ix.clone(),
                other => panic!("index {other:?}"),
            };
            t(np::getitem(&a.a(0), &ix)?)
        }
        "linalg.inv" => t(linalg::inv(a.a(0))?),
        "linalg.det" => t(linalg::det(a.a(0))?),
        "linalg.solve" => t(linalg::solve(a.a(0), a.a(1))?),
        "linalg.svd" => {
            let (u, s, vh) = linalg::svd(a.a(0), a.b(1))?;
            ts(vec![u, s, vh])
        }
        "linalg.qr" => {
            let (q, r) = linalg::qr(a.a(0))?;
            ts(vec![q, r])
        }
        "linalg.cholesky" => t(linalg::cholesky(a.a(0))?),
        "linalg.eigh" => {
            let (w, v) = linalg::eigh(a.a(0))?;
            ts(vec![w, v])
        }
        "linalg.eigvalsh" => t(linalg::eigvalsh(a.a(0))?),
        "linalg.norm_with" => t(linalg::norm_with(a.a(0), a.norm_ord(1), a.axes(2), a.b(3))?),
        "linalg.matrix_power" => t(linalg::matrix_power(a.a(0), a.i(1))?),
        "linalg.pinv" => t(linalg::pinv(a.a(0), a.f(1))?),
        "linalg.lstsq" => {
            let r = linalg::lstsq(a.a(0), a.a(1), None)?;
            vec![
                Out::T(r.x),
                Out::T(r.residuals),
                Out::Int(r.rank as i64),
                Out::T(r.s),
            ]
        }
        "hsplit" | "vsplit" | "dsplit" => {
            let sections: np::Sections = match &a.0[1] {
                Arg::I(n) => np::Sections::Count(*n as usize),
                _ => np::Sections::At(a.shape(1)),
            };
            ts(match name {
                "hsplit" => np::hsplit(a.a(0), sections)?,
                "vsplit" => np::vsplit(a.a(0), sections)?,
                _ => np::dsplit(a.a(0), sections)?,
            })
        }
        "column_stack" => t(np::column_stack(&a.arrays(0))?),
        "append" => t(np::append(a.a(0), a.a(1), a.axis(2))?),
        "delete" => t(np::delete(a.a(0), a.a(1), a.axis(2))?),
        "rollaxis" => t(np::rollaxis(a.a(0), a.i(1) as isize, a.i(2) as isize)?),
        "extract" => t(np::extract(a.a(0), a.a(1))?),
        "ascontiguousarray" => t(np::ascontiguousarray(a.a(0))?),
        "copy" => t(np::copy(a.a(0))?),
        "broadcast_shapes" => {
            let shapes = match &a.0[0] {
                Arg::Shapes(s) => s.clone(),
                other => panic!("shapes {other:?}"),
            };
            let refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
            np::broadcast_shapes(&refs)?
                .into_iter()
                .map(|d| Out::Int(d as i64))
                .collect()
        }
        "array_equiv" => vec![Out::Bool(np::array_equiv(a.a(0), a.a(1))?)],
        "tril_indices" | "triu_indices" => {
            let f = if name == "tril_indices" {
                np::tril_indices
            } else {
                np::triu_indices
            };
            let (r, c) = f(a.i(0) as usize, a.i(1) as isize, a.opt_usize(2))?;
            ts(vec![r, c])
        }
        "tril_indices_from" => {
            let (r, c) = np::tril_indices_from(a.a(0), a.i(1) as isize)?;
            ts(vec![r, c])
        }
        "triu_indices_from" => {
            let (r, c) = np::triu_indices_from(a.a(0), a.i(1) as isize)?;
            ts(vec![r, c])
        }
        "diag_indices" => ts(np::diag_indices(a.i(0) as usize, a.i(1) as usize)?),
        "diag_indices_from" => ts(np::diag_indices_from(a.a(0))?),
        "vander" => t(np::vander(a.a(0), a.opt_usize(1), a.b(2))?),
        "nan_to_num" => {
            let opt = |i: usize| match &a.0[i] {
                Arg::None => None,
                _ => Some(a.f(i)),
            };
            t(np::nan_to_num(a.a(0), a.f(1), opt(2), opt(3))?)
        }
        "ediff1d" => t(np::ediff1d(a.a(0))?),
        "trapezoid" => {
            let x = match &a.0[1] {
                Arg::A(x) => Some(x.clone()),
                _ => None,
            };
            t(np::trapezoid(a.a(0), x.as_ref(), a.f(2), a.i(3) as isize)?)
        }
        "modf" => {
            let (f, i) = np::modf(a.a(0))?;
            ts(vec![f, i])
        }
        "ldexp" => t(np::ldexp(a.a(0), a.a(1))?),
        "unique_values" => t(np::unique_values(a.a(0))?),
        "unique_counts" => {
            let (v, c) = np::unique_counts(a.a(0))?;
            ts(vec![v, c])
        }
        "unique_inverse" => {
            let (v, i) = np::unique_inverse(a.a(0))?;
            ts(vec![v, i])
        }
        "digitize" => t(np::digitize(a.a(0), a.a(1), a.b(2))?),
        "bincount" => {
            let w = match &a.0[1] {
                Arg::A(w) => Some(w.clone()),
                _ => None,
            };
            t(np::bincount(a.a(0), w.as_ref(), a.i(2) as usize)?)
        }
        "histogram" => {
            let range = match &a.0[2] {
                Arg::Floats(r) => Some((r[0], r[1])),
                _ => None,
            };
            let (h, e) = np::histogram(a.a(0), a.i(1) as usize, range)?;
            ts(vec![h, e])
        }
        "interp" => {
            let opt = |i: usize| match &a.0[i] {
                Arg::None => None,
                _ => Some(a.f(i)),
            };
            t(np::interp(a.a(0), a.a(1), a.a(2), opt(3), opt(4))?)
        }
        "cov" if a.b(1) && matches!(a.0[2], Arg::None) => t(np::cov(a.a(0))?),
        "cov" | "cov_with" => t(np::cov_with(a.a(0), a.b(1), a.opt_usize(2))?),
        "average_with" => {
            let w = match &a.0[2] {
                Arg::A(w) => Some(w.clone()),
                _ => None,
            };
            t(np::average_with(a.a(0), a.axes(1), w.as_ref())?)
        }
        "corrcoef" => t(np::corrcoef(a.a(0), a.b(1))?),
        "load_npz" => ts(np::load_npz(dir.join(a.s(0)))?
            .into_iter()
            .map(|(_, t)| t)
            .collect()),
        _ => return Ok(None),
    }))
}

fn load(dir: &Path, j: &Json) -> Tensor {
    let f = j["a"].as_str().expect("file");
    let t = np::load(dir.join(f)).expect("npy");
    if j.get("view").and_then(Json::as_str) == Some("T") {
        np::transpose(&t, None).expect("view")
    } else {
        t
    }
}

fn parse_arg(dir: &Path, j: &Json) -> Arg {
    let o = j.as_object().expect("arg object");
    if o.contains_key("a") {
        return Arg::A(load(dir, j));
    }
    if let Some(v) = o.get("f") {
        return Arg::F(match v.as_str() {
            Some(s) => s.parse().expect("inf, -inf or nan"),
            None => v.as_f64().expect("f"),
        });
    }
    if let Some(v) = o.get("i") {
        return Arg::I(v.as_i64().expect("i"));
    }
    if let Some(v) = o.get("b") {
        return Arg::B(v.as_bool().expect("b"));
    }
    if let Some(v) = o.get("s") {
        return Arg::S(v.as_str().expect("s").to_string());
    }
    if o.contains_key("none") {
        return Arg::None;
    }
    if let Some(v) = o.get("ints") {
        return Arg::Ints(
            v.as_array()
                .expect("ints")
                .iter()
                .map(|x| x.as_i64().expect("int"))
                .collect(),
        );
    }
    if let Some(v) = o.get("floats") {
        return Arg::Floats(
            v.as_array()
                .expect("floats")
                .iter()
                .map(|x| x.as_f64().expect("float"))
                .collect(),
        );
    }
    if let Some(v) = o.get("arrays") {
        return Arg::Arrays(
            v.as_array()
                .expect("arrays")
                .iter()
                .map(|f| np::load(dir.join(f.as_str().expect("file"))).expect("npy"))
                .collect(),
        );
    }
    if let Some(v) = o.get("pairs") {
        return Arg::Pairs(
            v.as_array()
                .expect("pairs")
                .iter()
                .map(|p| (p[0].as_i64().expect("p"), p[1].as_i64().expect("p")))
                .collect(),
        );
    }
    if let Some(v) = o.get("shapes") {
        return Arg::Shapes(
            v.as_array()
                .expect("shapes")
                .iter()
                .map(|s| {
                    s.as_array()
                        .expect("shape")
                        .iter()
                        .map(|d| d.as_u64().expect("dim") as usize)
                        .collect()
                })
                .collect(),
        );
    }
    if let Some(v) = o.get("index") {
        let items = v
            .as_array()
            .expect("index")
            .iter()
            .map(|it| {
                if let Some(i) = it.get("int") {
                    Index::Int(i.as_i64().expect("int") as isize)
                } else if let Some(s) = it.get("slice") {
                    let g = |k: usize| s[k].as_i64().map(|v| v as isize);
                    Index::Slice {
                        start: g(0),
                        stop: g(1),
                        step: g(2).unwrap_or(1),
                    }
                } else if it.get("ellipsis").is_some() {
                    Index::Ellipsis
                } else if it.get("newaxis").is_some() {
                    Index::NewAxis
                } else {
                    Index::Array(load(dir, it))
                }
            })
            .collect();
        return Arg::Index(items);
    }
    panic!("unknown argument encoding {j}")
}

/// NumPy's dtype as ferroflow holds it (types ferroflow lacks widen).
fn expected_dtype(d: DType) -> DType {
    d
}

fn tolerance(d: DType) -> (f64, f64) {
    match d {
        DType::F64 => (1e-7, 1e-9),
        DType::F32 => (1e-4, 1e-5),
        DType::F16 | DType::BF16 => (2e-3, 2e-3),
        _ => (0.0, 0.0),
    }
}

fn compare(
    got: &Tensor,
    want: &Tensor,
    tol: Option<(f64, f64)>,
    abs: bool,
) -> std::result::Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?}, NumPy {:?}", got.shape(), want.shape()));
    }
    if got.dtype() != expected_dtype(want.dtype()) {
        return Err(format!("dtype {}, NumPy {}", got.dtype(), want.dtype()));
    }
    if want.dtype().is_complex() {
        // each part within the tolerance of the part type, relative to the modulus
        let (rtol, atol) = tol.unwrap_or_else(|| tolerance(want.dtype().real_dtype()));
        let parts = |t: &Tensor| -> std::result::Result<Vec<(f64, f64)>, String> {
            let re = t
                .real()
                .and_then(|r| r.to_f64_vec())
                .map_err(|e| e.to_string())?;
            let im = t
                .imag()
                .and_then(|r| r.to_f64_vec())
                .map_err(|e| e.to_string())?;
            Ok(re.into_iter().zip(im).collect())
        };
        for (i, (x, y)) in parts(got)?.iter().zip(parts(want)?).enumerate() {
            let err = (x.0 - y.0).hypot(x.1 - y.1);
            if !(err <= atol + rtol * y.0.hypot(y.1) || (x.0.is_nan() && y.0.is_nan())) {
                return Err(format!(
                    "element {i}: {x:?}, NumPy {y:?} (rtol {rtol}, atol {atol})"
                ));
            }
        }
        return Ok(());
    }
    if want.dtype() == DType::I64 {
        // exact, beyond the integers f64 holds
        let (g, w) = (
            got.to_vec::<i64>().map_err(|e| e.to_string())?,
            want.to_vec::<i64>().map_err(|e| e.to_string())?,
        );
        return match g.iter().zip(&w).position(|(x, y)| x != y) {
            None => Ok(()),
            Some(i) => Err(format!("element {i}: {}, NumPy {}", g[i], w[i])),
        };
    }
    let (rtol, atol) = tol.unwrap_or_else(|| tolerance(want.dtype()));
    let g = got.to_f64_vec().map_err(|e| e.to_string())?;
    let w = want.to_f64_vec().map_err(|e| e.to_string())?;
    for (i, (x, y)) in g.iter().zip(&w).enumerate() {
        let (x, y) = if abs { (x.abs(), y.abs()) } else { (*x, *y) };
        let same = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= atol + rtol * y.abs();
        if !same {
            return Err(format!(
                "element {i}: {x}, NumPy {y} (rtol {rtol}, atol {atol})"
            ));
        }
    }
    Ok(())
}

fn run_case(dir: &Path, case: &Json) -> std::result::Result<String, String> {
    let name = case["fn"].as_str().expect("fn");
    let args: Vec<Arg> = case["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|j| parse_arg(dir, j))
        .collect();
    let result = call(name, &Args(&args), dir);
    if let Some(err) = case.get("error") {
        return match result {
            Err(e) => Ok(format!("error as NumPy's {err}: {e}")),
            Ok(None) => Err(format!("{name} is not in the test table")),
            Ok(Some(_)) => Err(format!("returned a value where NumPy raised {err}")),
        };
    }
    let outs = match result {
        Ok(Some(o)) => o,
        Ok(None) => return Err(format!("{name} is not in the test table")),
        Err(e) => return Err(format!("error where NumPy returned a value: {e}")),
    };
    let want = case["out"].as_array().expect("out");
    if outs.len() != want.len() {
        return Err(format!("{} outputs, NumPy {}", outs.len(), want.len()));
    }
    let tol = case
        .get("tol")
        .map(|t| (t[0].as_f64().expect("rtol"), t[1].as_f64().expect("atol")));
    let abs = case["cmp"].as_str() == Some("abs");
    for (k, (o, w)) in outs.iter().zip(want).enumerate() {
        let r = match (o, w) {
            (Out::T(g), w) if w.get("a").is_some() => compare(g, &load(dir, w), tol, abs),
            (Out::T(g), w) if w.get("int").is_some() => {
                let v = g
                    .cast(DType::I64)
                    .and_then(|x| x.item::<i64>())
                    .map_err(|e| e.to_string())?;
                if v == w["int"].as_i64().expect("int") {
                    Ok(())
                } else {
                    Err(format!("{v}, NumPy {}", w["int"]))
                }
            }
            (Out::Bool(b), w) if w.get("bool").is_some() => {
                if Some(*b) == w["bool"].as_bool() {
                    Ok(())
                } else {
                    Err(format!("{b}, NumPy {}", w["bool"]))
                }
            }
            (Out::Int(v), w) if w.get("a").is_some() => {
                let n = load(dir, w)
                    .cast(DType::I64)
                    .and_then(|x| x.item::<i64>())
                    .map_err(|e| e.to_string())?;
                if *v == n {
                    Ok(())
                } else {
                    Err(format!("{v}, NumPy {n}"))
                }
            }
            (Out::Int(v), w) if w.get("int").is_some() => {
                if Some(*v) == w["int"].as_i64() {
                    Ok(())
                } else {
                    Err(format!("{v}, NumPy {}", w["int"]))
                }
            }
            _ => Err(format!("output kind differs from NumPy's {w}")),
        };
        r.map_err(|e| format!("output {k}: {e}"))?;
    }
    Ok(String::new())
}

#[test]
fn every_function_agrees_with_numpy() {
    ferroflow::init();
    let Some(dir) = numpy_dir("numpy-cases") else {
        return;
    };
    let text = std::fs::read_to_string(dir.join("cases.json")).expect("cases.json");
    let doc: Json = serde_json::from_str(&text).expect("json");
    let cases = doc["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    let mut exercised = BTreeSet::new();
    for (i, case) in cases.iter().enumerate() {
        let name = case["fn"].as_str().expect("fn").to_string();
        match run_case(&dir, case) {
            Ok(_) => {
                exercised.insert(name.trim_end_matches('_').to_string());
                exercised.insert(name);
            }
            Err(e) => failures.push(format!("case {i} {name}: {e}")),
        }
    }
    eprintln!(
        "{} NumPy {} cases, {} failures",
        cases.len(),
        doc["numpy"],
        failures.len()
    );
    for f in &failures {
        eprintln!("  {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from NumPy",
        failures.len(),
        cases.len()
    );
    // every public function of the NumPy modules ran against NumPy (random numbers, files,
    // interop and dtype helpers have their own tests below and in tests/numpy_api.rs)
    const ELSEWHERE: &[&str] = &["random", "io", "interop", "dtypes", "array", "step"];
    let public = common::public_functions();
    assert!(
        public.len() > 200,
        "the source scan found only {} functions",
        public.len()
    );
    let missing: Vec<String> = public
        .into_iter()
        .filter(|(f, module)| !ELSEWHERE.iter().any(|m| module == m || f == m))
        .map(|(f, _)| f)
        .filter(|f| !exercised.contains(f.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "functions without a NumPy case: {missing:?}"
    );
}

#[test]
fn files_written_here_load_in_numpy() {
    ferroflow::init();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("npz-out");
    std::fs::create_dir_all(&dir).expect("dir");
    let x = np::reshape(np::arange(0, 12, 1, None).expect("arange"), &[3, 4]).expect("reshape");
    let y = np::asarray([[1.5f32, -2.0], [0.25, 8.0]]).expect("y");
    let m = np::greater(&x, 5).expect("mask");
    np::savez(dir.join("s.npz"), &[("x", &x), ("y", &y), ("m", &m)]).expect("savez");
    np::savez_compressed(dir.join("c.npz"), &[("x", &x), ("y", &y), ("m", &m)])
        .expect("savez_compressed");
    np::save(dir.join("y.npy"), &y).expect("save");
    for f in ["s.npz", "c.npz"] {
        let back = np::load_npz(dir.join(f)).expect("load_npz");
        assert_eq!(back.len(), 3);
        assert_eq!(
            back.array("x").expect("x").to_vec::<i64>().expect("x"),
            x.to_vec::<i64>().expect("x")
        );
        assert_eq!(
            back.array("m").expect("m").to_vec::<bool>().expect("m"),
            m.to_vec::<bool>().expect("m")
        );
    }
    let script = format!(
        "import numpy as np\nd = {:?}\nfor f in ['s.npz', 'c.npz']:\n    z = np.load(d + '/' + f)\n    assert z['x'].dtype == np.int64 and z['x'].tolist() == np.arange(12).reshape(3, 4).tolist()\n    assert z['y'].dtype == np.float32 and z['y'].tolist() == [[1.5, -2.0], [0.25, 8.0]]\n    assert z['m'].dtype == np.bool_ and z['m'].tolist() == (np.arange(12).reshape(3, 4) > 5).tolist()\nassert np.load(d + '/y.npy').tolist() == [[1.5, -2.0], [0.25, 8.0]]\nprint('ok')\n",
        dir.display().to_string()
    );
    if have_numpy() {
        let o = Command::new("python3")
            .arg("-c")
            .arg(&script)
            .output()
            .expect("python3");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("ok"),
            "NumPy could not read our files: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // a corrupt archive is an error naming the file, not a panic
    std::fs::write(dir.join("bad.npz"), b"PK\x03\x04garbage").expect("write");
    let e = np::load_npz(dir.join("bad.npz")).expect_err("corrupt");
    assert!(e.to_string().contains("bad.npz"), "{e}");
}
