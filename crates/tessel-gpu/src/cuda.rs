//! Real measurement on an NVIDIA GPU (feature `cuda`): [`CudaMeasurer`] generates each
//! candidate's kernel, compiles it to PTX ([`PtxCompiler`]: NVRTC at run time, or nvcc), and
//! sends it to a worker process ([`serve`]) that loads it through the CUDA driver (cudarc,
//! loaded at run time, so a binary built without CUDA runs where a GPU is), checks the output
//! against the CPU reference and times it with CUDA events.
//!
//! A kernel that faults poisons its CUDA context: the worker reports it as a crash and exits,
//! and the parent starts a fresh one. A kernel that hangs is killed by the parent's timeout.
//! The parent process never touches the driver.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use serde::{Deserialize, Serialize};
use tessel_ir::{ComputeOp, DType, TensorData};
use tessel_measure::check::{max_relative_error, relative_error, tolerance, unravel};
use tessel_measure::worker::{TimingOptions, Worker, WorkerCommand, WorkerReply};
use tessel_measure::{
    Candidate, HardwareFingerprint, MeasureError, MeasureErrorKind, MeasureResult, Measurement,
    Measurer, Timing,
};

use crate::codegen::{generate, param_operands};
use crate::device::spec_for;
use crate::error::GpuError;
use crate::nvcc::Nvcc;

/// How the output of a kernel is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// Every element against tessel-ir's interpreter.
    Full,
    /// This many elements (the corners and a fixed pseudo-random sample) against
    /// [`ComputeOp::reference_at`], and every element for NaN (the output starts as NaN, so
    /// an element the kernel never writes is caught).
    Sampled(u32),
    /// No check (benchmarks of already-checked kernels).
    None,
}

/// One kernel to check and time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuJob {
    /// PTX text of a module holding the kernel.
    pub ptx: String,
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    /// Split-K: the output starts as zeros (the kernel adds into it).
    #[serde(default)]
    pub zero_output: bool,
    /// The kernel's parameters: `Some(i)` is the operator's `i`-th read operand
    /// ([`ComputeOp::read_operands`]), `None` the output.
    pub args: Vec<Option<usize>>,
    pub op: ComputeOp,
    pub check: Check,
    /// Inputs are `TensorData::random(shape, dtype, seed + i)`.
    pub seed: u64,
    pub tolerance: f64,
    pub timing: TimingOptions,
}

/// What the parent asks the worker.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuRequest {
    /// Open the device and describe it.
    Fingerprint,
    Measure(Box<GpuJob>),
}

/// The worker's answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuAnswer {
    Fingerprint(Result<HardwareFingerprint, String>),
    Measured(WorkerReply),
}

/// How the CUDA measurer runs candidates.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub timing: TimingOptions,
    /// Longest a worker may take for one candidate before it is killed.
    pub timeout: Duration,
    /// Operators up to this many multiply-accumulates are checked whole; larger ones at
    /// `sample_points` elements.
    pub full_check_max_macs: u64,
    pub sample_points: u32,
    pub seed: u64,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            timing: TimingOptions {
                warmup: 3,
                min_runs: 10,
                max_runs: 200,
                min_time_s: 0.05,
            },
            timeout: Duration::from_secs(60),
            full_check_max_macs: 1 << 24,
            sample_points: 512,
            seed: 1,
        }
    }
}

/// Turns CUDA C++ into PTX: NVRTC when its library loads, else nvcc.
#[derive(Clone, Debug)]
pub enum PtxCompiler {
    Nvrtc { include_paths: Vec<String> },
    Nvcc(Nvcc),
}

impl PtxCompiler {
    /// NVRTC if `libnvrtc` can be loaded (the CUDA headers it needs beyond its built-in ones
    /// are looked for next to nvcc, under `$CUDA_HOME` and in `$TESSEL_CUDA_INCLUDE`), else
    /// nvcc; an error that says where it looked when neither is there.
    pub fn find() -> Result<PtxCompiler, GpuError> {
        // SAFETY: only tries to dlopen the library.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Ok(PtxCompiler::Nvrtc {
                include_paths: cuda_include_dirs(),
            });
        }
        Nvcc::find().map(PtxCompiler::Nvcc).map_err(|e| {
            GpuError::Toolchain(format!(
                "no CUDA compiler: libnvrtc.so did not load (put it on LD_LIBRARY_PATH, e.g. from PyPI's nvidia-cuda-nvrtc-cu12) and {e}"
            ))
        })
    }

    pub fn name(&self) -> String {
        match self {
            PtxCompiler::Nvrtc { .. } => {
                let mut v = (0, 0);
                // SAFETY: the library is loaded (checked in `find`).
                let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut v.0, &mut v.1) };
                if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                    format!("nvrtc {}.{}", v.0, v.1)
                } else {
                    "nvrtc".into()
                }
            }
            PtxCompiler::Nvcc(n) => format!("nvcc ({})", n.path.display()),
        }
    }

    /// PTX for `arch` (`sm_80`, `sm_90`, ...).
    pub fn ptx(&self, source: &str, arch: &str) -> Result<String, GpuError> {
        match self {
            PtxCompiler::Nvrtc { include_paths } => {
                let opts = cudarc::nvrtc::CompileOptions {
                    include_paths: include_paths.clone(),
                    options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
                    ..Default::default()
                };
                if source.contains('\0') {
                    return Err(GpuError::Toolchain("source contains a NUL byte".into()));
                }
                let ptx =
                    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| match e {
                        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                            GpuError::Toolchain(format!(
                                "NVRTC rejected the kernel ({arch}):\n{}",
                                log.to_string_lossy()
                            ))
                        }
                        other => GpuError::Toolchain(format!("NVRTC failed: {other}")),
                    })?;
                Ok(ptx.to_src())
            }
            PtxCompiler::Nvcc(n) => n.ptx(source, arch),
        }
    }
}

/// Directories with the CUDA headers generated kernels include (`mma.h`, `cuda_fp16.h`).
fn cuda_include_dirs() -> Vec<String> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("TESSEL_CUDA_INCLUDE") {
        dirs.extend(std::env::split_paths(&d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = std::env::var_os(var) {
            dirs.push(PathBuf::from(h).join("include"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    if let Ok(n) = Nvcc::find()
        && let Some(bin) = n.path.parent()
        && let Some(root) = bin.parent()
    {
        dirs.push(root.join("include"));
    }
    dirs.into_iter()
        .filter(|d| d.join("mma.h").is_file() || d.join("cuda_fp16.h").is_file())
        .map(|d| d.display().to_string())
        .collect()
}

/// Measures candidates on the GPU of a worker process.
pub struct CudaMeasurer {
    worker: Worker,
    fingerprint: HardwareFingerprint,
    prep: Preparer,
}

/// What turns a candidate into a job (shared by the compiling threads).
struct Preparer {
    opts: CudaOptions,
    compiler: PtxCompiler,
    arch: String,
    cc: (u32, u32),
    catalog: tessel_intrin::Catalog,
}

impl CudaMeasurer {
    /// Starts the worker, opens the device and finds a compiler. Fails with a clear error
    /// where there is no driver, no GPU, or no compiler.
    pub fn new(worker: WorkerCommand, opts: CudaOptions) -> Result<Self, GpuError> {
        let compiler = PtxCompiler::find()?;
        let mut worker = Worker::new(worker);
        let answer: GpuAnswer = worker
            .call(&GpuRequest::Fingerprint, opts.timeout)
            .map_err(|e| GpuError::NoDevice(e.to_string()))?;
        let mut fingerprint = match answer {
            GpuAnswer::Fingerprint(Ok(f)) => f,
            GpuAnswer::Fingerprint(Err(e)) => return Err(GpuError::NoDevice(e)),
            GpuAnswer::Measured(r) => {
                return Err(GpuError::NoDevice(format!("unexpected answer {r:?}")));
            }
        };
        fingerprint.compiler = format!("{}; {}", fingerprint.compiler, compiler.name());
        let cc = parse_cc(&fingerprint.version).ok_or_else(|| {
            GpuError::NoDevice(format!("bad compute capability `{}`", fingerprint.version))
        })?;
        Ok(CudaMeasurer {
            worker,
            fingerprint,
            prep: Preparer {
                opts,
                compiler,
                arch: format!("sm_{}{}", cc.0, cc.1),
                cc,
                catalog: tessel_intrin::Catalog::default(),
            },
        })
    }

    /// The device's compute capability.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.prep.cc
    }

    /// Lowers, generates and compiles one candidate.
    pub fn prepare(&self, c: &Candidate, name: &str) -> Result<(GpuJob, f64), MeasureError> {
        self.prep.prepare(c, name)
    }

    /// How many times the worker had to be restarted (after faults and timeouts).
    pub fn worker_restarts(&self) -> u32 {
        self.worker.restarts()
    }

    /// Checks and times a prepared job in the worker.
    pub fn run(&mut self, job: &GpuJob, compile_s: f64) -> MeasureResult {
        let answer: GpuAnswer = self
            .worker
            .call(
                &GpuRequest::Measure(Box::new(job.clone())),
                self.prep.opts.timeout,
            )
            .map_err(|e| e.to_measure_error(&job.kernel))?;
        match answer {
            GpuAnswer::Measured(WorkerReply::Ok { samples, max_error }) => {
                let timing = Timing::from_samples(&samples).ok_or_else(|| {
                    MeasureError::new(MeasureErrorKind::Runtime, "the worker returned no timings")
                })?;
                Ok(Measurement {
                    timing,
                    compile_time_s: compile_s,
                    max_error,
                    emulated: false,
                    gflops: job.op.flops() as f64 / timing.median_s / 1e9,
                })
            }
            GpuAnswer::Measured(WorkerReply::Err { kind, mut message }) => {
                if message.contains("UNSUPPORTED_PTX_VERSION") {
                    message += &format!(
                        " (the PTX of {} is newer than this driver reads: use a compiler no newer than the driver)",
                        self.prep.compiler.name()
                    );
                }
                Err(MeasureError::new(kind, message))
            }
            GpuAnswer::Fingerprint(_) => Err(MeasureError::new(
                MeasureErrorKind::Runtime,
                "the worker answered a measurement with a fingerprint",
            )),
        }
    }
}

impl Preparer {
    fn prepare(&self, c: &Candidate, name: &str) -> Result<(GpuJob, f64), MeasureError> {
        let program = c
            .trace
            .lower(&c.op, &self.catalog)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Schedule, e.to_string()))?;
        let kernel = generate(&program, name)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Codegen, e.to_string()))?;
        if kernel.needs_sm80 && self.cc.0 < 8 {
            return Err(MeasureError::new(
                MeasureErrorKind::Unsupported,
                format!(
                    "kernel needs sm_80 (cp.async or bf16); this GPU is {}",
                    self.arch
                ),
            ));
        }
        let args = param_operands(&program, &kernel.params)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Codegen, e.to_string()))?;
        let start = Instant::now();
        let ptx = self
            .compiler
            .ptx(&kernel.source, &self.arch)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Compile, e.to_string()))?;
        let compile_s = start.elapsed().as_secs_f64();
        let check = if c.op.macs() <= self.opts.full_check_max_macs {
            Check::Full
        } else {
            Check::Sampled(self.opts.sample_points)
        };
        let job = GpuJob {
            ptx,
            kernel: kernel.name.clone(),
            grid: kernel.grid,
            block: kernel.block,
            shared_bytes: kernel.shared_bytes as u32,
            zero_output: kernel.zero_output,
            args,
            op: c.op.clone(),
            check,
            seed: self.opts.seed,
            tolerance: tolerance(&c.op),
            timing: self.opts.timing,
        };
        Ok((job, compile_s))
    }
}

fn parse_cc(version: &str) -> Option<(u32, u32)> {
    let (a, b) = version.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

impl Measurer for CudaMeasurer {
    fn fingerprint(&self) -> &HardwareFingerprint {
        &self.fingerprint
    }

    fn measure(&mut self, candidates: &[Candidate]) -> Vec<MeasureResult> {
        // Compiling (nvcc takes a second or two a kernel) runs on every core; measuring, one
        // kernel at a time.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_thread = candidates.len().div_ceil(threads).max(1);
        let this = &self.prep;
        let prepared: Vec<Result<(GpuJob, f64), MeasureError>> = std::thread::scope(|s| {
            let handles: Vec<_> = candidates
                .chunks(per_thread)
                .enumerate()
                .map(|(chunk, cs)| {
                    let h = s.spawn(move || {
                        cs.iter()
                            .enumerate()
                            .map(|(i, c)| {
                                this.prepare(c, &format!("tsl_k{}", chunk * per_thread + i))
                            })
                            .collect::<Vec<_>>()
                    });
                    (h, cs.len())
                })
                .collect();
            // One result per candidate, even if a compiling thread panicked.
            handles
                .into_iter()
                .flat_map(|(h, n)| {
                    h.join().unwrap_or_else(|_| {
                        let e = MeasureError::new(
                            MeasureErrorKind::Compile,
                            "the compiling thread panicked",
                        );
                        vec![Err(e); n]
                    })
                })
                .collect()
        });
        prepared
            .into_iter()
            .map(|p| {
                let (job, compile_s) = p?;
                self.run(&job, compile_s)
            })
            .collect()
    }
}

/// The worker's main loop (the `gpu-worker` of xtask and `tessel-gpu-worker` call only this);
/// returns the process exit code.
pub fn serve() -> i32 {
    let mut state = WorkerState::default();
    tessel_measure::worker::serve(|request: Result<GpuRequest, String>| match request {
        Err(e) => (GpuAnswer::Measured(WorkerReply::runtime(e)), true),
        Ok(GpuRequest::Fingerprint) => (GpuAnswer::Fingerprint(state.fingerprint()), true),
        Ok(GpuRequest::Measure(job)) => {
            let (reply, healthy) = state.measure(&job);
            (GpuAnswer::Measured(reply), healthy)
        }
    })
}

struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

/// Inputs of one operator, on the host and on the device, and what to compare against.
struct Prepared {
    inputs: Vec<CudaSlice<u8>>,
    /// Expected values: the whole output, or (flat index, value) samples.
    expected: Expected,
}

enum Expected {
    Whole(TensorData),
    Points(Vec<(usize, f64)>),
    Nothing,
}

#[derive(Default)]
struct WorkerState {
    device: Option<Device>,
    prepared: HashMap<String, Prepared>,
}

fn driver_error(what: &str, e: cudarc::driver::DriverError) -> String {
    format!("{what}: {e}")
}

impl WorkerState {
    fn device(&mut self) -> Result<&Device, String> {
        if self.device.is_none() {
            // SAFETY: only tries to dlopen the driver library.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err(
                    "no CUDA driver: libcuda.so did not load (this machine has no NVIDIA GPU or driver)"
                        .into(),
                );
            }
            let ctx = CudaContext::new(0).map_err(|e| driver_error("cannot open GPU 0", e))?;
            // One stream, synchronised by hand: no per-buffer events around each launch.
            // SAFETY: nothing else uses this context.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.default_stream();
            self.device = Some(Device { ctx, stream });
        }
        self.device.as_ref().ok_or_else(|| "no device".to_string())
    }

    fn fingerprint(&mut self) -> Result<HardwareFingerprint, String> {
        let d = self.device()?;
        let ctx = &d.ctx;
        let attr = |a: CUdevice_attribute| ctx.attribute(a).map(|v| v.max(0) as u64).unwrap_or(0);
        let name = ctx.name().map_err(|e| driver_error("device name", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error("compute capability", e))?;
        let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) as u32;
        let clock_ghz = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE) as f64 / 1e6;
        let mem_clock_khz = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) as f64;
        let bus_bits = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) as f64;
        // Double data rate: two transfers per memory clock.
        let dram_gbs = 2.0 * mem_clock_khz * 1e3 * bus_bits / 8.0 / 1e9;
        let mut driver = 0;
        // SAFETY: the driver library is loaded (checked when the device opened).
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
        let mut caches = std::collections::BTreeMap::new();
        caches.insert(
            "shared".into(),
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        );
        caches.insert(
            "l2".into(),
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        );
        let cc = (major as u32, minor as u32);
        Ok(HardwareFingerprint {
            kind: "gpu".into(),
            model: name.clone(),
            vendor: "NVIDIA".into(),
            version: format!("{major}.{minor}"),
            features: crate::device::gpu_features(
                cc,
                clock_ghz,
                dram_gbs,
                spec_for(&name, cc).as_ref(),
            ),
            cores_used: sms,
            cores_available: sms,
            caches,
            compiler: format!("CUDA driver {}.{}", driver / 1000, (driver % 1000) / 10),
        })
    }

    /// Checks and times `job`; false when the context is poisoned and the worker must go.
    fn measure(&mut self, job: &GpuJob) -> (WorkerReply, bool) {
        match self.try_measure(job) {
            Ok(reply) => (reply, true),
            Err(message) => {
                // A fault leaves the context unusable: every later call fails too.
                let poisoned = self.device.as_ref().is_some_and(|d| {
                    d.ctx.synchronize().is_err() || d.stream.synchronize().is_err()
                });
                if poisoned {
                    (
                        WorkerReply::Err {
                            kind: MeasureErrorKind::Crash,
                            message: format!("kernel `{}` faulted: {message}", job.kernel),
                        },
                        false,
                    )
                } else {
                    (WorkerReply::runtime(message), true)
                }
            }
        }
    }

    fn try_measure(&mut self, job: &GpuJob) -> Result<WorkerReply, String> {
        job.op
            .validate()
            .map_err(|e| format!("invalid operator: {e}"))?;
        let (ctx, stream) = {
            let d = self.device()?;
            (d.ctx.clone(), d.stream.clone())
        };
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(job.ptx.clone()))
            .map_err(|e| driver_error("cannot load the module", e))?;
        let f: CudaFunction = module
            .load_function(&job.kernel)
            .map_err(|e| driver_error(&format!("no kernel `{}`", job.kernel), e))?;
        if job.shared_bytes > 48 * 1024 {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                job.shared_bytes as i32,
            )
            .map_err(|e| driver_error("cannot allow the shared memory", e))?;
        }
        let key = format!(
            "{}|{}|{:?}",
            serde_json::to_string(&job.op).unwrap_or_default(),
            job.seed,
            job.check
        );
        if !self.prepared.contains_key(&key) {
            // Operators come task by task: keep the inputs of the last few only.
            if self.prepared.len() >= 4 {
                self.prepared.clear();
            }
            let p = prepare(&stream, job)?;
            self.prepared.insert(key.clone(), p);
        }
        let p = &self.prepared[&key];
        let out = &job.op.output.tensor;
        // 0xff bytes: NaN in every float type, so unwritten elements show.
        // 0xff bytes: NaN in every float type, so unwritten elements show. Split-K kernels
        // add into the output, so it starts as zeros before every run (timed with the run).
        let fill = if job.zero_output { 0u8 } else { 0xff };
        let mut output = stream
            .clone_htod(&vec![fill; out.bytes() as usize])
            .map_err(|e| driver_error("cannot allocate the output", e))?;
        let cfg = LaunchConfig {
            grid_dim: (job.grid[0], job.grid[1], job.grid[2]),
            block_dim: (job.block[0], job.block[1], job.block[2]),
            shared_mem_bytes: job.shared_bytes,
        };
        let timing_event = || {
            stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| driver_error("event", e))
        };
        // One run: zero the output where needed, then the kernel. The output goes in as a
        // shared reference: with event tracking off, cudarc only passes the pointer, and the
        // kernel is its one writer.
        let run = |output: &mut CudaSlice<u8>, zero: bool| -> Result<(), String> {
            if zero {
                stream
                    .memset_zeros(output)
                    .map_err(|e| driver_error("cannot zero the output", e))?;
            }
            let mut b = stream.launch_builder(&f);
            for a in &job.args {
                match a {
                    Some(i) => b.arg(&p.inputs[*i]),
                    None => b.arg(&*output),
                };
            }
            // SAFETY: one device pointer per kernel parameter, each to a buffer of the size
            // its operand declares; the grid and shared memory are the generator's.
            unsafe { b.launch(cfg) }
                .map(|_| ())
                .map_err(|e| driver_error("launch failed", e))
        };
        run(&mut output, false)?;
        stream
            .synchronize()
            .map_err(|e| driver_error("the kernel failed", e))?;
        let bytes = stream
            .clone_dtoh(&output)
            .map_err(|e| driver_error("cannot read the output", e))?;
        let got = TensorData::from_le_bytes(&bytes, out.shape.clone(), out.dtype)
            .ok_or("the output has the wrong size")?;
        let max_error = match check(&got, &p.expected, job.tolerance) {
            Ok(e) => e,
            Err(message) => {
                return Ok(WorkerReply::Err {
                    kind: MeasureErrorKind::WrongResult,
                    message,
                });
            }
        };
        for _ in 0..job.timing.warmup {
            run(&mut output, job.zero_output)?;
        }
        let mut samples = Vec::new();
        let mut total = 0.0;
        loop {
            let start = timing_event()?;
            run(&mut output, job.zero_output)?;
            let end = timing_event()?;
            end.synchronize()
                .map_err(|e| driver_error("the kernel failed", e))?;
            let s = start
                .elapsed_ms(&end)
                .map_err(|e| driver_error("event timing", e))? as f64
                / 1e3;
            samples.push(s);
            total += s;
            if job.timing.done(samples.len() as u32, total) {
                break;
            }
        }
        Ok(WorkerReply::Ok { samples, max_error })
    }
}

/// Uploads the inputs and computes what the output should be.
fn prepare(stream: &Arc<CudaStream>, job: &GpuJob) -> Result<Prepared, String> {
    let data = job.op.random_inputs(job.seed);
    let inputs = data
        .iter()
        .map(|t| stream.clone_htod(&t.to_le_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| driver_error("cannot upload the inputs", e))?;
    let out_shape = &job.op.output.tensor.shape;
    let expected = match job.check {
        Check::None => Expected::Nothing,
        Check::Full => Expected::Whole(
            job.op
                .reference(&data)
                .map_err(|e| format!("reference interpreter failed: {e}"))?,
        ),
        Check::Sampled(n) => {
            let points = sample_points(out_shape, n);
            let mut v = Vec::with_capacity(points.len());
            for at in points {
                let want = job
                    .op
                    .reference_at(&data, &unravel(at, out_shape))
                    .map_err(|e| format!("reference interpreter failed: {e}"))?;
                v.push((at, want));
            }
            Expected::Points(v)
        }
    };
    Ok(Prepared { inputs, expected })
}

/// `n` flat indices of an output of `shape`: its first and last elements, then a fixed
/// pseudo-random sample (the same on every run).
pub fn sample_points(shape: &[u64], n: u32) -> Vec<usize> {
    let len = shape.iter().product::<u64>() as usize;
    if len == 0 {
        return Vec::new();
    }
    let n = n as usize;
    if n >= len {
        return (0..len).collect();
    }
    let mut v = std::collections::BTreeSet::from([0, len - 1]);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while v.len() < n {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.insert((x.wrapping_mul(0x2545_f491_4f6c_dd1d) % len as u64) as usize);
    }
    v.into_iter().collect()
}

/// The largest relative error, or why the output is wrong.
fn check(got: &TensorData, expected: &Expected, tolerance: f64) -> Result<f64, String> {
    let shape = &got.shape;
    let fail = |err: f64, at: usize, want: f64| {
        format!(
            "output differs from the reference: relative error {err:.3e} > {tolerance:.1e} at {:?} (got {}, want {want})",
            unravel(at, shape),
            got.data[at]
        )
    };
    match expected {
        Expected::Nothing => Ok(0.0),
        Expected::Whole(want) => {
            let (err, at) = max_relative_error(got, want);
            if err.is_nan() || err > tolerance {
                return Err(fail(err, at, want.data[at]));
            }
            Ok(err)
        }
        Expected::Points(points) => {
            if matches!(got.dtype, DType::F32 | DType::F16 | DType::BF16)
                && let Some(at) = got.data.iter().position(|v| v.is_nan())
            {
                return Err(format!(
                    "output element {:?} is NaN: never written, or computed from NaN",
                    unravel(at, shape)
                ));
            }
            let mut worst = 0.0f64;
            for &(at, want) in points {
                let err = relative_error(got.data[at], want);
                if err.is_nan() || err > tolerance {
                    return Err(fail(err, at, want));
                }
                worst = worst.max(err);
            }
            Ok(worst)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_cover_both_ends_and_stay_in_range() {
        let p = sample_points(&[64, 48], 100);
        assert_eq!(p[0], 0);
        assert_eq!(*p.last().unwrap(), 64 * 48 - 1);
        assert_eq!(p.len(), 100);
        assert_eq!(p, sample_points(&[64, 48], 100));
        assert_eq!(sample_points(&[3], 100), vec![0, 1, 2]);
    }

    #[test]
    fn a_sampled_check_catches_a_wrong_element_and_an_unwritten_one() {
        let want = TensorData::random(vec![8, 8], DType::F32, 3);
        let points: Vec<(usize, f64)> = (0..64).map(|i| (i, want.data[i])).collect();
        let mut got = want.clone();
        assert_eq!(
            check(&got, &Expected::Points(points.clone()), 1e-3),
            Ok(0.0)
        );
        got.data[9] += 1.0;
        let e = check(&got, &Expected::Points(points.clone()), 1e-3).unwrap_err();
        assert!(e.contains("[1, 1]"), "{e}");
        got.data[9] = f64::NAN;
        let e = check(&got, &Expected::Points(points[..5].to_vec()), 1e-3).unwrap_err();
        assert!(e.contains("NaN"), "{e}");
    }
}
