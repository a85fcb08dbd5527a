//! Elementwise binary kernels. Both operands arrive with the output's shape (broadcast axes
//! have stride 0), so one strided loop serves every broadcast; dense and scalar cases take
//! vectorised fast paths.

use super::complex;
use crate::buffer::{dense, half_chunked, host, narrow, widen, widen_range, Half};
use crate::num::{FloatMath, IntOps, Num};
use crate::simd::{fill_rows, map, map_chunk, zip, zip_chunk, zip_rows};
use ferroflow_tensor::{
    backend::unsupported, BinaryOp, Element, Error, HostData, Layout, Operand, Result,
};
use std::mem::MaybeUninit;

/// `f(a[i], b[i])` over two equally shaped strided views.
pub(crate) fn apply<T, U, F>(a: &[T], la: &Layout, b: &[T], lb: &Layout, f: F) -> Vec<U>
where
    T: Element,
    U: Copy + Default + Send + Sync,
    F: Fn(T, T) -> U + Sync,
{
    let n = la.num_elements();
    if let (Some((oa, _)), Some((ob, _))) = (la.contiguous_range(), lb.contiguous_range()) {
        return zip(&a[oa..oa + n], &b[ob..ob + n], f);
    }
    if n > 0 && lb.is_scalar_broadcast() {
        if let Some((oa, _)) = la.contiguous_range() {
            let s = b[lb.offset()];
            return map(&a[oa..oa + n], |x| f(x, s));
        }
    }
    if n > 0 && la.is_scalar_broadcast() {
        if let Some((ob, _)) = lb.contiguous_range() {
            let s = a[la.offset()];
            return map(&b[ob..ob + n], |y| f(s, y));
        }
    }
    if let Some(v) = row_broadcast(a, la, b, lb, &f) {
        return v;
    }
    if n == 0 {
        return Vec::new();
    }
    let rank = la.rank();
    let inner = la.shape()[rank - 1];
    if inner == 0 {
        return Vec::new();
    }
    let (sa, sb) = (la.strides()[rank - 1], lb.strides()[rank - 1]);
    let outer_shape = &la.shape()[..rank - 1];
    let row = |r: usize, o: &mut [MaybeUninit<U>]| {
        // Unravel row r into the base offsets of both operands.
        let (mut pa, mut pb) = (la.offset() as isize, lb.offset() as isize);
        let mut rem = r;
        for ax in (0..rank - 1).rev() {
            let i = rem % outer_shape[ax];
            rem /= outer_shape[ax];
            pa += i as isize * la.strides()[ax];
            pb += i as isize * lb.strides()[ax];
        }
        let (pa, pb) = (pa as usize, pb as usize);
        match (sa, sb) {
            (1, 1) => zip_chunk(&a[pa..pa + inner], &b[pb..pb + inner], o, &f),
            (1, 0) => {
                let y = b[pb];
                map_chunk(&a[pa..pa + inner], o, &|x| f(x, y));
            }
            (0, 1) => {
                // An outer product's row: one value of `a` against a row of `b`.
                let x = a[pa];
                map_chunk(&b[pb..pb + inner], o, &|y| f(x, y));
            }
            _ => {
                for (j, d) in o.iter_mut().enumerate() {
                    let (ia, ib) = (pa as isize + j as isize * sa, pb as isize + j as isize * sb);
                    d.write(f(a[ia as usize], b[ib as usize]));
                }
            }
        }
    };
    fill_rows(n / inner, inner, row)
}

/// `a` dense and `b` a vector along the last axis broadcast over the others (a bias), or the
/// other way round: [`zip_rows`].
fn row_broadcast<T, U, F>(a: &[T], la: &Layout, b: &[T], lb: &Layout, f: &F) -> Option<Vec<U>>
where
    T: Element,
    U: Copy + Default + Send + Sync,
    F: Fn(T, T) -> U + Sync,
{
    /// The last-axis vector a broadcast layout reads, if that is what it is.
    fn row_of<'a, T>(v: &'a [T], l: &Layout) -> Option<&'a [T]> {
        let rank = l.rank();
        let width = *l.shape().last()?;
        let leading_broadcast = l.strides()[..rank - 1]
            .iter()
            .zip(&l.shape()[..rank - 1])
            .all(|(&s, &d)| s == 0 || d == 1);
        (width > 1 && l.strides()[rank - 1] == 1 && leading_broadcast)
            .then(|| &v[l.offset()..l.offset() + width])
    }
    let n = la.num_elements();
    if n == 0 || la.rank() < 2 {
        return None;
    }
    if let (Some((oa, _)), Some(row)) = (la.contiguous_range(), row_of(b, lb)) {
        return Some(zip_rows(&a[oa..oa + n], row, f));
    }
    if let (Some(row), Some((ob, _))) = (row_of(a, la), lb.contiguous_range()) {
        return Some(zip_rows(&b[ob..ob + n], row, |y, x| f(x, y)));
    }
    None
}

/// The second operand of a chunked half-precision op.
enum HalfRhs<'a, H> {
    /// Dense, the same shape as the first.
    Same(&'a [H]),
    /// One value broadcast.
    Scalar(f32),
    /// A vector along the last axis, broadcast over the others (a bias).
    Row(Vec<f32>),
}

/// A binary op on half-precision data without widening whole buffers: comparisons run on
/// the half values themselves; arithmetic runs chunk by chunk in f32 when the first operand
/// is dense and the second dense, a scalar or a last-axis vector. `None`: the general path.
fn binary_half<H: Half + Element + PartialOrd>(
    op: BinaryOp,
    a: &[H],
    la: &Layout,
    b: &[H],
    lb: &Layout,
) -> Option<HostData> {
    if let Some(c) = compare(op, a, la, b, lb) {
        return Some(c);
    }
    let (oa, n) = la.contiguous_range()?;
    let a = &a[oa..oa + n];
    let rank = la.rank();
    let rhs = if let Some((ob, _)) = lb.contiguous_range() {
        HalfRhs::Same(&b[ob..ob + n])
    } else if lb.is_scalar_broadcast() {
        HalfRhs::Scalar(widen_range(b, lb.offset(), lb.offset() + 1)[0])
    } else if rank >= 1
        && lb.strides()[rank - 1] == 1
        && lb.strides()[..rank - 1].iter().all(|&s| s == 0)
    {
        let c = lb.shape()[rank - 1];
        HalfRhs::Row(widen_range(b, lb.offset(), lb.offset() + c))
    } else {
        return None;
    };
    let align = match &rhs {
        HalfRhs::Row(r) => r.len(),
        _ => 1,
    };
    if n == 0 || align == 0 {
        return None;
    }
    let out = half_chunked::<H>(n, align, |s, e| {
        let (len, x) = (e - s, widen_range(a, s, e));
        let result = match &rhs {
            HalfRhs::Same(bs) => binary_float::<f32>(
                op,
                &x,
                &Layout::contiguous(&[len]),
                &widen_range(bs, s, e),
                &Layout::contiguous(&[len]),
            ),
            HalfRhs::Scalar(v) => binary_float::<f32>(
                op,
                &x,
                &Layout::contiguous(&[len]),
                &[*v],
                &Layout::new(vec![len], vec![0], 0),
            ),
            HalfRhs::Row(r) => {
                let rows = len / r.len();
                binary_float::<f32>(
                    op,
                    &x,
                    &Layout::contiguous(&[rows, r.len()]),
                    r,
                    &Layout::new(vec![rows, r.len()], vec![0, 1], 0),
                )
            }
        };
        match result {
            HostData::F32(v) => v,
            _ => unreachable!("comparisons returned above; arithmetic keeps f32"),
        }
    });
    Some(H::host(out))
}

pub(crate) fn binary(op: BinaryOp, a: Operand<'_>, b: Operand<'_>) -> Result<HostData> {
    let (da, db) = (host(&a)?, host(&b)?);
    let (la, lb) = (a.layout, b.layout);
    match (op, da, db) {
        (BinaryOp::Complex, HostData::F32(x), HostData::F32(y)) => {
            return Ok(complex::make(x, la, y, lb))
        }
        (BinaryOp::Complex, HostData::F64(x), HostData::F64(y)) => {
            return Ok(complex::make(x, la, y, lb))
        }
        (BinaryOp::Complex, ..) => return Err(unsupported("cpu", op.name(), a.dtype)),
        (_, HostData::C64(x), HostData::C64(y)) => return complex::binary(op, x, la, y, lb),
        (_, HostData::C128(x), HostData::C128(y)) => return complex::binary(op, x, la, y, lb),
        _ => {}
    }
    let chunked = match (da, db) {
        (HostData::F16(x), HostData::F16(y)) => binary_half(op, x, la, y, lb),
        (HostData::BF16(x), HostData::BF16(y)) => binary_half(op, x, la, y, lb),
        _ => None,
    };
    if let Some(out) = chunked {
        return Ok(out);
    }
    if let (Some(wa), Some(wb)) = (widen(da), widen(db)) {
        return Ok(match binary_float::<f32>(op, &wa, la, &wb, lb) {
            HostData::F32(v) => narrow(v, a.dtype),
            other => other,
        });
    }
    Ok(match (da, db) {
        (HostData::F32(x), HostData::F32(y)) => binary_float(op, x, la, y, lb),
        (HostData::F64(x), HostData::F64(y)) => binary_float(op, x, la, y, lb),
        (HostData::I8(x), HostData::I8(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::I32(x), HostData::I32(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::I64(x), HostData::I64(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::U8(x), HostData::U8(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::I16(x), HostData::I16(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::U16(x), HostData::U16(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::U32(x), HostData::U32(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::U64(x), HostData::U64(y)) => binary_int(op, x, la, y, lb)?,
        (HostData::Bool(x), HostData::Bool(y)) => {
            let f = match op {
                BinaryOp::LogicalAnd => |p: bool, q: bool| p & q,
                BinaryOp::LogicalOr => |p: bool, q: bool| p | q,
                BinaryOp::LogicalXor | BinaryOp::NotEqual => |p: bool, q: bool| p ^ q,
                BinaryOp::Equal => |p: bool, q: bool| p == q,
                _ => return Err(unsupported("cpu", op.name(), a.dtype)),
            };
            HostData::Bool(apply(x, la, y, lb, f))
        }
        _ => return Err(unsupported("cpu", op.name(), a.dtype)),
    })
}

fn compare<T: Element + PartialOrd>(
    op: BinaryOp,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
) -> Option<HostData> {
    use BinaryOp::*;
    Some(HostData::Bool(match op {
        Equal => apply(a, la, b, lb, |x, y| x == y),
        NotEqual => apply(a, la, b, lb, |x, y| x != y),
        Less => apply(a, la, b, lb, |x, y| x < y),
        LessEqual => apply(a, la, b, lb, |x, y| x <= y),
        Greater => apply(a, la, b, lb, |x, y| x > y),
        GreaterEqual => apply(a, la, b, lb, |x, y| x >= y),
        _ => return None,
    }))
}

pub(crate) fn binary_float<T: FloatMath>(
    op: BinaryOp,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
) -> HostData {
    use BinaryOp::*;
    if let Some(c) = compare(op, a, la, b, lb) {
        return c;
    }
    let v: Vec<T> = match op {
        Add => apply(a, la, b, lb, |x: T, y: T| x + y),
        Sub => apply(a, la, b, lb, |x: T, y: T| x - y),
        Mul => apply(a, la, b, lb, |x: T, y: T| x * y),
        Div => apply(a, la, b, lb, |x: T, y: T| x / y),
        FloorDiv => apply(a, la, b, lb, |x: T, y: T| (x / y).floor()),
        FloorMod => apply(a, la, b, lb, |x: T, y: T| {
            let r = x % y;
            if r != T::ZERO && ((r < T::ZERO) != (y < T::ZERO)) {
                r + y
            } else {
                r
            }
        }),
        Pow => apply(a, la, b, lb, |x: T, y: T| x.powf(y)),
        Maximum => apply(
            a,
            la,
            b,
            lb,
            |x: T, y: T| if (x > y) | x.isnan() { x } else { y },
        ),
        Minimum => apply(
            a,
            la,
            b,
            lb,
            |x: T, y: T| if (x < y) | x.isnan() { x } else { y },
        ),
        SquaredDifference => apply(a, la, b, lb, |x: T, y: T| (x - y) * (x - y)),
        Atan2 => apply(a, la, b, lb, |x: T, y: T| x.atan2(y)),
        // x · [y > 0] (a product, so a NaN gradient stays NaN as in `g * (x > 0)`)
        ReluGrad => apply(a, la, b, lb, |x: T, y: T| {
            x * if y > T::ZERO { T::ONE } else { T::ZERO }
        }),
        // Comparisons returned above; logical ops never reach a float kernel.
        _ => return HostData::F32(vec![]),
    };
    T::into_host(v)
}

fn any_zero<T: Num>(b: &[T], lb: &Layout) -> bool {
    dense(b, lb).contains(&T::ZERO)
}

fn binary_int<T: IntOps + Sync + Send>(
    op: BinaryOp,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
) -> Result<HostData> {
    use BinaryOp::*;
    if let Some(c) = compare(op, a, la, b, lb) {
        return Ok(c);
    }
    if matches!(op, Div | FloorDiv | FloorMod) && any_zero(b, lb) {
        return Err(Error::Arithmetic {
            op: op.name(),
            msg: "integer division by zero",
        });
    }
    if op == Pow && dense(b, lb).iter().any(|&v| v.is_negative()) {
        return Err(Error::Arithmetic {
            op: "pow",
            msg: "integers to negative integer powers are not allowed",
        });
    }
    let v: Vec<T> = match op {
        Add => apply(a, la, b, lb, |x: T, y: T| x.wadd(y)),
        Sub => apply(a, la, b, lb, |x: T, y: T| x.wsub(y)),
        Mul => apply(a, la, b, lb, |x: T, y: T| x.wmul(y)),
        Div => apply(a, la, b, lb, |x: T, y: T| x.trunc_div(y)),
        FloorDiv => apply(a, la, b, lb, |x: T, y: T| x.floor_div(y)),
        FloorMod => apply(a, la, b, lb, |x: T, y: T| x.floor_mod(y)),
        Pow => apply(a, la, b, lb, |x: T, y: T| x.wrapping_pow_of(y)),
        Maximum => apply(a, la, b, lb, |x: T, y: T| if x > y { x } else { y }),
        Minimum => apply(a, la, b, lb, |x: T, y: T| if x < y { x } else { y }),
        SquaredDifference => apply(a, la, b, lb, |x: T, y: T| {
            let d = x.wsub(y);
            d.wmul(d)
        }),
        _ => return Err(unsupported("cpu", op.name(), T::DTYPE)),
    };
    Ok(T::into_host(v))
}
