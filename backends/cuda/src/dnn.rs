//! Float convolutions and pooling through NVIDIA's cuDNN 9, loaded at run time when its
//! library is there (`libcudnn.so.9`): the convolution's forward product and both
//! gradients, NHWC, with the algorithm picked once per shape by cuDNN's own timing
//! (`cudnnFind…Algorithm`, TF's autotuning) within [`crate::convolution_workspace_limit`];
//! max and average pooling forward. Where cuDNN is missing, turned off
//! ([`crate::set_cudnn_enabled`]) or refuses a shape, the backend's own kernels run (im2col
//! and cuBLAS, or the direct loops; the pooling kernels), so nothing depends on it.
//!
//! cuDNN pads both sides of an axis alike; TensorFlow's `SAME` puts the odd row of padding
//! after. [`ConvGeometry::of`] says how many rows and columns of zeros to append to the
//! input first (the windows then start where TF's do and cover the same values); pooling
//! with such padding stays on the backend's kernels (appended zeros would enter a maximum
//! or a mean).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cudnn::sys;
use ferroflow_tensor::{DType, Error, HostData, PoolKind, Result, Window2d};

use crate::BACKEND;

/// What cuDNN is asked to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum DnnOp {
    /// `y = conv(x, filter)`.
    Conv2d,
    /// The input's gradient from the filter and the output's gradient.
    Conv2dBackpropInput,
    /// The filter's gradient from the input and the output's gradient.
    Conv2dBackpropFilter,
    /// Max or average pooling (the geometry's `filters` are the input's channels).
    Pool(PoolKind),
}

/// A convolution as cuDNN runs it: the input `[n, h, w, c]` (NHWC, dense, already extended
/// by the zeros [`ConvGeometry::of`] asks for), the filter `[k, kh, kw, c]` (KRSC, dense),
/// the output `[n, oh, ow, k]` (dense), the same padding on both sides of an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConvGeometry {
    pub(crate) input: [usize; 4],
    pub(crate) filters: usize,
    pub(crate) kernel: [usize; 2],
    pub(crate) pad: [usize; 2],
    pub(crate) strides: [usize; 2],
    pub(crate) dilations: [usize; 2],
    pub(crate) output: [usize; 2],
}

impl ConvGeometry {
    /// Window `w` with `filters` output channels in cuDNN's terms, with the rows and
    /// columns of zeros to append to the input (TF pads `SAME` by one more after than
    /// before where the total is odd; cuDNN pads both sides by `pad_before`, so the extra
    /// row goes into the input). `None` where cuDNN cannot run it: an empty tensor, a size
    /// past its 32-bit integers, or padding after smaller than before (explicit padding).
    pub(crate) fn of(w: &Window2d, filters: usize) -> Option<(ConvGeometry, [usize; 2])> {
        let mut input = w.input;
        let mut extra = [0; 2];
        for a in 0..2 {
            let span = (w.kernel[a].checked_sub(1)?)
                .checked_mul(w.dilations[a])?
                .checked_add(1)?;
            // The last window ends `span` past its start, `(out - 1) · stride` from the
            // first, which starts `pad_before` before the input.
            let end = w.output[a]
                .checked_sub(1)?
                .checked_mul(w.strides[a])?
                .checked_add(span)?;
            let padded = w.input[1 + a].checked_add(w.pad_before[a].checked_mul(2)?)?;
            extra[a] = end.saturating_sub(padded);
            input[1 + a] = input[1 + a].checked_add(extra[a])?;
            // cuDNN's output count with symmetric padding must be ours, window for window.
            let reach = padded.checked_add(extra[a])?;
            if reach.checked_sub(span)?.checked_div(w.strides[a])? + 1 != w.output[a] {
                return None;
            }
        }
        let geometry = ConvGeometry {
            input,
            filters,
            kernel: w.kernel,
            pad: w.pad_before,
            strides: w.strides,
            dilations: w.dilations,
            output: w.output,
        };
        let int = |v: usize| v > 0 && v <= i32::MAX as usize;
        let elements = |dims: &[usize]| {
            dims.iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .is_some_and(int)
        };
        let [n, h, wd, c] = input;
        let sizes_fit = [n, h, wd, c, filters]
            .into_iter()
            .chain(w.kernel)
            .chain(w.pad_before)
            .chain(w.strides)
            .chain(w.dilations)
            .chain(w.output)
            .all(|v| v <= i32::MAX as usize)
            && elements(&input)
            && elements(&[filters, w.kernel[0], w.kernel[1], c])
            && elements(&[n, w.output[0], w.output[1], filters]);
        sizes_fit.then_some((geometry, extra))
    }

    /// The output's (forward) or the output gradient's dims `[n, oh, ow, k]`.
    pub(crate) fn output_dims(&self) -> [usize; 4] {
        [self.input[0], self.output[0], self.output[1], self.filters]
    }

    /// The filter's dims in cuDNN's order, `[k, kh, kw, c]`.
    pub(crate) fn filter_dims(&self) -> [usize; 4] {
        [self.filters, self.kernel[0], self.kernel[1], self.input[3]]
    }
}

/// A plan's outcome: cuDNN's algorithm number and workspace bytes, or why it refused.
pub(crate) type PlanOutcome = std::result::Result<(u32, usize), String>;

/// What a plan is cached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DnnKey {
    pub(crate) op: DnnOp,
    pub(crate) dtype: DType,
    /// TensorFloat-32 allowed (float32 with the switch on; tensor cores take it on compute
    /// capability ≥ 8.0).
    pub(crate) tf32: bool,
    /// Only algorithms whose results do not vary from run to run ([`deterministic_ops`]).
    pub(crate) deterministic: bool,
    /// Algorithms timed by cuDNN rather than ranked by its heuristics ([`autotune`]).
    pub(crate) autotune: bool,
    pub(crate) geometry: ConvGeometry,
}

/// One convolution's or pooling's descriptors (and a convolution's algorithm), made once
/// per [`DnnKey`].
pub(crate) struct Plan {
    key: DnnKey,
    /// cuDNN's descriptors; `None` for the host emulation's stand-in ([`host_stand_in`]).
    descriptors: Option<Descriptors>,
    algo: u32,
    /// Workspace bytes the algorithm asks for.
    pub(crate) workspace: usize,
}

enum Descriptors {
    Conv {
        x: TensorDesc,
        w: FilterDesc,
        y: TensorDesc,
        conv: ConvDesc,
    },
    Pool {
        x: TensorDesc,
        y: TensorDesc,
        pool: PoolDesc,
    },
}

impl Plan {
    /// The plan of the host emulation's stand-in for cuDNN ([`host_stand_in`]).
    pub(crate) fn host(key: DnnKey) -> Plan {
        Plan {
            key,
            descriptors: None,
            algo: 0,
            workspace: 0,
        }
    }

    /// The bytes of the operands `a`, `b` and `out` of [`Dnn::run`] for this plan.
    pub(crate) fn operand_bytes(&self) -> [usize; 3] {
        let g = &self.key.geometry;
        let size = self.key.dtype.size_in_bytes();
        let [x, w, y] =
            [g.input, g.filter_dims(), g.output_dims()].map(|d| d.iter().product::<usize>() * size);
        match self.key.op {
            DnnOp::Conv2d => [x, w, y],
            DnnOp::Conv2dBackpropInput => [w, y, x],
            DnnOp::Conv2dBackpropFilter => [x, y, w],
            DnnOp::Pool(_) => [x, 0, y],
        }
    }
}

/// cuDNN's handle on one device and its plans.
pub(crate) struct Dnn {
    handle: Mutex<Handle>,
    /// `cuDNN 9.x.y`.
    pub(crate) version: String,
    plans: Mutex<HashMap<DnnKey, std::result::Result<Arc<Plan>, String>>>,
}

struct Handle(sys::cudnnHandle_t);
// SAFETY: the handle is used under `Dnn::handle`'s lock only, one thread at a time (cuDNN
// handles may move between threads, not be used by two at once).
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: made by cudnnCreate, destroyed once.
        unsafe { sys::cudnnDestroy(self.0) };
    }
}

macro_rules! descriptor {
    ($name:ident, $raw:ty, $destroy:ident) => {
        struct $name($raw);
        // SAFETY: set once when the plan is made, then only read by cuDNN's calls.
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: made by the matching create call, destroyed once.
                unsafe { sys::$destroy(self.0) };
            }
        }
    };
}
descriptor!(
    TensorDesc,
    sys::cudnnTensorDescriptor_t,
    cudnnDestroyTensorDescriptor
);
descriptor!(
    FilterDesc,
    sys::cudnnFilterDescriptor_t,
    cudnnDestroyFilterDescriptor
);
descriptor!(
    PoolDesc,
    sys::cudnnPoolingDescriptor_t,
    cudnnDestroyPoolingDescriptor
);
descriptor!(
    ConvDesc,
    sys::cudnnConvolutionDescriptor_t,
    cudnnDestroyConvolutionDescriptor
);

/// The algorithm-performance record of all three `Find` calls, with plain integers where
/// the bindings have enums (a newer cuDNN may report values they do not list).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AlgoPerf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [i32; 3],
}

// The record's layout is each of cuDNN's three (checked at compile time).
const _: () = {
    use std::mem::{align_of, size_of};
    assert!(size_of::<AlgoPerf>() == size_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
    assert!(size_of::<AlgoPerf>() == size_of::<sys::cudnnConvolutionBwdDataAlgoPerf_t>());
    assert!(size_of::<AlgoPerf>() == size_of::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>());
    assert!(align_of::<AlgoPerf>() == align_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
};

/// Room for the records of one `Find` call (cuDNN 9 has at most 8 algorithms per op).
const MAX_ALGOS: usize = 16;

/// `Err` naming `what` and the status unless cuDNN returned success.
fn check(what: &str, status: sys::cudnnStatus_t) -> std::result::Result<(), String> {
    match status {
        sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(()),
        s => Err(format!("{what}: {s:?}")),
    }
}

/// cuDNN's version when its library loads and is cuDNN 9 (`cuDNN 9.x.y`), or why not.
pub(crate) fn library_version() -> std::result::Result<String, String> {
    // SAFETY: tries `dlopen` on the library's names only.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "libcudnn.so.9 (cuDNN 9) could not be loaded: install it (the pip wheel \
                    nvidia-cudnn-cu12 or -cu13) and put its lib folder on LD_LIBRARY_PATH"
                .into(),
        );
    }
    // SAFETY: the library loads; every cuDNN version has cudnnGetVersion (no arguments).
    let v = unsafe { sys::cudnnGetVersion() };
    // cuDNN 9 numbers itself major · 10000 + minor · 100 + patch (cuDNN 8: · 1000).
    if !(90000..100000).contains(&v) {
        return Err(format!(
            "the cuDNN found reports version {v}; the bindings are for cuDNN 9"
        ));
    }
    Ok(format!(
        "cuDNN {}.{}.{}",
        v / 10000,
        (v / 100) % 100,
        v % 100
    ))
}

impl Dnn {
    /// A handle queuing its work on `stream` (the device's one stream), with the device's
    /// context current on this thread.
    pub(crate) fn open(stream: *mut std::ffi::c_void) -> std::result::Result<Dnn, String> {
        let version = library_version()?;
        let mut handle: sys::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: the library is cuDNN 9 (checked); `handle` is written on success only.
        check("cudnnCreate", unsafe { sys::cudnnCreate(&mut handle) })?;
        let handle = Handle(handle);
        // SAFETY: the handle is new; the stream is the device's, alive as long as it.
        check("cudnnSetStream", unsafe {
            sys::cudnnSetStream(handle.0, stream as sys::cudaStream_t)
        })?;
        Ok(Dnn {
            handle: Mutex::new(handle),
            version,
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// The plan of `key`, made on first use (`Err` with cuDNN's reason where it cannot run
    /// it: the caller runs its own kernels then). `workspace_limit` bounds
    /// the workspace of the algorithm picked.
    pub(crate) fn plan(
        &self,
        key: &DnnKey,
        workspace_limit: usize,
    ) -> std::result::Result<Arc<Plan>, String> {
        if let Some(p) = self.lock_plans().get(key) {
            return p.clone();
        }
        let plan = {
            let handle = self.handle.lock().unwrap_or_else(|e| e.into_inner());
            make_plan(handle.0, key, workspace_limit).map(Arc::new)
        };
        self.lock_plans().insert(*key, plan.clone());
        plan
    }

    fn lock_plans(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<DnnKey, std::result::Result<Arc<Plan>, String>>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every convolution and pooling planned so far: its key, and the algorithm and
    /// workspace bytes picked or why cuDNN refused it.
    pub(crate) fn plans(&self) -> Vec<(DnnKey, PlanOutcome)> {
        self.lock_plans()
            .iter()
            .map(|(k, p)| {
                (
                    *k,
                    p.as_ref()
                        .map(|p| (p.algo, p.workspace))
                        .map_err(Clone::clone),
                )
            })
            .collect()
    }

    /// Plans made and refused so far, with one refusal's reason.
    pub(crate) fn report(&self) -> String {
        let plans = self.lock_plans();
        let refused: Vec<&String> = plans.values().filter_map(|p| p.as_ref().err()).collect();
        let mut s = format!(
            "{}: {} plans (convolutions, pooling), {} refused",
            self.version,
            plans.len() - refused.len(),
            refused.len()
        );
        if let Some(first) = refused.first() {
            s.push_str(&format!(" (one: {first})"));
        }
        s
    }

    /// Queues `plan` on the stream: `a` and `b` are (x, filter) forward, (filter, dy) for
    /// the input's gradient, (x, dy) for the filter's; `out` is y, dx or the KRSC filter
    /// gradient; `workspace` holds `plan.workspace` bytes.
    ///
    /// # Safety
    /// Each pointer addresses device memory of this handle's device holding the dense
    /// tensor of the plan's geometry in its place (aligned to its element), and stays
    /// valid until the stream has run the call.
    pub(crate) unsafe fn run(
        &self,
        plan: &Plan,
        a: u64,
        b: u64,
        out: u64,
        workspace: u64,
    ) -> Result<()> {
        let d = plan.descriptors.as_ref().ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: "cuDNN: the host emulation's plan reached a GPU".into(),
        })?;
        let handle = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        let (one_f, zero_f) = (1f32, 0f32);
        let (one_d, zero_d) = (1f64, 0f64);
        // Scaling factors are host floats, doubles for double data.
        let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) =
            if plan.key.dtype == DType::F64 {
                (
                    (&one_d as *const f64).cast(),
                    (&zero_d as *const f64).cast(),
                )
            } else {
                (
                    (&one_f as *const f32).cast(),
                    (&zero_f as *const f32).cast(),
                )
            };
        let ptr = |p: u64| p as *mut std::ffi::c_void;
        let ws = if plan.workspace == 0 {
            std::ptr::null_mut()
        } else {
            ptr(workspace)
        };
        let algo = plan.algo;
        let status = match (plan.key.op, d) {
            (DnnOp::Conv2d, Descriptors::Conv { x, w, y, conv }) => sys::cudnnConvolutionForward(
                handle.0,
                alpha,
                x.0,
                ptr(a),
                w.0,
                ptr(b),
                conv.0,
                forward_algo(algo).ok_or_else(|| bad_algo(algo))?,
                ws,
                plan.workspace,
                beta,
                y.0,
                ptr(out),
            ),
            (DnnOp::Conv2dBackpropInput, Descriptors::Conv { x, w, y, conv }) => {
                sys::cudnnConvolutionBackwardData(
                    handle.0,
                    alpha,
                    w.0,
                    ptr(a),
                    y.0,
                    ptr(b),
                    conv.0,
                    data_algo(algo).ok_or_else(|| bad_algo(algo))?,
                    ws,
                    plan.workspace,
                    beta,
                    x.0,
                    ptr(out),
                )
            }
            (DnnOp::Conv2dBackpropFilter, Descriptors::Conv { x, w, y, conv }) => {
                sys::cudnnConvolutionBackwardFilter(
                    handle.0,
                    alpha,
                    x.0,
                    ptr(a),
                    y.0,
                    ptr(b),
                    conv.0,
                    filter_algo(algo).ok_or_else(|| bad_algo(algo))?,
                    ws,
                    plan.workspace,
                    beta,
                    w.0,
                    ptr(out),
                )
            }
            (DnnOp::Pool(_), Descriptors::Pool { x, y, pool }) => {
                sys::cudnnPoolingForward(handle.0, pool.0, alpha, x.0, ptr(a), beta, y.0, ptr(out))
            }
            _ => {
                return Err(Error::Backend {
                    backend: BACKEND,
                    msg: format!(
                        "cuDNN: a plan of {} with another op's descriptors",
                        plan.key.op.name()
                    ),
                })
            }
        };
        check(plan.key.op.name(), status).map_err(|msg| Error::Backend {
            backend: BACKEND,
            msg: format!("cuDNN: {msg}"),
        })
    }
}

impl DnnOp {
    /// The op's name, for errors and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DnnOp::Conv2d => "conv2d",
            DnnOp::Conv2dBackpropInput => "conv2d_backprop_input",
            DnnOp::Conv2dBackpropFilter => "conv2d_backprop_filter",
            DnnOp::Pool(kind) => kind.name(),
        }
    }
}

fn bad_algo(algo: u32) -> Error {
    Error::Backend {
        backend: BACKEND,
        msg: format!("cuDNN: algorithm {algo} is not one the bindings know"),
    }
}

fn forward_algo(v: u32) -> Option<sys::cudnnConvolutionFwdAlgo_t> {
    use sys::cudnnConvolutionFwdAlgo_t::*;
    [
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    ]
    .into_iter()
    .find(|a| *a as u32 == v)
}

fn data_algo(v: u32) -> Option<sys::cudnnConvolutionBwdDataAlgo_t> {
    use sys::cudnnConvolutionBwdDataAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
    ]
    .into_iter()
    .find(|a| *a as u32 == v)
}

fn filter_algo(v: u32) -> Option<sys::cudnnConvolutionBwdFilterAlgo_t> {
    use sys::cudnnConvolutionBwdFilterAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
    ]
    .into_iter()
    .find(|a| *a as u32 == v)
}

/// cuDNN's data type and the convolution's compute type for `dtype` (half types
/// accumulate in float, as TF runs them).
fn types(dtype: DType) -> Option<(sys::cudnnDataType_t, sys::cudnnDataType_t)> {
    use sys::cudnnDataType_t::*;
    match dtype {
        DType::F32 => Some((CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT)),
        DType::F64 => Some((CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE)),
        DType::F16 => Some((CUDNN_DATA_HALF, CUDNN_DATA_FLOAT)),
        DType::BF16 => Some((CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT)),
        _ => None,
    }
}

/// The math type: tensor cores for the half types, TensorFloat-32 for float32 only where
/// allowed (`CUDNN_FMA_MATH` keeps float32 exact), cuDNN's default for float64.
fn math_type(key: &DnnKey) -> sys::cudnnMathType_t {
    use sys::cudnnMathType_t::*;
    match key.dtype {
        DType::F16 | DType::BF16 => CUDNN_TENSOR_OP_MATH,
        DType::F32 if key.tf32 => CUDNN_TENSOR_OP_MATH,
        DType::F32 => CUDNN_FMA_MATH,
        _ => CUDNN_DEFAULT_MATH,
    }
}

/// An NHWC tensor descriptor of dims `[n, h, w, c]`.
fn tensor(
    dt: sys::cudnnDataType_t,
    [n, h, w, c]: [usize; 4],
) -> std::result::Result<TensorDesc, String> {
    let mut d: sys::cudnnTensorDescriptor_t = std::ptr::null_mut();
    // SAFETY: `d` is written on success; the dims fit i32 (ConvGeometry::of checked them).
    unsafe {
        check(
            "cudnnCreateTensorDescriptor",
            sys::cudnnCreateTensorDescriptor(&mut d),
        )?;
        let d = TensorDesc(d);
        check(
            "cudnnSetTensor4dDescriptor",
            sys::cudnnSetTensor4dDescriptor(
                d.0,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
                dt,
                n as i32,
                c as i32,
                h as i32,
                w as i32,
            ),
        )?;
        Ok(d)
    }
}

fn make_plan(
    handle: sys::cudnnHandle_t,
    key: &DnnKey,
    workspace_limit: usize,
) -> std::result::Result<Plan, String> {
    let g = &key.geometry;
    let (dt, compute) = types(key.dtype).ok_or_else(|| format!("{:?}", key.dtype))?;
    let x = tensor(dt, g.input)?;
    let y = tensor(dt, g.output_dims())?;
    if let DnnOp::Pool(kind) = key.op {
        return pool_plan(key, kind, x, y);
    }
    let [k, kh, kw, c] = g.filter_dims();
    // SAFETY: each descriptor is written on success and wrapped at once (destroyed on
    // every path); the sizes fit i32 (ConvGeometry::of).
    let (w, conv) = unsafe {
        let mut f: sys::cudnnFilterDescriptor_t = std::ptr::null_mut();
        check(
            "cudnnCreateFilterDescriptor",
            sys::cudnnCreateFilterDescriptor(&mut f),
        )?;
        let f = FilterDesc(f);
        check(
            "cudnnSetFilter4dDescriptor",
            sys::cudnnSetFilter4dDescriptor(
                f.0,
                dt,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
                k as i32,
                c as i32,
                kh as i32,
                kw as i32,
            ),
        )?;
        let mut cd: sys::cudnnConvolutionDescriptor_t = std::ptr::null_mut();
        check(
            "cudnnCreateConvolutionDescriptor",
            sys::cudnnCreateConvolutionDescriptor(&mut cd),
        )?;
        let cd = ConvDesc(cd);
        check(
            "cudnnSetConvolution2dDescriptor",
            sys::cudnnSetConvolution2dDescriptor(
                cd.0,
                g.pad[0] as i32,
                g.pad[1] as i32,
                g.strides[0] as i32,
                g.strides[1] as i32,
                g.dilations[0] as i32,
                g.dilations[1] as i32,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                compute,
            ),
        )?;
        check(
            "cudnnSetConvolutionMathType",
            sys::cudnnSetConvolutionMathType(cd.0, math_type(key)),
        )?;
        // cuDNN's own output dims must be the geometry's.
        let (mut on, mut oc, mut oh, mut ow) = (0, 0, 0, 0);
        check(
            "cudnnGetConvolution2dForwardOutputDim",
            sys::cudnnGetConvolution2dForwardOutputDim(
                cd.0, x.0, f.0, &mut on, &mut oc, &mut oh, &mut ow,
            ),
        )?;
        let want = g.output_dims();
        if [on, oh, ow, oc].map(|v| v as usize) != want {
            return Err(format!(
                "cuDNN computes an output of [{on}, {oh}, {ow}, {oc}], the op {want:?}"
            ));
        }
        (f, cd)
    };
    // With autotuning (TF's default), cuDNN times each algorithm once on scratch memory of
    // its own; without, its heuristics rank them (no run). The first that succeeded within
    // the workspace limit is kept.
    let mut perf = [AlgoPerf::default(); MAX_ALGOS];
    let mut returned = 0i32;
    let (n, r, out) = (MAX_ALGOS as i32, &mut returned, perf.as_mut_ptr());
    // SAFETY: `perf` holds MAX_ALGOS records of the layout cuDNN writes (AlgoPerf is
    // cudnnConvolution…AlgoPerf_t with integers for its enums); the descriptors are alive;
    // each pair of functions (timed, ranked) takes the same arguments.
    let status = unsafe {
        use sys::*;
        let tuned = key.autotune;
        match key.op {
            DnnOp::Conv2d => (if tuned {
                cudnnFindConvolutionForwardAlgorithm
            } else {
                cudnnGetConvolutionForwardAlgorithm_v7
            })(handle, x.0, w.0, conv.0, y.0, n, r, out.cast()),
            DnnOp::Conv2dBackpropInput => {
                (if tuned {
                    cudnnFindConvolutionBackwardDataAlgorithm
                } else {
                    cudnnGetConvolutionBackwardDataAlgorithm_v7
                })(handle, w.0, y.0, conv.0, x.0, n, r, out.cast())
            }
            DnnOp::Conv2dBackpropFilter => {
                (if tuned {
                    cudnnFindConvolutionBackwardFilterAlgorithm
                } else {
                    cudnnGetConvolutionBackwardFilterAlgorithm_v7
                })(handle, x.0, y.0, conv.0, w.0, n, r, out.cast())
            }
            DnnOp::Pool(_) => cudnnStatus_t::CUDNN_STATUS_BAD_PARAM,
        }
    };
    check("finding an algorithm", status)?;
    let known = |a: u32| match key.op {
        DnnOp::Conv2d => forward_algo(a).is_some(),
        DnnOp::Conv2dBackpropInput => data_algo(a).is_some(),
        DnnOp::Conv2dBackpropFilter => filter_algo(a).is_some(),
        DnnOp::Pool(_) => false,
    };
    let best = pick(
        &perf[..(returned.max(0) as usize).min(MAX_ALGOS)],
        workspace_limit,
        key.deterministic,
        known,
    )
    .ok_or_else(|| {
        format!(
            "no{} algorithm ran within the {workspace_limit}-byte workspace limit for {key:?}",
            if key.deterministic {
                " deterministic"
            } else {
                ""
            }
        )
    })?;
    Ok(Plan {
        key: *key,
        descriptors: Some(Descriptors::Conv { x, w, y, conv }),
        algo: best.algo,
        workspace: best.memory,
    })
}

/// Pooling's plan: max (NaN propagates, as the backend's kernel and TF's) or average over
/// the window's part inside the input (TF excludes the padding), no workspace.
fn pool_plan(
    key: &DnnKey,
    kind: PoolKind,
    x: TensorDesc,
    y: TensorDesc,
) -> std::result::Result<Plan, String> {
    let g = &key.geometry;
    let mode = match kind {
        PoolKind::MaxPool2d => sys::cudnnPoolingMode_t::CUDNN_POOLING_MAX,
        PoolKind::AvgPool2d => sys::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
    };
    if g.dilations != [1, 1] {
        return Err("pooling with dilations".into());
    }
    // SAFETY: the descriptor is written on success and wrapped at once; the sizes fit i32
    // (ConvGeometry::of).
    let pool = unsafe {
        let mut p: sys::cudnnPoolingDescriptor_t = std::ptr::null_mut();
        check(
            "cudnnCreatePoolingDescriptor",
            sys::cudnnCreatePoolingDescriptor(&mut p),
        )?;
        let p = PoolDesc(p);
        check(
            "cudnnSetPooling2dDescriptor",
            sys::cudnnSetPooling2dDescriptor(
                p.0,
                mode,
                sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                g.kernel[0] as i32,
                g.kernel[1] as i32,
                g.pad[0] as i32,
                g.pad[1] as i32,
                g.strides[0] as i32,
                g.strides[1] as i32,
            ),
        )?;
        let (mut on, mut oc, mut oh, mut ow) = (0, 0, 0, 0);
        check(
            "cudnnGetPooling2dForwardOutputDim",
            sys::cudnnGetPooling2dForwardOutputDim(p.0, x.0, &mut on, &mut oc, &mut oh, &mut ow),
        )?;
        let want = g.output_dims();
        if [on, oh, ow, oc].map(|v| v as usize) != want {
            return Err(format!(
                "cuDNN pools to [{on}, {oh}, {ow}, {oc}], the op to {want:?}"
            ));
        }
        p
    };
    Ok(Plan {
        key: *key,
        descriptors: Some(Descriptors::Pool { x, y, pool }),
        algo: 0,
        workspace: 0,
    })
}

/// The first (fastest: cuDNN sorts them by time) of `results` that succeeded, needs at most
/// `limit` bytes of workspace, is deterministic where `deterministic` asks it, and is an
/// algorithm the bindings know.
fn pick(
    results: &[AlgoPerf],
    limit: usize,
    deterministic: bool,
    known: impl Fn(u32) -> bool,
) -> Option<AlgoPerf> {
    results
        .iter()
        .find(|r| {
            r.status == 0
                && r.memory <= limit
                && (!deterministic || r.determinism == DETERMINISTIC)
                && known(r.algo)
        })
        .copied()
}

/// Whether cuDNN times a convolution's algorithms on its first run of a shape, as TF does
/// unless `TF_CUDNN_USE_AUTOTUNE` is `0` or `false`; then cuDNN's heuristics rank them
/// without running them (much quicker to plan many shapes, e.g. a test suite's; PyTorch's
/// default).
pub(crate) fn autotune() -> bool {
    bool_flag(std::env::var("TF_CUDNN_USE_AUTOTUNE").ok().as_deref(), true)
}

/// A boolean environment variable as TensorFlow reads one: `1` / `true` and `0` / `false`
/// (any case); unset or anything else is `default`.
fn bool_flag(value: Option<&str>, default: bool) -> bool {
    match value.map(str::to_ascii_lowercase).as_deref() {
        Some("1" | "true") => true,
        Some("0" | "false") => false,
        _ => default,
    }
}

/// `CUDNN_DETERMINISTIC` in an algorithm record.
const DETERMINISTIC: u32 = sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC as u32;

/// Whether `TF_DETERMINISTIC_OPS` asks for results that do not vary from run to run (`1`
/// or `true`, as TensorFlow 2.4 reads it): cuDNN's convolutions then use only algorithms it
/// marks deterministic (some of its fastest gradients add with atomics, in any order). The
/// backend's own kernels are deterministic either way.
pub(crate) fn deterministic_ops() -> bool {
    bool_flag(std::env::var("TF_DETERMINISTIC_OPS").ok().as_deref(), false)
}

/// The host emulation's stand-in for cuDNN: the plan's convolution by cuDNN's definitions
/// (NHWC input and output, KRSC filter, the same padding on both sides, cross-correlation),
/// summed in float64 and rounded once to the dtype. It checks what the backend hands cuDNN
/// and does with its results (the appended zeros, the filter's order, the gradients cut
/// and transposed back) on a machine without a GPU; cuDNN itself runs on a GPU only.
/// `a`, `b` and `out` hold [`Plan::operand_bytes`] bytes each.
pub(crate) fn host_stand_in(plan: &Plan, a: &[u8], b: &[u8], out: &mut [u8]) -> Result<()> {
    let dtype = plan.key.dtype;
    let g = &plan.key.geometry;
    if let DnnOp::Pool(kind) = plan.key.op {
        return encode(dtype, &host_pooling(kind, g, &decode(dtype, a)?), out);
    }
    let (a, b) = (decode(dtype, a)?, decode(dtype, b)?);
    let [n, h, w, c] = g.input;
    let [k, kh, kw] = [g.filters, g.kernel[0], g.kernel[1]];
    let [oh, ow] = g.output;
    let mut acc = vec![0f64; out.len() / dtype.size_in_bytes()];
    let x_at = |b: usize, i: usize, j: usize, ch: usize| ((b * h + i) * w + j) * c + ch;
    let y_at = |b: usize, i: usize, j: usize, f: usize| ((b * oh + i) * ow + j) * k + f;
    let w_at = |f: usize, r: usize, s: usize, ch: usize| ((f * kh + r) * kw + s) * c + ch;
    for bi in 0..n {
        for (yi, yj) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
            for (r, s) in (0..kh).flat_map(|r| (0..kw).map(move |s| (r, s))) {
                let i = (yi * g.strides[0] + r * g.dilations[0]).checked_sub(g.pad[0]);
                let j = (yj * g.strides[1] + s * g.dilations[1]).checked_sub(g.pad[1]);
                let (Some(i), Some(j)) = (i, j) else {
                    continue;
                };
                if i >= h || j >= w {
                    continue;
                }
                for (f, ch) in (0..k).flat_map(|f| (0..c).map(move |ch| (f, ch))) {
                    let (x, y, wt) = (x_at(bi, i, j, ch), y_at(bi, yi, yj, f), w_at(f, r, s, ch));
                    match plan.key.op {
                        DnnOp::Conv2d => acc[y] += a[x] * b[wt],
                        DnnOp::Conv2dBackpropInput => acc[x] += b[y] * a[wt],
                        DnnOp::Conv2dBackpropFilter => acc[wt] += a[x] * b[y],
                        DnnOp::Pool(_) => {}
                    }
                }
            }
        }
    }
    encode(dtype, &acc, out)
}

/// cuDNN's pooling of NHWC `x` by its definition: the maximum over the window's part
/// inside the input (a NaN propagates), or the mean over that part.
fn host_pooling(kind: PoolKind, g: &ConvGeometry, x: &[f64]) -> Vec<f64> {
    let [n, h, w, c] = g.input;
    let [oh, ow] = g.output;
    let mut y = Vec::with_capacity(n * oh * ow * c);
    for bi in 0..n {
        for (yi, yj) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
            for ch in 0..c {
                let taps = (0..g.kernel[0])
                    .flat_map(|r| (0..g.kernel[1]).map(move |s| (r, s)))
                    .filter_map(|(r, s)| {
                        let i = (yi * g.strides[0] + r).checked_sub(g.pad[0])?;
                        let j = (yj * g.strides[1] + s).checked_sub(g.pad[1])?;
                        (i < h && j < w).then(|| x[((bi * h + i) * w + j) * c + ch])
                    });
                y.push(match kind {
                    PoolKind::MaxPool2d => taps.fold(f64::NEG_INFINITY, |m, v| {
                        if v.is_nan() || m.is_nan() {
                            f64::NAN
                        } else {
                            m.max(v)
                        }
                    }),
                    PoolKind::AvgPool2d => {
                        let (sum, count) = taps.fold((0.0, 0usize), |(s, k), v| (s + v, k + 1));
                        sum / count.max(1) as f64
                    }
                });
            }
        }
    }
    y
}

/// The float values of `bytes` (little-endian) of `dtype`.
fn decode(dtype: DType, bytes: &[u8]) -> Result<Vec<f64>> {
    HostData::from_le_bytes(dtype, bytes)
        .map(|h| h.to_f64_vec())
        .ok_or_else(|| ferroflow_tensor::backend::unsupported(BACKEND, "conv2d", dtype))
}

/// `values` rounded to `dtype` into `out` (little-endian).
fn encode(dtype: DType, values: &[f64], out: &mut [u8]) -> Result<()> {
    let bytes = HostData::from_f64_slice(dtype, values).to_le_bytes();
    out.get_mut(..bytes.len())
        .ok_or_else(|| ferroflow_tensor::backend::unsupported(BACKEND, "conv2d", dtype))?
        .copy_from_slice(&bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroflow_tensor::Padding;

    fn window(h: usize, k: usize, s: usize, d: usize, padding: Padding) -> Window2d {
        Window2d::resolve("conv2d", [2, h, h + 1, 3], [k, k], [s, s], [d, d], padding)
            .expect("a valid window")
    }

    /// For every window TF resolves, the geometry cuDNN runs starts each output's window
    /// where TF's starts, and covers no input position TF's does not (the appended zeros
    /// stand for TF's padding after).
    #[test]
    fn geometry_reproduces_tf_windows() {
        let mut asymmetric = 0;
        for h in 1..12 {
            for k in 1..5 {
                for s in 1..4 {
                    for d in 1..3 {
                        for padding in [Padding::Same, Padding::Valid] {
                            let span = (k - 1) * d + 1;
                            if padding == Padding::Valid && span > h {
                                continue;
                            }
                            let w = window(h, k, s, d, padding);
                            let (g, extra) = ConvGeometry::of(&w, 5).expect("cuDNN runs it");
                            assert_eq!(g.output, w.output);
                            assert_eq!(g.output_dims(), [2, w.output[0], w.output[1], 5]);
                            assert_eq!(g.filter_dims(), [5, k, k, 3]);
                            for (a, &appended) in extra.iter().enumerate() {
                                // TF's padding after: what its last window reaches past
                                // the input.
                                let end = (w.output[a] - 1) * s + span;
                                let after = (end as isize
                                    - (w.input[1 + a] + w.pad_before[a]) as isize)
                                    .max(0) as usize;
                                assert_eq!(g.input[1 + a], w.input[1 + a] + appended);
                                if appended > 0 {
                                    asymmetric += 1;
                                    assert_eq!(after, w.pad_before[a] + appended);
                                }
                                // cuDNN's count with its symmetric padding is TF's.
                                let reach = g.input[1 + a] + 2 * g.pad[a];
                                assert_eq!((reach - span) / s + 1, w.output[a]);
                            }
                        }
                    }
                }
            }
        }
        assert!(asymmetric > 0, "no window needed appended zeros");
    }

    #[test]
    fn geometry_refuses_what_cudnn_cannot_run() {
        let mut w = window(8, 3, 1, 1, Padding::Same);
        w.input[0] = 0;
        assert!(ConvGeometry::of(&w, 4).is_none(), "an empty batch");
        let w = window(8, 3, 1, 1, Padding::Same);
        assert!(ConvGeometry::of(&w, 0).is_none(), "no filters");
        let mut big = w.clone();
        big.input[0] = 1 << 31;
        assert!(ConvGeometry::of(&big, 4).is_none(), "a dim past i32");
        let mut many = w.clone();
        many.input[0] = 1 << 24;
        assert!(
            ConvGeometry::of(&many, 4).is_none(),
            "2^31 elements or more"
        );
        // Padding after smaller than before (explicit padding): cuDNN's count differs.
        let mut explicit = w;
        explicit.pad_before = [2, 2];
        assert!(ConvGeometry::of(&explicit, 4).is_none());
    }

    #[test]
    fn pick_takes_the_fastest_that_succeeded_within_the_limit() {
        let r = |algo, status, memory, determinism| AlgoPerf {
            algo,
            status,
            memory,
            determinism,
            ..AlgoPerf::default()
        };
        let results = [
            r(6, 0, 1 << 30, 1),
            r(9, 0, 0, 1),
            r(1, 3, 0, 1),
            r(3, 0, 64, 0),
            r(2, 0, 64, 1),
            r(0, 0, 0, 0),
            r(7, 0, 0, 1),
        ];
        let known = |a: u32| a < 8;
        let best =
            |limit, deterministic| pick(&results, limit, deterministic, known).map(|p| p.algo);
        assert_eq!(best(1 << 30, false), Some(6));
        assert_eq!(best(1 << 20, false), Some(3));
        assert_eq!(
            best(1 << 20, true),
            Some(2),
            "algorithm 3 is not deterministic"
        );
        assert_eq!(best(0, false), Some(0));
        assert_eq!(best(0, true), Some(7));
        assert!(pick(&results[..3], 0, false, known).is_none());
    }

    /// Where cuDNN is on the loader's path its version is read (no GPU needed); where not,
    /// the reason names the library and how to get it. Never a panic.
    #[test]
    fn library_version_names_cudnn_9_or_what_is_missing() {
        match library_version() {
            Ok(v) => assert!(v.starts_with("cuDNN 9."), "{v}"),
            Err(why) => assert!(
                why.contains("libcudnn.so.9") || why.contains("cuDNN 9"),
                "{why}"
            ),
        }
    }

    #[test]
    fn boolean_flags_read_as_tensorflow_reads_them() {
        for (value, default, want) in [
            (None, false, false),
            (None, true, true),
            (Some("1"), false, true),
            (Some("TRUE"), false, true),
            (Some("true"), false, true),
            (Some("0"), true, false),
            (Some("False"), true, false),
            (Some("yes"), true, true),
            (Some(""), false, false),
        ] {
            assert_eq!(
                bool_flag(value, default),
                want,
                "{value:?}, default {default}"
            );
        }
    }

    #[test]
    fn every_known_algorithm_round_trips() {
        for v in 0..8 {
            assert_eq!(forward_algo(v).map(|a| a as u32), Some(v));
        }
        assert!(forward_algo(8).is_none());
        for v in 0..6 {
            assert_eq!(data_algo(v).map(|a| a as u32), Some(v));
        }
        for v in 0..7 {
            assert_eq!(filter_algo(v).map(|a| a as u32), Some(v));
        }
        assert!(data_algo(6).is_none() && filter_algo(7).is_none());
    }
}
