//! [`Tensor`]: an immutable, cheaply cloned n-dimensional array on a device.

use crate::backend::{Backend, BufferBox, Operand};
use crate::device::{current_device, Device};
use crate::dispatch::{dispatch, dispatch_on};
use crate::dtype::{DType, Element, HostData};
use crate::error::{Error, Result};
use crate::layout::{num_elements, Layout};
use crate::op::Op;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes held by all live tensor buffers, on every device (for leak tests and memory views).
pub fn live_tensor_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// The most bytes live tensor buffers held at once since the last
/// [`reset_peak_tensor_bytes`] (TF's `get_memory_info(...)["peak"]`).
///
/// ```no_run
/// // A backend registered first: `ferroflow::init()` (the facade).
/// use ferroflow_tensor::{peak_tensor_bytes, reset_peak_tensor_bytes, DType, Tensor};
/// reset_peak_tensor_bytes();
/// let t = Tensor::zeros(&[1024], DType::F32)?;
/// assert!(peak_tensor_bytes() >= 4096);
/// # drop(t);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn peak_tensor_bytes() -> usize {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// Starts a new peak measurement at the bytes live now.
pub fn reset_peak_tensor_bytes() {
    PEAK_BYTES.store(live_tensor_bytes(), Ordering::Relaxed);
}

/// Identity of a tensor (unique for the life of the process); views get their own id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u64);

impl TensorId {
    /// A fresh id.
    pub fn next() -> TensorId {
        TensorId(NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// A buffer on a device, shared by every view of it. Internal to the crate: backends see
/// buffers only as [`Operand`]s handed to their kernels, and return fresh ones.
pub(crate) struct Storage {
    buffer: BufferBox,
    backend: Arc<dyn Backend>,
    device: Device,
    bytes: usize,
}

impl Storage {
    /// Wraps a backend buffer made for a tensor of `shape` and `dtype` (counted in
    /// [`live_tensor_bytes`] until dropped; a profiler sees it allocated and freed).
    pub(crate) fn new(
        buffer: BufferBox,
        backend: Arc<dyn Backend>,
        device: Device,
        shape: &[usize],
        dtype: DType,
    ) -> Storage {
        let bytes = buffer.size_in_bytes();
        let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        crate::trace::allocated(device, bytes, buffer_address(&buffer), || {
            (dtype, shape.to_vec())
        });
        Storage {
            buffer,
            backend,
            device,
            bytes,
        }
    }
}

/// A buffer's identity for memory events: the address of its backend object.
fn buffer_address(buffer: &BufferBox) -> usize {
    &**buffer as *const dyn crate::backend::DeviceBuffer as *const () as usize
}

impl Drop for Storage {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
        crate::trace::freed(self.device, self.bytes, buffer_address(&self.buffer));
    }
}

struct Inner {
    id: TensorId,
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
}

/// An n-dimensional array of one [`DType`] on one [`Device`]. Cloning is cheap (an `Arc`);
/// tensors are values: ops return new tensors, views share storage.
///
/// ```no_run
/// // A backend registered first: `ferroflow::init()` (the facade).
/// use ferroflow_tensor::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let y = x.matmul(&x)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![7.0, 10.0, 15.0, 22.0]);
/// println!("{y}"); // tf.Tensor([[ 7. 10.] [15. 22.]], shape=(2, 2), dtype=float32)
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

impl Tensor {
    /// A tensor over `storage` viewed through `layout` (used by ops and backends).
    pub(crate) fn from_storage(storage: Arc<Storage>, layout: Layout, dtype: DType) -> Tensor {
        Tensor(Arc::new(Inner {
            id: TensorId::next(),
            storage,
            layout,
            dtype,
        }))
    }
    /// A tensor over a fresh dense kernel output of `shape`.
    pub(crate) fn from_buffer(
        buffer: BufferBox,
        shape: &[usize],
        dtype: DType,
        backend: &Arc<dyn Backend>,
        device: Device,
    ) -> Tensor {
        let storage = Arc::new(Storage::new(buffer, backend.clone(), device, shape, dtype));
        Tensor::from_storage(storage, Layout::contiguous(shape), dtype)
    }
    /// A tensor over `buffer`, a dense row-major buffer of `shape` and `dtype` that the
    /// backend serving `device` made (a backend crate's own operation's output, as
    /// [`Tensor::operand`] is its input). An error when no backend serves `device` or the
    /// buffer's size is not the shape's.
    ///
    /// ```no_run
    /// # use ferroflow_tensor::{backend_for, DType, Device, HostData, Tensor};
    /// let device = Device::parse("/CPU:0")?;
    /// let buffer = backend_for(device)?.upload(0, HostData::F32(vec![1.0, 2.0]))?;
    /// let x = Tensor::from_backend_buffer(buffer, &[2], DType::F32, device)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 2.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn from_backend_buffer(
        buffer: BufferBox,
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let backend = crate::device::backend_for(device)?;
        let n = crate::layout::checked_num_elements("from_backend_buffer", shape)?;
        let bytes = n.checked_mul(dtype.size_in_bytes());
        if bytes != Some(buffer.size_in_bytes()) {
            return Err(Error::invalid(
                "from_backend_buffer",
                format!(
                    "a buffer of {} bytes does not hold a {dtype} tensor of shape {shape:?}",
                    buffer.size_in_bytes()
                ),
            ));
        }
        Ok(Tensor::from_buffer(buffer, shape, dtype, &backend, device))
    }
    /// The same storage under another layout (a view).
    pub(crate) fn view(&self, layout: Layout) -> Tensor {
        Tensor::from_storage(self.0.storage.clone(), layout, self.0.dtype)
    }

    /// Places host data of `shape` on the current device.
    pub fn from_host(data: HostData, shape: &[usize]) -> Result<Tensor> {
        Tensor::from_host_on(data, shape, current_device())
    }
    /// Places host data of `shape` on `device`.
    pub fn from_host_on(data: HostData, shape: &[usize], device: Device) -> Result<Tensor> {
        if data.len() != crate::layout::checked_num_elements("constant", shape)? {
            return Err(Error::invalid(
                "constant",
                format!(
                    "{} values do not fill shape {shape:?} ({} elements)",
                    data.len(),
                    num_elements(shape)
                ),
            ));
        }
        dispatch_on(|| Op::Constant, device, |p| p.upload(data, shape))
    }
    /// A tensor from a vector and a shape, on the current device.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Tensor::from_host(T::into_host(data), shape)
    }
    /// A 1-D tensor from a slice.
    pub fn from_slice<T: Element>(data: &[T]) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), &[data.len()])
    }
    /// A rank-0 tensor.
    pub fn scalar<T: Element>(value: T) -> Result<Tensor> {
        Tensor::from_vec(vec![value], &[])
    }
    /// A rank-0 tensor of `dtype` holding `value` (converted as Rust `as` does).
    pub fn scalar_of(value: f64, dtype: DType) -> Result<Tensor> {
        Tensor::fill(&[], value, dtype)
    }
    /// `shape` filled with `value` (`tf.fill`).
    pub fn fill(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
        let n = check_new("fill", shape, dtype)?;
        Tensor::from_host(HostData::filled(dtype, n, value), shape)
    }
    /// Zeros (`tf.zeros`).
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::fill(shape, 0.0, dtype)
    }
    /// Ones (`tf.ones`).
    pub fn ones(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::fill(shape, 1.0, dtype)
    }
    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        self.full_like(0.0)
    }
    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        self.full_like(1.0)
    }
    /// `value` everywhere, with this tensor's shape, dtype and device.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        let shape = self.shape();
        Tensor::from_host_on(
            HostData::filled(self.dtype(), num_elements(shape), value),
            shape,
            self.device(),
        )
    }
    /// A rank-0 tensor of this tensor's dtype and device.
    pub fn scalar_like(&self, value: f64) -> Result<Tensor> {
        Tensor::from_host_on(HostData::filled(self.dtype(), 1, value), &[], self.device())
    }
    /// Identity matrix `n x m` (`tf.eye(n, m)`).
    pub fn eye(n: usize, m: usize, dtype: DType) -> Result<Tensor> {
        let mut v = vec![0.0; check_new("eye", &[n, m], DType::F64)?];
        for i in 0..n.min(m) {
            v[i * m + i] = 1.0;
        }
        Tensor::from_host(HostData::from_f64_slice(dtype, &v), &[n, m])
    }
    /// `start, start + delta, ...` below `limit` (`tf.range`).
    pub fn range(start: f64, limit: f64, delta: f64, dtype: DType) -> Result<Tensor> {
        if delta == 0.0 || !delta.is_finite() || !start.is_finite() || !limit.is_finite() {
            return Err(Error::invalid("range", format!("needs finite bounds and a non-zero delta, got start {start}, limit {limit}, delta {delta}")));
        }
        let n = ((limit - start) / delta).ceil().max(0.0) as usize;
        check_new("range", &[n], DType::F64)?;
        let v: Vec<f64> = (0..n).map(|i| start + i as f64 * delta).collect();
        Tensor::from_host(HostData::from_f64_slice(dtype, &v), &[n])
    }
    /// `num` evenly spaced values from `start` to `stop` inclusive (`tf.linspace`).
    pub fn linspace(start: f64, stop: f64, num: usize, dtype: DType) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: "linspace",
                dtype,
                expected: "a float dtype",
            });
        }
        check_new("linspace", &[num], DType::F64)?;
        let step = if num > 1 {
            (stop - start) / (num - 1) as f64
        } else {
            0.0
        };
        let v: Vec<f64> = (0..num)
            .map(|i| {
                if i + 1 == num && num > 1 {
                    stop
                } else {
                    start + i as f64 * step
                }
            })
            .collect();
        Tensor::from_host(HostData::from_f64_slice(dtype, &v), &[num])
    }

    /// Unique id (tapes key on it).
    pub fn id(&self) -> TensorId {
        self.0.id
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }
    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }
    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        self.0.layout.num_elements()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.0.storage.device
    }
    /// The layout (shape, strides, offset) of this view.
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    /// The backend that owns the storage.
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.0.storage.backend
    }
    /// This tensor as a kernel input: its backend's buffer, its layout and dtype. For a
    /// backend crate's own operations outside the [`Backend`] trait (the CUDA backend's
    /// NCCL collectives), which downcast the buffer to their own type.
    ///
    /// ```no_run
    /// # use ferroflow_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.operand().shape(), &[2]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn operand(&self) -> Operand<'_> {
        Operand {
            buffer: self.0.storage.buffer.as_ref(),
            layout: &self.0.layout,
            dtype: self.0.dtype,
        }
    }
    /// The same values, view and storage under a new [`TensorId`], so no tape has seen it
    /// produced (what `tf.stop_gradient` returns); nothing is copied.
    pub fn with_new_id(&self) -> Tensor {
        Tensor::from_storage(self.0.storage.clone(), self.0.layout.clone(), self.0.dtype)
    }
    /// The tensors themselves, except that a tensor listed again becomes a view of itself
    /// (a recorded reshape, so tapes connect it to the original): every entry a distinct
    /// identity. Graph tracing and the gradient of fused ops give their arguments this way,
    /// so the same tensor passed twice stays two arguments.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::Tensor;
    /// let x = Tensor::scalar(1.0f32)?;
    /// let d = Tensor::with_distinct_ids(&[x.clone(), x.clone()])?;
    /// assert_eq!(d[0].id(), x.id());
    /// assert_ne!(d[1].id(), x.id());
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn with_distinct_ids(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut seen = std::collections::HashSet::new();
        tensors
            .iter()
            .map(|t| {
                if seen.insert(t.id()) {
                    Ok(t.clone())
                } else {
                    t.reshape_to(t.shape())
                }
            })
            .collect()
    }
    /// True when two tensors share storage.
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// Reads the elements back to the host, dense and row-major (observers see a
    /// [`Op::ToHost`]).
    ///
    /// Inside a traced function this is [`Error::NotTraceable`]: the value of one call would
    /// be baked into the graph.
    pub fn to_host(&self) -> Result<HostData> {
        crate::dispatch::refuse_while_tracing(
            "to_host",
            "a tensor's value read on the host (to_host, to_vec, item) would be fixed at \
             its value in the trace; keep the computation in tensor ops (select, cond, \
             while_loop) or read the value outside the function",
        )?;
        dispatch(
            || Op::ToHost,
            &[self],
            |p| p.backend.download(self.operand()),
        )
    }
    /// The elements, borrowed without a copy, when they already sit in host memory as one
    /// dense row-major run of `T` (a CPU tensor that is not a strided or broadcast view);
    /// `None` otherwise (another dtype, a device buffer, a view that needs gathering, or
    /// inside a traced function), where [`Tensor::to_host`] reads them.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade); the CPU is current.
    /// use ferroflow_tensor::Tensor;
    /// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0])?;
    /// assert_eq!(t.host_slice::<f32>(), Some(&[1.0f32, 2.0, 3.0][..]));
    /// assert_eq!(t.host_slice::<f64>(), None); // another dtype
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn host_slice<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype() {
            return None;
        }
        let (data, offset, len) = self.host_run()?;
        T::slice_of(data)?.get(offset..offset + len)
    }
    /// Appends the elements' little-endian bytes (dense, row-major: what
    /// `to_host()?.to_le_bytes()` gives) to `out`, for writers of messages and files:
    /// copied once, straight from the storage, when the tensor is a dense run of a CPU
    /// buffer whose memory already is those bytes; through [`Tensor::to_host`] otherwise
    /// (inside a traced function, its error).
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::Tensor;
    /// let t = Tensor::from_slice(&[1i32, -2])?;
    /// let mut out = vec![7u8];
    /// t.extend_le_bytes(&mut out)?;
    /// assert_eq!(out, [7, 1, 0, 0, 0, 254, 255, 255, 255]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn extend_le_bytes(&self, out: &mut Vec<u8>) -> Result<()> {
        if let Some(bytes) = self.host_le_bytes() {
            out.extend_from_slice(bytes);
        } else {
            out.extend_from_slice(&self.to_host()?.le_bytes());
        }
        Ok(())
    }
    /// The elements' little-endian bytes borrowed from the storage, where they are a dense
    /// run of a host buffer whose memory is those bytes.
    fn host_le_bytes(&self) -> Option<&[u8]> {
        let (data, offset, len) = self.host_run()?;
        let size = self.dtype().size_in_bytes();
        data.le_bytes_in_place()?
            .get(offset * size..(offset + len) * size)
    }
    /// The host buffer holding the elements as one dense row-major run, with the run's
    /// element offset and length: `None` for device memory, a view that needs gathering, a
    /// buffer of another dtype, and inside a traced function (where reading values is
    /// refused).
    fn host_run(&self) -> Option<(&HostData, usize, usize)> {
        if crate::dispatch::is_tracing() {
            return None;
        }
        let data = self.0.storage.buffer.host_data()?;
        if data.dtype() != self.dtype() {
            return None;
        }
        let (offset, len) = self.0.layout.contiguous_range()?;
        Some((data, offset, len))
    }
    /// The elements as a `Vec<T>`; `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::HostTypeMismatch {
                actual: self.dtype(),
                requested: T::DTYPE,
            });
        }
        Ok(T::vec_of(self.to_host()?).expect("dtype checked above"))
    }
    /// The elements converted to f64 (any dtype).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64_vec())
    }
    /// The single element of a one-element tensor.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.num_elements() != 1 {
            return Err(Error::invalid(
                "item",
                format!("needs exactly one element, shape is {:?}", self.shape()),
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }
    /// Copies to another device (`tf.identity` under another device scope); observers see
    /// one [`Op::ToDevice`] timed over the whole transfer.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let to = crate::device::backend_for(device)?;
        dispatch(
            || Op::ToDevice { to: device },
            &[self],
            |p| {
                crate::device::check_allocation(
                    "to_device",
                    self.shape(),
                    self.dtype(),
                    device,
                    to.as_ref(),
                )?;
                let host = p.backend.download(self.operand())?;
                let buffer = to.upload(device.index(), host)?;
                Ok(Tensor::from_buffer(
                    buffer,
                    self.shape(),
                    self.dtype(),
                    &to,
                    device,
                ))
            },
        )
    }
    /// A dense copy (contiguous, own storage).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.layout().is_contiguous() && self.layout().offset() == 0 {
            return Ok(self.clone());
        }
        self.copy()
    }
    /// The same values under a new identity, through a recorded
    /// [`Op::StopGradient`](crate::Op::StopGradient) view: tapes give it no gradient, and a
    /// graph function records it, so a traced function computes it from its input on every
    /// call (`tf.stop_gradient`; autodiff's `stop_gradient` and `custom_gradient` make
    /// these, `custom_gradient` with the flag set). Nothing is copied.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::Tensor;
    /// let x = Tensor::scalar(2.0f32)?;
    /// let y = x.stop_gradient(false)?;
    /// assert_ne!(y.id(), x.id());
    /// assert_eq!(y.item::<f32>()?, 2.0);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn stop_gradient(&self, custom_gradient: bool) -> Result<Tensor> {
        dispatch(
            || Op::StopGradient { custom_gradient },
            &[self],
            |_| Ok(self.with_new_id()),
        )
    }
    /// A dense copy in new storage, always (`tf.identity` that copies).
    pub fn copy(&self) -> Result<Tensor> {
        dispatch(
            || Op::Copy,
            &[self],
            |p| {
                if self.num_elements() == 0 {
                    return p.empty(self.shape(), self.dtype());
                }
                Ok(Tensor::from_buffer(
                    p.backend.copy(self.operand())?,
                    self.shape(),
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor[{:?}, {}, {}]",
            self.shape(),
            self.dtype(),
            self.device()
        )
    }
}

/// TF's repr: `tf.Tensor([1. 2. 3.], shape=(3,), dtype=float32)`; large tensors show
/// their first and last three entries per axis.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = match self.to_host() {
            Ok(d) => d,
            Err(e) => return write!(f, "tf.Tensor(<unreadable: {e}>)"),
        };
        let shape = self.shape();
        let summarize = data.len() > 1000;
        let mut s = String::new();
        format_nested(&data, shape, 0, 0, summarize, &mut s);
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let shape_str = if dims.len() == 1 {
            format!("({},)", dims[0])
        } else {
            format!("({})", dims.join(", "))
        };
        write!(
            f,
            "tf.Tensor({s}, shape={shape_str}, dtype={})",
            self.dtype()
        )
    }
}

fn format_elem(data: &HostData, i: usize) -> String {
    // NumPy's form: (re+imj) with each part printed as a float
    let complex = |re: f64, im: f64| {
        let im_text = format_float(im.abs());
        let sign = if im < 0.0 || (im == 0.0 && im.is_sign_negative()) {
            '-'
        } else {
            '+'
        };
        format!("({}{sign}{im_text}j)", format_float(re))
    };
    match data {
        HostData::Bool(v) => if v[i] { "True" } else { "False" }.to_string(),
        HostData::C64(v) => complex(v[i].re as f64, v[i].im as f64),
        HostData::C128(v) => complex(v[i].re, v[i].im),
        d if d.dtype().is_float() => format_float(d.get_f64(i)),
        d => format!("{}", d.get_f64(i) as i64),
    }
}

fn format_float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if x == x.trunc() && x.abs() < 1e16 {
        format!("{x:.0}.")
    } else {
        let s = format!("{:.7}", x);
        s.trim_end_matches('0').to_string()
    }
}

fn format_nested(
    data: &HostData,
    shape: &[usize],
    axis: usize,
    base: usize,
    summarize: bool,
    out: &mut String,
) {
    if axis == shape.len() {
        out.push_str(&format_elem(data, base));
        return;
    }
    let stride: usize = shape[axis + 1..].iter().product();
    let n = shape[axis];
    out.push('[');
    let mut first = true;
    for i in 0..n {
        if summarize && n > 6 && i == 3 {
            out.push_str(" ...");
            continue;
        }
        if summarize && n > 6 && i > 3 && i < n - 3 {
            continue;
        }
        if !first {
            out.push(' ');
        }
        first = false;
        format_nested(data, shape, axis + 1, base + i * stride, summarize, out);
    }
    out.push(']');
}

/// [`crate::device::check_allocation`] for a new tensor of `shape` on the current device
/// (creation ops call it before building their host data); returns the element count.
pub(crate) fn check_new(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    let device = current_device();
    let backend = crate::device::backend_for(device)?;
    crate::device::check_allocation(op, shape, dtype, device, backend.as_ref())
}
