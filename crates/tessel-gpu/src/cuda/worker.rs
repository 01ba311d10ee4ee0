//! The worker process ([`serve`]): opens GPU 0 through the driver, loads each module, checks
//! the output against the CPU reference and times the kernel with CUDA events.

use super::*;

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
        Ok(WorkerReply::Ok {
            samples,
            max_error,
            cut_short: false,
            allocation_medians: Vec::new(),
        })
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
