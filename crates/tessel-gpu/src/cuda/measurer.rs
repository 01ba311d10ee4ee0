//! The parent side: [`CudaMeasurer`] lowers and generates each candidate, compiles a batch to
//! PTX on every core and sends one job per candidate to the worker process.

use super::*;

/// Measures candidates on the GPU of a worker process.
pub struct CudaMeasurer {
    worker: Worker,
    fingerprint: HardwareFingerprint,
    prep: Preparer,
}

/// What turns a candidate into a job (shared by the compiling threads).
pub(super) struct Preparer {
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
            GpuAnswer::Measured(WorkerReply::Ok {
                samples, max_error, ..
            }) => Measurement::from_samples(&samples, job.op.flops(), compile_s, max_error, false),
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

pub(super) fn parse_cc(version: &str) -> Option<(u32, u32)> {
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
