//! One wgpu device: the queue, the caching buffer allocator, the pipeline cache, the batched
//! command encoder and read-back.
//!
//! Work is recorded into one command encoder (one compute pass per dispatch, so wgpu puts
//! the barriers between dependent kernels) and submitted in batches of [`BATCH`] dispatches,
//! or when the host asks for data. Freed buffers go back to a size-class pool; a reused
//! buffer is only ever written by work recorded after the work that read it, and the queue
//! runs work in order, so reuse needs no waiting. Uploads write fresh pool-sized buffers
//! through a mapping, never `Queue::write_buffer` (which would run before already recorded
//! work and could overwrite a buffer that recorded work still reads).

use ferroflow_tensor::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Kernels dispatched and host read-backs (waits) so far, all devices: for tests and
/// profiling (`counters()`).
pub(crate) static DISPATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(crate) static READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(crate) static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Dispatches recorded before a submit.
pub(crate) const BATCH: usize = 48;
/// Threads per workgroup of the elementwise kernels.
pub(crate) const WG: u32 = 256;
const MAX_GROUPS: u32 = 65535;
/// Parameter blocks kept for reuse (training repeats the same shapes every step).
const PARAM_CACHE: usize = 4096;

pub(crate) fn backend_error(msg: impl Into<String>) -> Error {
    Error::Backend {
        backend: "wgpu",
        msg: msg.into(),
    }
}

/// A compiled kernel with its bind group layout.
pub(crate) struct Kernel {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    inputs: usize,
    outputs: usize,
}

/// The command encoder being recorded, with its open compute pass: consecutive dispatches
/// share one pass (wgpu still places the barriers between dependent dispatches); copies and
/// clears end it.
struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    recorded: usize,
    /// While a profiler runs on a device with timestamp queries: the op of each timed
    /// dispatch of this batch (dispatch `k` wrote query slots `2k` and `2k + 1`).
    timed: Vec<Option<&'static str>>,
}

impl Recorder {
    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        })
    }
    fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("just opened")
    }
}

/// Bind groups by (inputs, outputs, buffers): a training step binds the same pooled buffers
/// step after step.
type BindGroupCache = HashMap<(usize, usize, Vec<wgpu::Buffer>), wgpu::BindGroup>;

struct Pool {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    bytes: u64,
    limit: u64,
}

/// Timestamp queries for the profiler: each dispatch in its own pass, its start and end
/// written to a query set, resolved and read back when the batch is submitted.
struct Timestamps {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
}

/// A wgpu device and everything cached on it.
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// The adapter has `SHADER_F16` (f16 storage and arithmetic in WGSL).
    pub f16: bool,
    /// Largest buffer a kernel can bind.
    pub max_binding: u64,
    /// How many storage buffers one kernel may bind (its parameter block included).
    pub max_storage_buffers: usize,
    recorder: Mutex<Recorder>,
    pool: Mutex<Pool>,
    kernels: Mutex<HashMap<String, Arc<Kernel>>>,
    params: Mutex<HashMap<Vec<u32>, wgpu::Buffer>>,
    layouts: Mutex<HashMap<(usize, usize), wgpu::BindGroupLayout>>,
    constants: Mutex<HashMap<Vec<u8>, wgpu::Buffer>>,
    bind_groups: Mutex<BindGroupCache>,
    staging: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
    errors: Arc<Mutex<Vec<String>>>,
    /// This device's ordinal (`/GPU:<ordinal>`), for the profiler's device events.
    ordinal: usize,
    /// `None` where the adapter has no `TIMESTAMP_QUERY`: the profiler then sees only the
    /// host-side launches.
    timestamps: Option<Timestamps>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Rounds a byte count up to its pool size class (at least 16 bytes; steps of 1/8 of a power
/// of two above 4 KiB, so reuse wastes at most 12.5%).
pub(crate) fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(16).next_multiple_of(16);
    if b <= 4096 {
        return b.next_power_of_two().max(16);
    }
    let step = (b.next_power_of_two() / 16).max(16);
    b.next_multiple_of(step)
}

impl Gpu {
    pub fn new(adapter: &wgpu::Adapter, ordinal: usize) -> Result<Gpu> {
        let info = adapter.get_info();
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let timestamp_query = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let mut features = wgpu::Features::empty();
        if f16 {
            features |= wgpu::Features::SHADER_F16;
        }
        if timestamp_query {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("ferroflow"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| backend_error(format!("cannot open {}: {e}", info.name)))?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string());
        }));
        let max_binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let timestamps = timestamp_query.then(|| {
            let bytes = (2 * BATCH * 8) as u64;
            Timestamps {
                queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("ferroflow profiler timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2 * BATCH as u32,
                }),
                resolved: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("ferroflow resolved timestamps"),
                    size: bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                readback: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("ferroflow timestamp read-back"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                period_ns: queue.get_timestamp_period() as f64,
            }
        });
        Ok(Gpu {
            device,
            queue,
            info,
            f16,
            max_binding,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage as usize,
            recorder: Mutex::new(Recorder {
                encoder: None,
                pass: None,
                recorded: 0,
                timed: Vec::new(),
            }),
            pool: Mutex::new(Pool {
                free: HashMap::new(),
                bytes: 0,
                limit: (max_binding / 2).clamp(64 << 20, 4 << 30),
            }),
            kernels: Mutex::default(),
            params: Mutex::default(),
            layouts: Mutex::default(),
            constants: Mutex::default(),
            bind_groups: Mutex::default(),
            staging: Mutex::default(),
            errors,
            ordinal,
            timestamps,
        })
    }

    /// A validation error wgpu reported since the last check, as an `Err`.
    pub fn check(&self) -> Result<()> {
        let mut e = lock(&self.errors);
        if e.is_empty() {
            return Ok(());
        }
        let msg = e.join("; ");
        e.clear();
        Err(backend_error(msg))
    }

    /// A storage buffer of at least `bytes` bytes, from the pool when one is free.
    pub fn alloc(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let size = size_class(bytes);
        if size > self.max_binding {
            return Err(backend_error(format!(
                "a buffer of {bytes} bytes exceeds the device's limit of {} bytes per binding ({})",
                self.max_binding, self.info.name
            )));
        }
        {
            let mut pool = lock(&self.pool);
            if let Some(b) = pool.free.get_mut(&size).and_then(|v| v.pop()) {
                pool.bytes -= size;
                return Ok(b);
            }
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// Returns a buffer to the pool (or frees it when the pool is full).
    pub fn recycle(&self, buffer: wgpu::Buffer) {
        let size = buffer.size();
        {
            let mut pool = lock(&self.pool);
            if pool.bytes + size <= pool.limit {
                pool.bytes += size;
                pool.free.entry(size).or_default().push(buffer);
                return;
            }
        }
        // Freed for real: cached bind groups must not keep its memory alive.
        lock(&self.bind_groups).retain(|k, _| !k.2.contains(&buffer));
    }

    /// A fresh buffer holding `bytes` (padded with zeros to its size class).
    pub fn upload(&self, bytes: &[u8]) -> Result<wgpu::Buffer> {
        UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let size = size_class(bytes.len() as u64);
        if size > self.max_binding {
            return Err(backend_error(format!(
                "{} bytes exceed the device's limit of {} bytes per binding ({})",
                bytes.len(),
                self.max_binding,
                self.info.name
            )));
        }
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        {
            let mut padded = bytes.to_vec();
            padded.resize(size as usize, 0);
            let mut view = buffer
                .get_mapped_range_mut(..)
                .map_err(|e| backend_error(format!("mapping an upload buffer: {e}")))?;
            view.copy_from_slice(&padded);
        }
        buffer.unmap();
        self.check()?;
        Ok(buffer)
    }

    /// A shared buffer holding the small constant `bytes` (scalars, short vectors), uploaded
    /// once per distinct content: buffers are never written after creation, so tensors can
    /// share it, and a training step's constants cost no buffer creation.
    pub fn constant(&self, bytes: &[u8]) -> Result<wgpu::Buffer> {
        if let Some(b) = lock(&self.constants).get(bytes) {
            return Ok(b.clone());
        }
        let b = self.upload(bytes)?;
        let mut c = lock(&self.constants);
        if c.len() >= PARAM_CACHE {
            c.clear();
        }
        c.insert(bytes.to_vec(), b.clone());
        Ok(b)
    }

    /// The compiled kernel `key`, built from `source()` on first use (with wgpu's runtime
    /// bounds checks).
    pub fn kernel(
        &self,
        key: &str,
        inputs: usize,
        outputs: usize,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<Kernel>> {
        self.kernel_with(key, inputs, outputs, source, false)
    }

    /// [`Gpu::kernel`] without wgpu's bounds checks and loop bounding, for hot kernels whose
    /// every access is guarded in the WGSL itself (the GEMM): clamped indices and loop
    /// counters otherwise cost a large factor there and stop the compiler from unrolling.
    pub fn kernel_trusted(
        &self,
        key: &str,
        inputs: usize,
        outputs: usize,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<Kernel>> {
        self.kernel_with(key, inputs, outputs, source, true)
    }

    fn kernel_with(
        &self,
        key: &str,
        inputs: usize,
        outputs: usize,
        source: impl FnOnce() -> String,
        trusted: bool,
    ) -> Result<Arc<Kernel>> {
        if let Some(k) = lock(&self.kernels).get(key) {
            return Ok(k.clone());
        }
        let src = source();
        let layout = self.bind_layout(inputs, outputs);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        };
        let module = if trusted {
            // SAFETY: trusted kernels guard every buffer index against the sizes they are
            // dispatched with and have loops bounded by those sizes (reviewed in kernels/gemm.rs).
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        } else {
            self.device.create_shader_module(desc)
        };
        let pl = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(key),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: Some(&pl),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        self.check()
            .map_err(|e| backend_error(format!("compiling kernel {key}: {e}")))?;
        let k = Arc::new(Kernel {
            pipeline,
            layout,
            inputs,
            outputs,
        });
        lock(&self.kernels).insert(key.to_string(), k.clone());
        Ok(k)
    }

    fn bind_layout(&self, inputs: usize, outputs: usize) -> wgpu::BindGroupLayout {
        lock(&self.layouts)
            .entry((inputs, outputs))
            .or_insert_with(|| {
                let entry = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                };
                let entries: Vec<_> = (0..1 + inputs + outputs)
                    .map(|i| entry(i as u32, i <= inputs))
                    .collect();
                self.device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: None,
                        entries: &entries,
                    })
            })
            .clone()
    }

    fn params_buffer(&self, params: &[u32]) -> Result<wgpu::Buffer> {
        let mut cache = lock(&self.params);
        if let Some(b) = cache.get(params) {
            return Ok(b.clone());
        }
        if cache.len() >= PARAM_CACHE {
            cache.clear();
        }
        let mut words = params.to_vec();
        if words.is_empty() {
            words.push(0);
        }
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (words.len() * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        buffer
            .get_mapped_range_mut(..)
            .map_err(|e| backend_error(format!("mapping a parameter block: {e}")))?
            .copy_from_slice(bytemuck::cast_slice(&words));
        buffer.unmap();
        cache.insert(params.to_vec(), buffer.clone());
        Ok(buffer)
    }

    /// Records one dispatch of `kernel` over `groups` workgroups.
    pub fn dispatch(
        &self,
        kernel: &Kernel,
        params: &[u32],
        inputs: &[&wgpu::Buffer],
        outputs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Result<()> {
        if inputs.len() != kernel.inputs || outputs.len() != kernel.outputs {
            return Err(backend_error(format!(
                "kernel expects {} inputs and {} outputs, got {} and {}",
                kernel.inputs,
                kernel.outputs,
                inputs.len(),
                outputs.len()
            )));
        }
        if groups.contains(&0) {
            return Ok(());
        }
        DISPATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pbuf = self.params_buffer(params)?;
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: pbuf.as_entire_binding(),
        }];
        for (i, b) in inputs.iter().chain(outputs).enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: 1 + i as u32,
                resource: b.as_entire_binding(),
            });
        }
        let key = (
            kernel.inputs,
            kernel.outputs,
            std::iter::once(&pbuf)
                .chain(inputs.iter().copied())
                .chain(outputs.iter().copied())
                .cloned()
                .collect::<Vec<_>>(),
        );
        let cached = lock(&self.bind_groups).get(&key).cloned();
        let group = match cached {
            Some(g) => g,
            None => {
                let g = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &kernel.layout,
                    entries: &entries,
                });
                let mut cache = lock(&self.bind_groups);
                if cache.len() >= PARAM_CACHE {
                    cache.clear();
                }
                cache.insert(key, g.clone());
                g
            }
        };
        let mut rec = lock(&self.recorder);
        match self
            .timestamps
            .as_ref()
            .filter(|_| ferroflow_tensor::trace::is_active())
        {
            // Profiling: the dispatch in a pass of its own whose start and end the device
            // timestamps.
            Some(ts) => {
                let k = rec.timed.len() as u32;
                let mut pass =
                    rec.encoder(&self.device)
                        .begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: None,
                            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                                query_set: &ts.queries,
                                beginning_of_pass_write_index: Some(2 * k),
                                end_of_pass_write_index: Some(2 * k + 1),
                            }),
                        });
                pass.set_pipeline(&kernel.pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                drop(pass);
                rec.timed.push(ferroflow_tensor::trace::current_op());
            }
            None => {
                let pass = rec.pass(&self.device);
                pass.set_pipeline(&kernel.pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
            }
        }
        rec.recorded += 1;
        if rec.recorded >= BATCH {
            self.submit(&mut rec);
        }
        drop(rec);
        self.check()
    }

    /// Records a buffer-to-buffer copy.
    pub fn copy(&self, src: &wgpu::Buffer, src_off: u64, dst: &wgpu::Buffer, dst_off: u64, n: u64) {
        if n == 0 {
            return;
        }
        let mut rec = lock(&self.recorder);
        rec.encoder(&self.device)
            .copy_buffer_to_buffer(src, src_off, dst, dst_off, n);
        rec.recorded += 1;
    }

    fn submit(&self, rec: &mut Recorder) {
        rec.pass = None;
        let timed = std::mem::take(&mut rec.timed);
        match (self.timestamps.as_ref(), timed.is_empty()) {
            (Some(ts), false) => {
                let n = 2 * timed.len() as u32;
                let enc = rec.encoder(&self.device);
                enc.resolve_query_set(&ts.queries, 0..n, &ts.resolved, 0);
                enc.copy_buffer_to_buffer(&ts.resolved, 0, &ts.readback, 0, n as u64 * 8);
                rec.pass = None;
                if let Some(enc) = rec.encoder.take() {
                    self.queue.submit([enc.finish()]);
                }
                self.report_timestamps(ts, &timed);
            }
            _ => {
                if let Some(enc) = rec.encoder.take() {
                    self.queue.submit([enc.finish()]);
                }
            }
        }
        rec.recorded = 0;
    }

    /// Waits for the batch just submitted, reads its timestamps and tells the profiler of
    /// each kernel, on the host's clock: the batch's last end is aligned to the moment the
    /// wait returned (the device's clock has no defined relation to the host's).
    fn report_timestamps(&self, ts: &Timestamps, timed: &[Option<&'static str>]) {
        let (tx, rx) = std::sync::mpsc::channel();
        ts.readback
            .slice(..(timed.len() * 16) as u64)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        let waited = self.device.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        });
        let done = std::time::Instant::now();
        if waited.is_err() || !matches!(rx.recv(), Ok(Ok(()))) {
            // Timing is best effort: the work itself is checked by `check`.
            return;
        }
        let ticks: Vec<u64> = match ts
            .readback
            .slice(..(timed.len() * 16) as u64)
            .get_mapped_range()
        {
            Ok(view) => bytemuck::cast_slice::<u8, u64>(&view).to_vec(),
            Err(_) => Vec::new(),
        };
        ts.readback.unmap();
        let Some(&last) = ticks.iter().max() else {
            return;
        };
        let device = ferroflow_tensor::Device::gpu(self.ordinal);
        let events: Vec<ferroflow_tensor::trace::DeviceEvent> = timed
            .iter()
            .zip(ticks.chunks_exact(2))
            .filter(|(_, t)| t[1] >= t[0])
            .map(|(op, t)| {
                let before_done = (last - t[0]) as f64 * ts.period_ns;
                ferroflow_tensor::trace::DeviceEvent {
                    device,
                    op: *op,
                    start: done
                        .checked_sub(std::time::Duration::from_nanos(before_done as u64))
                        .unwrap_or(done),
                    duration: std::time::Duration::from_nanos(
                        ((t[1] - t[0]) as f64 * ts.period_ns) as u64,
                    ),
                }
            })
            .collect();
        ferroflow_tensor::trace::record_device_events(&events);
    }

    /// Submits what is recorded.
    pub fn flush(&self) -> Result<()> {
        let mut rec = lock(&self.recorder);
        self.submit(&mut rec);
        drop(rec);
        self.check()
    }

    /// Submits and waits for all work.
    pub fn wait(&self) -> Result<()> {
        self.flush()?;
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| backend_error(format!("waiting for the GPU: {e}")))?;
        self.check()
    }

    /// Reads `n` bytes (a multiple of 4) at `offset` (a multiple of 4) of `buffer`.
    pub fn read(&self, buffer: &wgpu::Buffer, offset: u64, n: u64) -> Result<Vec<u8>> {
        if n == 0 {
            return Ok(vec![]);
        }
        READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let class = size_class(n);
        let reuse = lock(&self.staging).get_mut(&class).and_then(|v| v.pop());
        let staging = match reuse {
            Some(b) => b,
            None => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("ferroflow read-back"),
                size: class,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        self.copy(buffer, offset, &staging, 0, n);
        self.flush()?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| backend_error(format!("waiting for the GPU: {e}")))?;
        rx.recv()
            .map_err(|_| backend_error("read-back was cancelled"))?
            .map_err(|e| backend_error(format!("mapping a read-back buffer: {e}")))?;
        let out = staging
            .get_mapped_range(..n)
            .map_err(|e| backend_error(format!("reading a read-back buffer: {e}")))?
            .to_vec();
        staging.unmap();
        self.check()?;
        let mut pool = lock(&self.staging);
        let free = pool.entry(class).or_default();
        if free.len() < 4 {
            free.push(staging);
        }
        Ok(out)
    }

    /// A fresh zeroed error word for one checked kernel (its own, so concurrent ops never
    /// see each other's errors).
    pub fn error_word(&self) -> Result<wgpu::Buffer> {
        let b = self.alloc(16)?;
        lock(&self.recorder)
            .encoder(&self.device)
            .clear_buffer(&b, 0, None);
        Ok(b)
    }

    /// Waits for the recorded work and returns the words a checked kernel left in its error
    /// word: the code (0: none) and up to three words of detail.
    pub fn data_error(&self, word: wgpu::Buffer) -> Result<[u32; 4]> {
        let b = self.read(&word, 0, 16);
        self.recycle(word);
        let b = b?;
        let mut w = [0u32; 4];
        for (i, c) in b.chunks_exact(4).enumerate() {
            w[i] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(w)
    }
}

/// Workgroup counts covering `n` items at `per_group` items per workgroup: x up to the
/// 65535 limit, the rest in y (kernels recover the linear id with `linear_id`).
pub(crate) fn groups_for(n: usize, per_group: u32) -> Result<[u32; 3]> {
    let g = n.div_ceil(per_group as usize);
    if g == 0 {
        return Ok([0, 1, 1]);
    }
    let x = g.min(MAX_GROUPS as usize);
    let y = g.div_ceil(x);
    if y > MAX_GROUPS as usize {
        return Err(backend_error(format!(
            "{n} elements exceed one dispatch's {} workgroups",
            MAX_GROUPS as u64 * MAX_GROUPS as u64
        )));
    }
    Ok([x as u32, y as u32, 1])
}
